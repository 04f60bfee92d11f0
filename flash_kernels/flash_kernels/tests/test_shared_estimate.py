"""triton_tiles.shared_estimate against the shared memory (LDS) the compiler really allocated.

flash_kernels.aot records, for every specialisation it compiles, both the estimate and Triton's
own figure. The estimate prunes tile configs before launch, so it must never be below what a
config really needs, and it must not prune configs that were seen to fit. Pure Python: no GPU,
no compile.

The recorded reports are read from the folder FLASH_KERNELS_AOT_EVIDENCE names (the kit keeps
them in its verified/evidence/, and its `nox -s kernels-cpu` passes that folder); without it the
two tests that read them skip.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flash_kernels import targets, triton_tiles
from flash_kernels.triton_tiles import TileConfig

KERNELS = {"_attn_fwd": ("fwd",), "_bwd_dkdv": ("dkdv",), "_bwd_dq": ("dq",)}
# What the launchers check a config against: the backward's two kernels share one config.
PRUNED_TOGETHER = {"_attn_fwd": ("fwd",), "_bwd_dkdv": ("dkdv", "dq"), "_bwd_dq": ("dkdv", "dq")}


EVIDENCE_ENV = "FLASH_KERNELS_AOT_EVIDENCE"


def _evidence_dir() -> Path:
    # Named by the caller: the kernels do not know where the kit that verifies them keeps its files.
    named = os.environ.get(EVIDENCE_ENV)
    if not named:
        pytest.skip(
            f"{EVIDENCE_ENV} is not set: name the folder of recorded flash_kernels.aot reports to check against"
        )
    folder = Path(named)
    if not folder.is_dir():
        pytest.fail(f"{EVIDENCE_ENV}={named}: not a folder")
    return folder


def _recorded_specs() -> list[dict]:
    """Every compiled _attn_fwd, _bwd_dkdv and _bwd_dq entry of the recorded AOT reports."""
    folder = _evidence_dir()
    specs = []
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        if not isinstance(report, dict) or not isinstance(report.get("specialisations"), list):
            continue  # evidence of another kind
        for spec in report["specialisations"]:
            if spec.get("kernel") in KERNELS and spec.get("status") == "compiled":
                specs.append(dict(spec, triton=report.get("triton")))
    if not specs:
        pytest.skip(f"no AOT report with compiled attention kernels under {folder}")
    return specs


def _config(spec: dict) -> tuple[TileConfig, int]:
    cx = spec["constexprs"]
    return TileConfig(cx["BLOCK_M"], cx["BLOCK_N"], spec["num_warps"], spec["num_stages"]), cx["HEAD_DIM_PAD"]


def _describe(spec: dict) -> str:
    return f"{spec['target']} (triton {spec['triton']}) {spec['id']}"


def test_estimate_is_never_below_a_recorded_compile():
    specs = _recorded_specs()
    below = []
    for spec in specs:
        cfg, hdp = _config(spec)
        (kernel,) = KERNELS[spec["kernel"]]
        estimate = triton_tiles.shared_estimate(kernel, cfg, hdp, spec["dtype"], targets.parse(spec["target"]))
        actual = spec["resources"]["shared_bytes"]
        if estimate < actual:
            below.append(f"{_describe(spec)}: estimate {estimate} B < {actual} B")
    assert not below, f"{len(below)} of {len(specs)} below the compiler's figure:\n" + "\n".join(below[:20])
    # Both backends are covered, or the check proves less than it claims.
    assert {targets.parse(s["target"]).backend for s in specs} == {"cuda", "hip"}


def test_estimate_keeps_every_recorded_config_that_fit():
    """A config that compiled within the target's shared memory is not pruned for lack of it."""
    pruned = []
    for spec in _recorded_specs():
        cfg, hdp = _config(spec)
        target = targets.parse(spec["target"])
        if spec["resources"]["shared_bytes"] > target.shared_bytes:
            continue
        why = triton_tiles._shared_reason(PRUNED_TOGETHER[spec["kernel"]], cfg, hdp, spec["dtype"], target)
        if why is not None:
            pruned.append(f"{_describe(spec)}: {why}")
    assert not pruned, "\n".join(pruned[:20])


# (target, kernel, dtype, head_dim_pad, config, bytes the compiler allocated in the recorded run)
RECORDED = [
    # One stage on AMD: the only LDS is the fp32 S/P tile's layout conversion (the estimate was 8192).
    ("hip:gfx942", "fwd", "float32", 16, (128, 64, 4, 1), 32768),
    # sm_80: q + two copies of K/V + the S/P conversion + row vectors (the estimate was 49152).
    ("cuda:80", "fwd", "float32", 32, (128, 64, 4, 3), 82432),
    # Head dim 72 (strides unhinted, q and dO not pipelined): dK/dV's transposed q / dO copy
    # through shared memory beside k, v, q, dO and the rows (the estimate was 99328).
    ("cuda:80", "dkdv", "bfloat16", 128, (128, 64, 8, 2), 132096),
    # 16-bit with all warps along the rows: no conversion, and the config still fits sm_80.
    ("cuda:80", "fwd", "bfloat16", 128, (128, 128, 8, 3), 163840),
]


@pytest.mark.parametrize("name,kernel,dtype,hdp,cfg,actual", RECORDED)
def test_pinned_recorded_cases(name, kernel, dtype, hdp, cfg, actual):
    target = targets.parse(name)
    estimate = triton_tiles.shared_estimate(kernel, TileConfig(*cfg), hdp, dtype, target)
    assert actual <= estimate <= actual + 2048
    assert estimate <= target.shared_bytes
