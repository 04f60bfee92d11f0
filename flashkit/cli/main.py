"""The `flashkit` command: the parser, and the one place errors become exit codes.

Subcommands live in the modules imported below, one command family each; each module's ``register(sub)``
adds its subcommands and sets ``run`` to a callable that takes the parsed arguments and returns an
exit code. Only this package parses arguments and prints.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import threading
import traceback

from flashkit.cli import (
    aot_cmd,
    docs_cmd,
    doctor_cmd,
    image_cmd,
    ledger_cmd,
    matrix_cmd,
    plan_cmd,
    publish_cmd,
    resolve_cmd,
    results_cmd,
    site_cmd,
    trust_cmd,
    verify_cmd,
    wheelhouse_cmd,
    wheels_cmd,
)
from flashkit.core import errors
from flashkit.core.errors import FlashkitError, Terminated

EPILOG = "exit codes:\n" + "".join(f"  {code:<6} {text}\n" for code, text in errors.EXIT_CODES)
GROUPS = (
    plan_cmd, matrix_cmd, image_cmd, verify_cmd, publish_cmd, wheelhouse_cmd, ledger_cmd, wheels_cmd, aot_cmd,
    trust_cmd, doctor_cmd, resolve_cmd, site_cmd, results_cmd, docs_cmd,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashkit",
        description="Locked torch x CUDA/ROCm x Python x ABI environments, rendered into images for flash_kernels.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.add_argument(
        "--repo", metavar="DIR", help="repository root (default: found from the working directory, or $FLASHKIT_ROOT)"
    )
    p.add_argument(
        "--host-mem-gib",
        type=int,
        metavar="N",
        help="build host memory used to size MAX_JOBS/NVCC_THREADS (default: probed)",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit code; SIGTERM unwinds the command as Ctrl-C does."""
    previous = _raise_on_sigterm()
    try:
        return _main(argv)
    except Terminated:
        print("flashkit: terminated (SIGTERM); cleaned up", file=sys.stderr)
        return errors.EXIT_TERMINATED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_on_sigterm():
    """Make SIGTERM raise Terminated in the main thread; the handler it replaced, or None if it left it.

    Left to the default, SIGTERM (kill, timeout, docker stop, a CI cancel) ends the process at once: no
    ``finally`` runs, temporary folders stay, and the aot tool's compile workers run on, orphaned. A
    handler set by whoever called main, or an ignored SIGTERM, is theirs: kept, as Python keeps SIGINT's."""
    if threading.current_thread() is not threading.main_thread():
        return None  # signal handlers can only be set from the main thread
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return None
    raised = False

    def handler(signum, frame):
        nonlocal raised
        # Supervisors repeat SIGTERM; a second exception would cut the clean-up of the first short. SIGKILL
        # remains for a clean-up that hangs.
        if not raised:
            raised = True
            raise Terminated

    signal.signal(signal.SIGTERM, handler)
    return previous


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("FLASHKIT_DEBUG") == "1"
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, or a usage error argparse already reported
            return int(exc.code or 0) if not isinstance(exc.code, str) else errors.EXIT_USAGE
        if args.host_mem_gib is not None and not 1 <= args.host_mem_gib <= 65536:
            raise errors.UsageError(
                f"--host-mem-gib {args.host_mem_gib}: give the build host's memory in GiB (1-65536)"
            )
        handler = getattr(args, "run", None)
        if handler is None:
            parser.print_help(sys.stderr)
            return errors.EXIT_USAGE
        return int(handler(args) or 0)
    except FlashkitError as exc:
        if debug:
            traceback.print_exc()
        print(f"flashkit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("flashkit: interrupted", file=sys.stderr)
        return errors.EXIT_INTERRUPTED
    except BrokenPipeError as exc:
        if not _stdout_closed():  # another pipe (a daemon's socket, a child's stdin): a bug to report
            return _internal_error(exc, debug)
        # `flashkit matrix | head`: the reader left, as it may. Point stdout at /dev/null so that the
        # interpreter's last flush at exit does not fail a second time, and end as SIGPIPE would have.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return errors.EXIT_BROKEN_PIPE
    except Exception as exc:
        return _internal_error(exc, debug)


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (the kernel flags its write end with an error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or stdout has no descriptor
        return False


def _internal_error(exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc)
    else:
        print(
            f"flashkit: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
    return errors.EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
