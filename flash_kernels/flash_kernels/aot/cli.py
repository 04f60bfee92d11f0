"""The command line: ``python -m flash_kernels.aot``; its options, the run over the targets, the exit status."""

from __future__ import annotations

import argparse
import json
import sys
import time

from .. import targets
from . import __doc__ as OVERVIEW
from .enumeration import coverage, enumerate_specs
from .report import REPORT_VERSION, summarize, write_report
from .toolchain import UsageError, check_backends, check_triton, triton_version
from .worker import cache_dir, compile_all


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m flash_kernels.aot", description=OVERVIEW.split("\n\n")[0])
    parser.add_argument(
        "--target", action="append", required=True, help=f"repeatable; one of {', '.join(targets.known_names())}"
    )
    parser.add_argument("--out", help="JSON report path (required unless --list)")
    parser.add_argument("--jobs", type=int, default=1, help="compile processes (default 1)")
    parser.add_argument("--only", help="only specialisations whose id contains this substring")
    parser.add_argument("--list", action="store_true", help="print the specialisations and exit; compile nothing")
    parser.add_argument(
        "--timings",
        action="store_true",
        help="record seconds per specialisation and target (the report is then not reproducible)",
    )
    parser.add_argument("--cache-dir", help="Triton cache to use and keep (default: a fresh one, removed after)")
    args = parser.parse_args(argv)
    if not args.list and not args.out:
        parser.error("--out is required unless --list is given")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def run(args) -> int:
    if targets.interpreting():
        raise UsageError(
            "TRITON_INTERPRET=1 makes @triton.jit build interpreter functions, which cannot be "
            "compiled; unset it for flash_kernels.aot"
        )
    try:
        chosen = [targets.parse(t) for t in args.target]
    except ValueError as e:
        raise UsageError(str(e)) from None
    chosen = list(dict.fromkeys(chosen))
    version = triton_version()
    check_triton(version)
    plan = {t: [s for s in enumerate_specs(t) if not args.only or args.only in s.key] for t in chosen}
    if args.list:
        for t, specs in plan.items():
            for s in specs:
                print(f"{t.name} {s.key}" + (f"  [pruned: {s.pruned}]" if s.pruned else ""))
        return 0
    toolchain = check_backends(chosen)
    report = {
        "report_version": REPORT_VERSION,
        "triton": version,
        "toolchain": toolchain,
        "coverage": dict(coverage(), only=args.only),
        "targets": {},
        "specialisations": [],
    }
    with cache_dir(args.cache_dir):
        for t, specs in plan.items():
            start = time.monotonic()
            entries = compile_all(t, specs, args.jobs, args.timings)
            summary = summarize(t, entries)
            if args.timings:
                summary.update(seconds=round(time.monotonic() - start, 1), jobs=args.jobs)
            print(f"AOT {t.name}: {json.dumps(summary, sort_keys=True)}", file=sys.stderr, flush=True)
            report["targets"][t.name] = summary
            report["specialisations"] += entries
    write_report(args.out, report)
    failed = sum(s["failed"] for s in report["targets"].values())
    print(
        f"FLASH_KERNELS_AOT triton={version} targets={','.join(t.name for t in chosen)} "
        + " ".join(f"{k}={sum(s[k] for s in report['targets'].values())}" for k in ("compiled", "failed", "pruned")),
        flush=True,
    )
    return 1 if failed else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except UsageError as e:
        print(f"flash_kernels.aot: {e}", file=sys.stderr)
        return 2
