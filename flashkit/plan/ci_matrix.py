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

import re

from flashkit.core.errors import UsageError
from flashkit.plan.plan import Plan, keep_accepted

# A runner label as GitHub accepts it, and nothing that could end a line of $GITHUB_OUTPUT or a YAML value early.
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_label(flag: str, value: str) -> str:
    if not LABEL.fullmatch(value):
        raise UsageError(f"{flag} {value[:200]!r}: a runner label: letters, digits, '.', '_' and '-' (at most 100)")
    return value


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


def matrix(
    envs: list[tuple[object, str, str]], *, runner: str, gpu_runner: str | None, kind: str | None = None
) -> dict:
    """``envs``: (spec, input hash, tag) of accepted envs. One build job each, plus a GPU job when a runner is
    given; ``kind`` ("build" or "gpu"): only those rows (a workflow runs them as two jobs)."""
    include = []
    for spec, h, tag in sorted(envs, key=lambda e: str(e[0].id)):
        if kind in (None, "build"):
            include.append(row(spec, h, tag, runner, CPU_TIERS, "build"))
        if gpu_runner and spec.accelerator.kind == "cuda" and kind in (None, "gpu"):
            include.append(row(spec, h, tag, gpu_runner, GPU_TIERS, "gpu"))
    return {"include": include}


def select(
    plans: list[Plan], named: bool, *, runner: str, gpu_runner: str | None, kind: str | None = None
) -> tuple[dict, list[str]]:
    """The matrix of the accepted ``plans`` and why the others were left out."""
    check_label("--runner", runner)
    if gpu_runner is not None:
        check_label("--gpu-runner", gpu_runner)
    kept, skipped = keep_accepted(plans, named)
    rows = [(plan.spec, plan.input_hash, plan.tag) for plan in kept]
    return matrix(rows, runner=runner, gpu_runner=gpu_runner, kind=kind), skipped
