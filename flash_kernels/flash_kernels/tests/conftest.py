"""Fixtures of the shipped kernel suite: the device of the tier, the backend, poisoned outputs.

Tiers: under TRITON_INTERPRET=1 the tests run on the CPU through Triton's interpreter, and
tests marked ``gpu`` (large shapes, bf16) are left to the GPU tier (`-m "not gpu"`, which
``python -m flash_kernels.selftest --tier cpu`` passes). Otherwise they run on the GPU.
Backends come from FLASH_KERNELS_TEST_BACKENDS (comma list of triton, cuda, auto).
The summary line lives in report.py, a plugin the selftest loads with ``-p`` (under xdist the
controller process never imports this conftest).
"""

from __future__ import annotations

import fcntl
import os
import tempfile

import pytest
import torch

from flash_kernels import dispatch, triton_attention

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a GPU (large shapes or bf16); not in the CPU tier")
    config.addinivalue_line("markers", "exclusive_gpu: runs alone on the GPU (it fills the GPU's memory)")


def backends_under_test():
    default = "triton" if INTERPRETING else "triton,cuda"
    names = [b.strip() for b in os.environ.get("FLASH_KERNELS_TEST_BACKENDS", default).split(",")]
    bad = [b for b in names if b not in dispatch.BACKENDS]
    if bad:
        raise pytest.UsageError(f"FLASH_KERNELS_TEST_BACKENDS: unknown backend(s) {bad}; "
                                f"allowed: {', '.join(dispatch.BACKENDS)}")
    return names


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", backends_under_test(), indirect=True)


@pytest.fixture
def backend(request, monkeypatch):
    name = request.param
    if name == "cuda":
        if INTERPRETING or not torch.cuda.is_available():
            pytest.skip("CUDA backend needs a CUDA GPU (this run has none or uses the interpreter)")
        if dispatch.cuda_backend() is None:
            pytest.skip("CUDA backend not built in this install (flash_kernels._cuda missing or "
                        "is_built() is False)")
    monkeypatch.setenv(dispatch.BACKEND_ENV, name)
    return name


@pytest.fixture
def device():
    if INTERPRETING:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA/ROCm GPU visible and TRITON_INTERPRET is not 1")
    return torch.device("cuda")


# One lock file per GPU host user, which every pytest process of this suite (xdist workers, concurrent runs)
# opens: tests hold it shared, an exclusive_gpu test (one that fills the GPU) holds it exclusively, so no
# other test runs out of memory because of it.
GPU_LOCK = os.path.join(tempfile.gettempdir(), f"flash_kernels_gpu_tests.{os.getuid()}.lock")


@pytest.fixture(autouse=True)
def gpu_share(request):
    if INTERPRETING or not torch.cuda.is_available():
        yield
        return
    exclusive = request.node.get_closest_marker("exclusive_gpu") is not None
    with open(GPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every kernel output buffer starts as NaN, so an element left unwritten fails the test."""
    monkeypatch.setattr(triton_attention, "POISON_OUTPUTS", True)
