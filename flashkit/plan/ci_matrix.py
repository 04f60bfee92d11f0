"""`flashkit ci-matrix`: a GitHub Actions matrix (JSON) with one job per env, for CI fan-out.

Pure planner: specs, input hashes and host support in, ``{"include": [...]}``
out, deterministic. Each row carries what a job needs to run
``nox -s test-<env>`` (or ``flashkit test <env>``) and to skip work already
done: the env id, its input hash and image tag, the tiers a runner of that kind
can run, and the runner label. Rows for the GPU tier get the GPU runner label
(``--gpu-runner``, e.g. a self-hosted label); without it, no GPU rows are
emitted and the matrix says so in ``gpu_tier`` = ``not-run``, never ``passed``.

Use in a workflow::

    - id: plan
      run: echo "matrix=$(flashkit ci-matrix --compact)" >> "$GITHUB_OUTPUT"
    ...
    strategy:
      matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}
    runs-on: ${{ matrix.runner }}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flashkit.core.atomic import write_text_atomic

CPU_TIERS = "build,abi,cpu"
GPU_TIERS = "gpu"
DEFAULT_RUNNER = "ubuntu-latest"


def row(spec, input_hash: str, tag: str, runner: str, tiers: str, kind: str) -> dict[str, str]:
    return {
        "env": str(spec.id),
        "input_hash": input_hash,
        "image_tag": f"flashkit/{spec.id}:{tag}",
        "python": spec.python,
        "torch": spec.torch,
        "accelerator": f"{spec.accelerator.kind}{spec.accelerator.version}",
        "kind": kind,
        "tiers": tiers,
        "runner": runner,
        "name": f"{spec.id} ({kind})",
    }


def matrix(envs: list[tuple[object, str, str]], *, runner: str, gpu_runner: str | None) -> dict:
    """``envs``: (spec, input hash, tag) of accepted envs. One build job each, plus a GPU job when a runner is given."""
    include = []
    for spec, h, tag in sorted(envs, key=lambda e: str(e[0].id)):
        include.append(row(spec, h, tag, runner, CPU_TIERS, "build"))
        if gpu_runner and spec.accelerator.kind == "cuda":
            include.append(row(spec, h, tag, gpu_runner, GPU_TIERS, "gpu"))
    return {"include": include}


def plan(root: Path, env_ids: list[str], *, runner: str, gpu_runner: str | None) -> tuple[dict, list[str]]:
    from flashkit.plan import inputhash
    from flashkit.plan import rules
    from flashkit.plan.spec import load_all, load_env

    specs = [load_env(root, e) for e in env_ids] if env_ids else load_all(root)
    rows, skipped = [], []
    for spec in specs:
        if env_ids:
            rules.require_accepted(spec)
        elif rules.rejections(spec):
            skipped.extend(rules.format_rejection(spec, v) for v in rules.rejections(spec))
            continue
        h = inputhash.input_hash(root, spec)
        rows.append((spec, h, inputhash.tag_suffix(h)))
    return matrix(rows, runner=runner, gpu_runner=gpu_runner), skipped


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("ci-matrix", help="write a GitHub Actions matrix (JSON) with one job per env")
    p.add_argument("envs", nargs="*", help="env ids (default: every env the rules accept)")
    p.add_argument("--runner", default=DEFAULT_RUNNER, help=f"runs-on label of build jobs (default {DEFAULT_RUNNER})")
    p.add_argument("--gpu-runner", help="runs-on label of a GPU runner; adds a gpu-tier job per CUDA env")
    p.add_argument("--compact", action="store_true", help="one line, for $GITHUB_OUTPUT")
    p.add_argument("-o", "--output", metavar="PATH", help="write here (atomically) instead of stdout")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    from flashkit.core import paths

    root = paths.root_of(args)
    doc, skipped = plan(root, list(args.envs), runner=args.runner, gpu_runner=args.gpu_runner)
    for line in skipped:
        print(f"left out: {line}", file=sys.stderr)
    if not args.gpu_runner:
        print("no --gpu-runner: GPU tiers are not in this matrix (they stay not-run)", file=sys.stderr)
    text = (
        json.dumps(doc, sort_keys=True, separators=(",", ":"))
        if args.compact
        else json.dumps(doc, indent=2, sort_keys=True)
    ) + "\n"
    if args.output:
        write_text_atomic(Path(args.output), text)
    else:
        sys.stdout.write(text)
    return 0
