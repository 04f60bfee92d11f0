"""Time render + input hash for every env (warm), as the CLI does them: load the spec, check the
lockfiles, hash spec + locks + template + kernel sources, render the Dockerfile.

    python benchmarks/bench_render.py [--repeat N] [--out benchmarks/results/render_<YYYYMMDD>/render.md]

Prints the table; --out also writes it (a result folder needs a README beside it: benchmarks/results/README.md).

Target: under 2 s for all envs together. One warm-up pass is not timed (imports, Jinja compile).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from flashkit.core.atomic import write_text_atomic
from flashkit.plan import render
from flashkit.plan.plan import load_plan
from flashkit.plan.specfile import env_ids

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 2.0


def one(env: str) -> tuple[str, str]:
    plan = load_plan(ROOT, env)  # spec, both lockfiles, template and kernel sources, read once, and the hash
    plan.require_consistent_locks()
    return plan.input_hash, render.render_dockerfile(plan, host_mem_gib=24)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", help="also write the table here, relative to the repository root")
    args = ap.parse_args()

    envs = env_ids(ROOT)
    for env in envs:  # warm-up
        one(env)
    per_env: dict[str, list[float]] = {e: [] for e in envs}
    totals: list[float] = []
    for _ in range(args.repeat):
        t_all = time.perf_counter()
        for env in envs:
            t = time.perf_counter()
            one(env)
            per_env[env].append(time.perf_counter() - t)
        totals.append(time.perf_counter() - t_all)

    cmd = "python benchmarks/bench_render.py" + (f" --repeat {args.repeat}" if args.repeat != 20 else "")
    lines = [
        "# render + input hash, all envs (warm)",
        "",
        f"Command: `{cmd}` (from the repository root)",
        f"Host: {platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.repeat} timed passes after one warm-up. Each pass per env: load the plan (spec, lockfiles, template, "
        "kernel sources read once; input hash), check the lockfiles, render.",
        "",
        "| env | median ms | min ms | max ms |",
        "|---|---|---|---|",
    ]
    for env, ts in per_env.items():
        lines.append(f"| {env} | {statistics.median(ts) * 1e3:.1f} | {min(ts) * 1e3:.1f} | {max(ts) * 1e3:.1f} |")
    med_total = statistics.median(totals)
    verdict = "meets" if med_total < TARGET_S else "MISSES"
    lines += [
        f"| **all {len(envs)} envs** | **{med_total * 1e3:.1f}** | {min(totals) * 1e3:.1f} | {max(totals) * 1e3:.1f} |",
        "",
        f"Median total {med_total:.3f} s {verdict} the {TARGET_S:.0f} s target.",
        "",
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        out = ROOT / args.out
        write_text_atomic(out, report)
        print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0 if med_total < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
