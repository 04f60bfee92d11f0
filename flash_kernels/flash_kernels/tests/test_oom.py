"""Out of GPU memory, every entry point raises torch.OutOfMemoryError (never crashes, never another
type), and the same call succeeds once memory is freed.

The GPU tests run flash_kernels/tests/oom_probe.py in a subprocess per case (a crash is a failed
test, not a dead worker): inputs made, GPU filled to a few MB, every entry point called, the filler
freed, every entry point called again and compared bitwise. The CPU-tier tests check the
translation itself: which exceptions count as out of memory, and that each entry point turns one
raised by a kernel launcher into torch.OutOfMemoryError.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import flash_kernels as fk
from flash_kernels import dispatch, triton_attention
from flash_kernels.out_of_memory import OUT_OF_MEMORY_MARKER, is_out_of_memory, raise_if_out_of_memory

from .params import GPU

PROBE_TIMEOUT_S = 600


class _AcceleratorLike(RuntimeError):
    """torch.AcceleratorError as torch 2.9+ raises it: a RuntimeError with the CUDA error code."""

    def __init__(self, message: str, error_code: int):
        super().__init__(message)
        self.error_code = error_code


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"),
        RuntimeError(OUT_OF_MEMORY_MARKER + "cudaErrorMemoryAllocation (out of memory) in cudaLaunchKernel"),
        _AcceleratorLike("CUDA error: out of memory", 2),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
        RuntimeError("Triton Error [CUDA]: out of memory"),
    ],
    ids=["torch", "extension", "accelerator-code", "accelerator-text", "triton"],
)
def test_out_of_memory_is_recognised(exc):
    assert is_out_of_memory(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("flash_kernels CUDA error: cudaErrorInvalidValue (invalid argument) in cudaLaunchKernel"),
        _AcceleratorLike("CUDA error: an illegal memory access was encountered", 700),
        ValueError("out of memory"),
    ],
    ids=["extension-other", "illegal-address", "not-runtime"],
)
def test_other_errors_are_left_alone(exc):
    assert not is_out_of_memory(exc)
    raise_if_out_of_memory(exc, "flash_attn_func")  # returns: the caller re-raises exc as it is


def test_translation_keeps_the_cause():
    cause = RuntimeError("Triton Error [CUDA]: out of memory")
    with pytest.raises(torch.OutOfMemoryError, match="flash_attn_func: the GPU ran out of memory") as info:
        raise_if_out_of_memory(cause, "flash_attn_func")
    assert info.value.__cause__ is cause


def _raise_launch_oom(*args, **kwargs):
    raise RuntimeError("Triton Error [CUDA]: out of memory")


def test_entry_points_raise_torch_oom(device, monkeypatch):
    """A kernel launcher failing for lack of memory reaches the caller as torch.OutOfMemoryError, from
    the forward, the backward (autograd) and the KV-cache entry point alike."""
    monkeypatch.setenv("FLASH_KERNELS_BACKEND", "triton")
    q, k, v = (torch.randn(1, 16, 2, 32, device=device, dtype=torch.float16) for _ in range(3))
    real_forward = triton_attention.attention_forward
    monkeypatch.setattr(triton_attention, "attention_forward", _raise_launch_oom)
    with pytest.raises(torch.OutOfMemoryError, match="attention forward: the GPU ran out of memory"):
        fk.flash_attn_func(q, k, v)
    with pytest.raises(torch.OutOfMemoryError, match="KV-cache attention"):
        fk.flash_attn_with_kvcache(q, k, v, cache_seqlens=8)
    cu = torch.tensor([0, 16], device=device, dtype=torch.int32)
    with pytest.raises(torch.OutOfMemoryError, match="varlen attention forward"):
        fk.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 16, 16)
    monkeypatch.setattr(triton_attention, "attention_forward", real_forward)
    monkeypatch.setattr(triton_attention, "attention_backward", _raise_launch_oom)
    q.requires_grad_(True)
    out = fk.flash_attn_func(q, k, v, causal=True)
    with pytest.raises(torch.OutOfMemoryError, match="attention backward"):
        out.sum().backward()


def test_prepare_kernels(device):
    """Loads the CUDA path's kernels (every launcher walked, the same count again); nothing to load without it."""
    if dispatch.cuda_backend() is None or device.type != "cuda":
        assert fk.prepare_kernels() == 0
        if dispatch.cuda_backend() is not None and torch.version.hip is None:
            with pytest.raises(ValueError, match="must be a CUDA device, got cpu"):
                fk.prepare_kernels("cpu")
        return
    walked = fk.prepare_kernels()
    assert walked > 0 and fk.prepare_kernels(device) == walked
    q = torch.randn(1, 64, 2, 64, device=device, dtype=torch.bfloat16)
    assert torch.isfinite(fk.flash_attn_func(q, q, q, causal=True)).all()  # a call after it runs as before


def _probe(backend: str, tmp_path, *args: str) -> dict:
    report, progress = tmp_path / "report.json", tmp_path / "progress.txt"
    cmd = [
        sys.executable,
        "-m",
        "flash_kernels.tests.oom_probe",
        "--backend",
        backend,
        "--json",
        str(report),
        "--progress",
        str(progress),
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if k != "FLASH_KERNELS_BACKEND"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    steps = progress.read_text().splitlines() if progress.exists() else []
    assert proc.returncode >= 0, (
        f"the probe died of signal {-proc.returncode} during '{steps[-1] if steps else 'start-up'}'\n"
        f"{proc.stderr[-4000:]}"
    )
    assert report.exists(), f"the probe wrote no report (exit {proc.returncode})\n{proc.stderr[-4000:]}"
    return json.loads(report.read_text())


@GPU
@pytest.mark.exclusive_gpu
@pytest.mark.parametrize("free_mb, warm", [(4, False), (0, True)], ids=["4MB-cold", "0MB-warm"])
def test_every_entry_point_out_of_memory(backend, device, tmp_path, free_mb, warm):
    """Cold: the GPU is filled before any kernel ran (kernels load under pressure). Warm: every entry point
    ran once before the GPU was filled to the last 2 MB."""
    report = _probe(backend, tmp_path, "--free-mb", str(free_mb), *(["--warm"] if warm else []))
    broken = {name: entry for name, entry in report["entries"].items() if not entry["meets_rules"]}
    assert not broken, f"free after fill {report['free_mb_after_fill']} MB: {json.dumps(broken, indent=1)}"
