"""`flashkit doctor` and `python -m flashkit.doctor`: probe, diagnose, print."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from flashkit.binary import elf
from flashkit.doctor import probe
from flashkit.doctor import repo as repo_facts
from flashkit.doctor.diagnose import diagnose, to_json
from flashkit.doctor.model import EXIT_UNINSPECTED, SCHEMA_VERSION, Diagnosis, Recommendation, RepoProblem

EXIT_USAGE = 2

# ---------------------------------------------------------------------------
# Command line


_DESCRIPTION = """\
Inspect a Python environment (this interpreter, or --python PATH) without importing torch in
this process: Python tag, torch and its CUDA/HIP and C++ ABI, nvcc, GPUs, installed flash_kernels /
flash_attn and their compiled modules (undefined symbols, GPU code, glibc, abi3). Each finding says
what, the likely cause and the fix; the closest env in envs/ is recommended with its status.

exit codes:
  0   healthy: no problem found
  20  problems found (a finding of severity "error")
  21  could not inspect (the interpreter did not answer, a module could not be read, pyelftools
      missing while there are modules to check, or doctor itself failed)
  2   usage error
"""


_FIX_SPECS = "fix the env spec(s) named above; `flashkit validate` lists every problem"


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor",
        help="diagnose this Python environment for flash-attention and recommend the env that fits",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help=f"print one JSON object (schema_version {SCHEMA_VERSION})")
    p.add_argument(
        "--repo",
        type=Path,
        # SUPPRESS: an unset --repo here must not hide `flashkit --repo DIR doctor`
        default=argparse.SUPPRESS,
        help="flashkit checkout with envs/ (default: found from cwd)",
    )
    p.add_argument(
        "--site",
        metavar="URL",
        help="recommend from a flashkit publication (the base URL of its index.json) instead of a checkout",
    )
    p.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="inspect the environment of this interpreter (default: the one running flashkit)",
    )
    p.add_argument(
        "--arch",
        action="append",
        default=[],
        metavar="CC",
        help="also check compiled modules against this GPU compute capability, e.g. 9.0 (repeatable)",
    )
    p.add_argument(
        "--manylinux",
        default=None,
        metavar="POLICY",
        help="hold modules to this glibc policy, e.g. manylinux_2_28",
    )
    p.add_argument(
        "--facts",
        type=Path,
        metavar="FILE",
        help="diagnose facts probed elsewhere (`python -m flashkit.doctor.probe -o FILE`, or a doctor --json) "
        "instead of probing here",
    )
    p.add_argument(
        "--root",
        metavar="DIR",
        help="with --facts: read the compiled modules from the filesystem mounted at DIR "
        "(an image's root; paths in the facts are inside it)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=probe.TORCH_TIMEOUT_S,
        metavar="S",
        help=f"limit for the child that imports torch (default {probe.TORCH_TIMEOUT_S} s)",
    )
    p.add_argument(
        "--no-import",
        action="store_true",
        help="do not import torch or the modules in the target interpreter",
    )
    p.set_defaults(run=run)
    return p


def _bad_usage(args: argparse.Namespace) -> str | None:
    if not probe.MIN_TIMEOUT_S <= args.timeout <= probe.MAX_TIMEOUT_S:  # NaN fails this too
        return f"--timeout {args.timeout}: give the limit in seconds ({probe.MIN_TIMEOUT_S:g}-{probe.MAX_TIMEOUT_S})"
    for cap in args.arch:
        if not re.fullmatch(r"\d{1,2}\.\d", cap):
            return f"--arch {cap!r} is not a compute capability like 8.0 or 9.0"
    if args.root and not args.facts:
        return "--root applies to --facts (facts probed inside that filesystem with `python -m flashkit.doctor.probe`)"
    if args.root and not os.path.isdir(args.root):
        return f"--root {args.root} is not a directory"
    if args.facts and (args.python or args.no_import):
        return "--facts reads facts probed elsewhere; --python and --no-import apply to probing here"
    if args.manylinux:
        try:
            elf.glibc_of_policy(args.manylinux)
        except ValueError as exc:
            return f"--manylinux: {exc}"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _bad_usage(args)
    if problem:
        print(f"flashkit doctor: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run(args)
    except Exception as exc:
        # a failure of doctor itself must not read as a verdict ("problems found")
        if os.environ.get("FLASHKIT_DEBUG") == "1" or getattr(args, "debug", False):
            import traceback

            traceback.print_exc()
        print(f"flashkit doctor: could not inspect: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNINSPECTED


def load_facts(path: Path) -> probe.Facts:
    """Facts from a ``python -m flashkit.doctor.probe`` file or a ``flashkit doctor --json`` output."""
    from flashkit.core import safeio
    from flashkit.core.errors import FlashkitError

    try:
        data = safeio.read_json(Path(path), what="facts file", error=FlashkitError, max_bytes=64 * safeio.MIB)
    except FlashkitError as exc:
        raise ValueError(f"--facts {exc}") from None
    if not isinstance(data, dict) or "facts" not in data:
        raise ValueError(f"--facts {path}: no 'facts' object; write one with `python -m flashkit.doctor.probe -o FILE`")
    try:
        return probe.Facts.from_json(data["facts"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"--facts {path}: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    if args.facts:
        try:
            facts = load_facts(args.facts)
        except ValueError as exc:
            print(f"flashkit doctor: {exc}", file=sys.stderr)
            return EXIT_UNINSPECTED
        if args.root:
            facts = probe.reinspect(facts, args.root)
    else:
        facts = probe.probe(args.python, import_torch=not args.no_import, torch_timeout=args.timeout)
    repo = getattr(args, "repo", None)
    if args.site:
        from flashkit.doctor import published

        found = published.fetch(args.site)
    else:
        found = repo_facts.load(Path(repo) if repo else None)
    if found.broken and found.problem is None:  # a recommendation among the others could miss the one that fits
        found = repo_facts.RepoFacts(None, {}, {}, {}, RepoProblem("\n".join(found.broken.values()), _FIX_SPECS))
    diagnosis = diagnose(
        facts,
        specs=found.specs,
        verification=found.verification,
        lockfiles=found.lockfiles,
        capabilities=args.arch,
        glibc_policy=args.manylinux,
        repo_problem=found.problem,
        lock_cuda=found.lock_cuda,
        requirements=found.requirements,
    )
    if args.json:
        sys.stdout.write(json.dumps(to_json(diagnosis, facts), indent=2, sort_keys=True) + "\n")
    else:
        render(diagnosis, facts)
    return diagnosis.exit_code


# ---------------------------------------------------------------------------
# Human output

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", "uninspected": "magenta"}


def _fact_rows(facts: probe.Facts) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    i = facts.interpreter
    rows.append(("python", f"{i.version} ({i.tag}) {i.executable}, glibc {i.glibc or '?'}" if i else "not inspected"))
    t = facts.torch
    if t is None:
        rows.append(("torch", "not installed"))
    elif t.imported:
        accel = f"CUDA {t.cuda}" if t.cuda else f"HIP {t.hip}" if t.hip else "CPU only"
        rows.append(("torch", f"{t.version}, {accel}, cxx11_abi={t.cxx11_abi}, {t.location}"))
    elif t.imported is None:
        rows.append(("torch", f"installed at {t.location} (import not tried)"))
    else:
        rows.append(("torch", "installed, import FAILS"))
    rows.append(("nvcc", f"{facts.nvcc.version} ({facts.nvcc.path})" if facts.nvcc else "not found"))
    if facts.gpus:
        for g in facts.gpus:
            rows.append(("gpu", f"{g.name}, sm {g.capability or '?'}, driver {g.driver or '?'}"))
    elif t is not None and t.devices:
        for d in t.devices:
            rows.append(("gpu", f"{d.name}, sm {d.capability}"))
    else:
        rows.append(("gpu", "none visible"))
    for d in facts.distributions:
        if d.name.lower() in ("torch",):
            continue
        tags = f" [{', '.join(d.wheel_tags)}]" if d.wheel_tags else ""
        rows.append(("package", f"{d.name} {d.version}{tags}"))
    for m in facts.modules:
        rows.append(("module", f"{m.path} ({m.tag.label})"))
    return rows


def render(diagnosis: Diagnosis, facts: probe.Facts, file=None) -> None:
    """Print the diagnosis for a person: with rich when it is installed, plain text otherwise."""
    out = file or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        _render_plain(diagnosis, facts, out)
        return
    console = Console(file=out, highlight=False, soft_wrap=True, width=None if out.isatty() else 160)
    table = Table(title="flashkit doctor", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in _fact_rows(facts):
        table.add_row(Text(k), Text(v))  # Text: "[...]" in values is not rich markup
    console.print(table)
    console.print()
    if not diagnosis.findings:
        console.print(Text("No problems found.", style="green"))
    for f in diagnosis.findings:
        head = Text()
        head.append(f"{f.severity.upper():<11}", style=_STYLE[f.severity])
        head.append(f" [{f.code}] ", style="dim")
        head.append(f.what)
        console.print(head)
        if f.subject and f.subject not in f.what:
            console.print(Text(f"            in: {f.subject}", style="dim"))
        if f.cause:
            console.print(Text(f"            cause: {f.cause}"))
        if f.fix:
            console.print(Text(f"            fix: {f.fix}", style="green"))
    console.print()
    _render_recommendation(diagnosis.recommendation, lambda s, style=None: console.print(Text(s, style=style or "")))
    style = {"healthy": "bold green", "problems": "bold red", "uninspected": "bold magenta"}[diagnosis.status]
    console.print(Text(f"status: {diagnosis.status} (exit {diagnosis.exit_code})", style=style))


def _render_recommendation(rec: Recommendation | None, say) -> None:
    if rec is None:
        return
    if rec.env is None:
        say(f"recommendation: none ({rec.reason})", "bold")
        return
    say(f"recommended env: {rec.env}" + (" (fits)" if rec.exact else " (closest)"), "bold")
    say(f"  {rec.reason}")
    say(f"  status: {rec.verification}")
    say(f"  lockfile: {rec.lockfile or 'none yet (run flashkit lock ' + rec.env + ')'}")
    for i, command in enumerate(rec.install):
        say(f"  {'install: ' if i == 0 else '     or: '}{command}")
    if rec.python_note:
        say(f"  requirements: {rec.python_note}")
    if rec.publication_note:
        say(f"  install: {rec.publication_note}")
    if rec.publish_tags:
        say(f"  image tags: {', '.join(rec.publish_tags)}")
    if rec.add_spec:
        say(f"  to fit exactly: {rec.add_spec}")


def _render_plain(diagnosis: Diagnosis, facts: probe.Facts, out) -> None:
    def say(text: str, _style: str | None = None) -> None:
        out.write(text + "\n")

    say("flashkit doctor")
    for k, v in _fact_rows(facts):
        say(f"  {k:<8} {v}")
    say("")
    if not diagnosis.findings:
        say("No problems found.")
    for f in diagnosis.findings:
        say(f"{f.severity.upper():<11} [{f.code}] {f.what}")
        if f.subject and f.subject not in f.what:
            say(f"            in: {f.subject}")
        if f.cause:
            say(f"            cause: {f.cause}")
        if f.fix:
            say(f"            fix: {f.fix}")
    say("")
    _render_recommendation(diagnosis.recommendation, say)
    say(f"status: {diagnosis.status} (exit {diagnosis.exit_code})")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flashkit.doctor``: the doctor alone, for hosts without the CLI's other dependencies."""
    parser = argparse.ArgumentParser(prog="flashkit")
    register(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    return args.run(args)
