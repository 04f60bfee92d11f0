"""Running the external tools flashkit needs, in one place: every call has a time limit, and a tool that is
missing, not executable, cannot start or does not finish in time becomes the caller's error with the
command named, never a traceback. Stopping a child process flashkit started: SIGTERM first, so it can
clean up, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import subprocess
from collections.abc import Callable, Sequence

from flashkit.core.errors import ToolError

log = logging.getLogger(__name__)


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    error: Callable[[str], BaseException] = ToolError,
    what: str | None = None,
    timeout_message: str | None = None,
    timeout_error: Callable[[str], BaseException] | None = None,
    **kwargs,
) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, timeout=timeout, **kwargs)``; a non-zero exit is the caller's to judge.

    ``timeout`` has no default: a call with none could hang a command on a tool that never answers. A
    failure to run at all raises ``error(message)``: the tool not installed, not executable, unable to
    start, or still running at ``timeout`` (killed by then; that one raises ``timeout_error`` where given,
    and ``timeout_message`` replaces the default "WHAT did not finish within N s"). ``what`` names the step
    in messages (default: the command line).
    """
    shown = what or f"`{shlex.join(list(argv)[:4])}{' ...' if len(argv) > 4 else ''}`"
    log.debug("run (limit %gs): %s", timeout, shlex.join(list(argv)))
    try:
        return subprocess.run(list(argv), timeout=timeout, **kwargs)
    except FileNotFoundError:
        raise error(f"{shown}: {argv[0]} is not installed (not found on PATH)") from None
    except PermissionError:
        raise error(f"{shown}: {argv[0]} is not executable") from None
    except subprocess.TimeoutExpired:
        raise (timeout_error or error)(timeout_message or f"{shown} did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise error(f"{shown}: {argv[0]} could not be started ({exc.strerror or exc})") from None


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM ``proc``, then SIGKILL if it is still there after ``grace_s``; reaps it either way."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
