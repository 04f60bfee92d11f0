"""Running out of GPU memory anywhere in a call raises ``torch.OutOfMemoryError``.

Callers (accelerate's ``find_executable_batch_size``, serving schedulers, test runners) catch that
type, free memory and retry; any other exception type for the same condition defeats them. Three
layers can run out, and only the first raises that type by itself:

- torch's caching allocator (``torch.empty`` in the Python launchers, ``at::empty`` in the
  version-bound C++ build): ``torch.OutOfMemoryError`` already.
- the CUDA extension: a CUDA call that failed with cudaErrorMemoryAllocation (the driver loading a
  kernel's code on first use under lazy module loading, a launch's resources) and, in the
  stable-ABI build, an allocation through torch's C shim (which reports only an error code): its
  C++ side throws a RuntimeError whose message starts with ``OUT_OF_MEMORY_MARKER``
  (csrc/launch_check.h).
- torch's own kernels (a ``.contiguous()`` copy, a fill) and Triton's launcher, when the driver
  needs memory to load their code: ``torch.AcceleratorError`` ("CUDA error: out of memory") and
  ``RuntimeError("Triton Error [CUDA]: out of memory")``.

``raise_if_out_of_memory(exc, call)`` turns the last two into ``torch.OutOfMemoryError`` (chained
to the original, whose message says which CUDA call failed); the entry points call it only in
their ``except`` clause, so a call that succeeds pays nothing.

``prepare_kernels()`` loads the CUDA path's kernels ahead of time: under lazy module loading (CUDA's
default) the driver loads a kernel's code at its first launch, which then needs device memory, on a
GPU that may be full by then. ``FLASH_KERNELS_PRELOAD=1`` runs it when torch initialises CUDA.
"""

from __future__ import annotations

import os

import torch

# csrc/launch_check.h: kOutOfMemoryMarker.
OUT_OF_MEMORY_MARKER = "flash_kernels: out of GPU memory: "
CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation (hipErrorOutOfMemory is 2 as well)
# How CUDA's and HIP's "out of memory" read in the messages of torch's C10_CUDA_CHECK and of
# Triton's launcher (cuGetErrorString / hipGetErrorString).
_MESSAGES = (
    "CUDA error: out of memory",
    "HIP error: out of memory",
    "Triton Error [CUDA]: out of memory",
    "Triton Error [HIP]: out of memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` reports that the GPU ran out of memory, whatever layer raised it."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    if getattr(exc, "error_code", None) == CUDA_ERROR_MEMORY_ALLOCATION:  # torch.AcceleratorError
        return True
    text = str(exc)
    return text.startswith(OUT_OF_MEMORY_MARKER) or any(m in text for m in _MESSAGES)


def raise_if_out_of_memory(exc: BaseException, call: str) -> None:
    """Raise ``torch.OutOfMemoryError`` for ``exc`` when it is an out-of-memory failure of another
    type; return otherwise (the caller re-raises ``exc`` unchanged). ``call`` names the entry point."""
    if isinstance(exc, torch.OutOfMemoryError) or not is_out_of_memory(exc):
        return
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    raise torch.OutOfMemoryError(
        f"{call}: the GPU ran out of memory ({type(exc).__name__}: {text}). Free memory (or lower the "
        "batch) and call again"
    ) from exc


def prepare_kernels(device=None) -> int:
    """Load every kernel of the CUDA extension on ``device`` (default: the current CUDA device) now, while
    there is memory for their code, so that no later call needs device memory to load one. Triton's kernels
    are compiled per call signature and load at their first call. Returns how many launchers were walked
    (0 where the extension is not built, on ROCm, or, with no ``device`` given, where no CUDA device is usable,
    so start-up code can call it unconditionally). Out of memory here raises torch.OutOfMemoryError."""
    from . import dispatch

    module = dispatch.cuda_backend()
    if module is None or torch.version.hip is not None:
        return 0
    if device is None and not torch.cuda.is_available():
        return 0
    if device is not None and torch.device(device).type != "cuda":
        raise ValueError(f"prepare_kernels: device must be a CUDA device, got {torch.device(device)}")
    index = torch.device(device).index if device is not None else None
    if index is None:
        index = torch.cuda.current_device()
    try:
        return module.prepare_kernels(index)
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "prepare_kernels")
        raise


def _prepare_at_cuda_init() -> None:
    prepare_kernels()


# torch.cuda._lazy_call runs it when torch initialises CUDA (at once if it already has): the kernels then
# load before the process fills the GPU. Opt-in: it costs every process that imports flash_kernels and uses
# CUDA the load of every kernel (time and device memory for their code) whether or not it calls attention.
if os.environ.get("FLASH_KERNELS_PRELOAD") == "1" and hasattr(torch.cuda, "_lazy_call"):
    torch.cuda._lazy_call(_prepare_at_cuda_init)
