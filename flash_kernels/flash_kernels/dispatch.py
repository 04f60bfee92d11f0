"""Per-call backend choice and the host-side checks that run before any launch.

``FLASH_KERNELS_BACKEND`` = ``auto`` (default) | ``cuda`` | ``triton``:
- auto: the CUDA extension when it is built and says it supports the call; otherwise Triton.
  ROCm always goes to Triton (the CUDA kernels are NVIDIA-only).
- cuda: the CUDA extension or a BackendUnavailableError saying why not.
- triton: the Triton kernels.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Optional

import torch

from .errors import BackendUnavailableError, UnsupportedDeviceError, UnsupportedInputError

BACKEND_ENV = "FLASH_KERNELS_BACKEND"
BACKENDS = ("auto", "cuda", "triton")
MAX_HEAD_DIM = 256
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.lru_cache(maxsize=1)
def cuda_backend():
    """The CUDA extension's Python module, or None when it is absent or not built."""
    if importlib.util.find_spec("flash_kernels._cuda") is None:
        return None
    try:
        module = importlib.import_module("flash_kernels._cuda")
    except ImportError:
        return None
    return module if module.is_built() else None


def _cuda_import_detail() -> Optional[str]:
    """Why flash_kernels._cuda has no working extension, when it says so."""
    try:
        module = importlib.import_module("flash_kernels._cuda")
    except ImportError as e:
        return str(e)
    reason = getattr(module, "import_error", None)
    return reason() if callable(reason) else None


def requested_backend() -> str:
    value = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise UnsupportedInputError(
            f"{BACKEND_ENV}={value!r} is not a backend; allowed: {', '.join(BACKENDS)}")
    return value


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class Features:
    """What a call asks of the kernels, for the backends' support checks."""
    causal: bool
    window_size: tuple
    softcap: float
    alibi_slopes: Optional[torch.Tensor]
    dropout_p: float
    is_varlen: bool
    is_kvcache: bool = False


def choose_backend(q, k, v, features: Features) -> str:
    """Return "cuda" or "triton" for this call; raise if a forced backend cannot take it."""
    wanted = requested_backend()
    if wanted == "triton":
        return "triton"
    reason = cuda_unsupported_reason(q, k, v, features)
    if reason is None:
        return "cuda"
    if wanted == "cuda":
        raise BackendUnavailableError(
            f"{BACKEND_ENV}=cuda but the CUDA backend cannot run this call: {reason}. "
            f"Unset {BACKEND_ENV} (or set it to auto/triton) to use the Triton kernels.")
    return "triton"


def cuda_unsupported_reason(q, k, v, features: Features) -> Optional[str]:
    if torch.version.hip is not None:
        return f"torch {torch.__version__} is a ROCm build and the CUDA kernels are NVIDIA-only"
    if q.device.type != "cuda":
        return f"tensors are on {q.device.type}, not a CUDA GPU"
    module = cuda_backend()
    if module is None:
        detail = _cuda_import_detail()
        return ("the CUDA extension is not built in this install (a Triton-only wheel, or the "
                "build skipped it)" + (f": {detail}" if detail else ""))
    if features.is_kvcache:
        return "the CUDA extension has no KV-cache decode path"
    if features.is_varlen and not hasattr(module, "varlen_fwd"):
        return "the CUDA extension has no varlen path"
    return module.unsupported_reason(
        q, k, v, causal=features.causal, window_size=features.window_size,
        softcap=features.softcap, alibi_slopes=features.alibi_slopes,
        dropout_p=features.dropout_p, is_varlen=features.is_varlen)


def check_device(t: torch.Tensor, dtype: torch.dtype) -> None:
    """Raise UnsupportedDeviceError unless Triton can run on ``t``'s device in ``dtype``."""
    if t.device.type == "cpu":
        if not triton_interpreting():
            raise UnsupportedDeviceError(
                "flash_kernels runs on CUDA or ROCm GPUs; these tensors are on the CPU. "
                "(TRITON_INTERPRET=1, set before triton is imported, runs the Triton kernels on "
                "the CPU interpreter, slowly, for testing.)")
        if dtype == torch.bfloat16:
            raise UnsupportedDeviceError(
                "bfloat16 is not supported under TRITON_INTERPRET=1: the interpreter's tl.dot on "
                "bf16 operands returns wrong results; use float16 or float32 on the CPU")
        return
    if t.device.type != "cuda":
        raise UnsupportedDeviceError(
            f"flash_kernels needs CUDA or ROCm GPU tensors; got device {t.device}")
    if torch.version.hip is not None:
        return
    major, minor = torch.cuda.get_device_capability(t.device)
    if major < 8:
        name = torch.cuda.get_device_name(t.device)
        raise UnsupportedDeviceError(
            f"flash_kernels needs an NVIDIA GPU of compute capability 8.0 (Ampere) or newer; "
            f"{t.device} is '{name}', sm_{major}{minor}. The Triton kernels use bf16/fp16 tensor-core "
            f"dot products and software pipelining that older architectures lack.")


def check_qkv(q, k, v, *, varlen: bool, same_batch: bool = True) -> None:
    """Shape, dtype and layout checks shared by every entry point (dense and varlen)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise UnsupportedInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    want_dim = 3 if varlen else 4
    layout = "(total_tokens, nheads, headdim)" if varlen else "(batch, seqlen, nheads, headdim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != want_dim:
            raise UnsupportedInputError(
                f"{name} must have {want_dim} dimensions {layout}; got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise UnsupportedInputError(
            f"q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in TRITON_DTYPES:
        raise UnsupportedInputError(
            f"dtype {q.dtype} is not supported; use torch.float16 or torch.bfloat16 "
            f"(torch.float32 runs on the Triton backend only)")
    if not (q.device == k.device == v.device):
        raise UnsupportedInputError(
            f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        raise UnsupportedInputError(
            f"q, k and v must have the same head dim; got {head_dim}, {k.shape[-1]}, {v.shape[-1]}")
    if head_dim > MAX_HEAD_DIM or head_dim < 1:
        raise UnsupportedInputError(
            f"head dim must be between 1 and {MAX_HEAD_DIM}; got {head_dim}")
    if k.shape != v.shape:
        raise UnsupportedInputError(
            f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    nheads_q, nheads_k = q.shape[-2], k.shape[-2]
    if nheads_k == 0 or nheads_q % nheads_k != 0:
        raise UnsupportedInputError(
            f"the number of query heads ({nheads_q}) must be a multiple of the number of "
            f"key/value heads ({nheads_k}) (MQA/GQA)")
    if not varlen and same_batch and q.shape[0] != k.shape[0]:
        raise UnsupportedInputError(
            f"q and k must have the same batch size; got {q.shape[0]} and {k.shape[0]}")
    check_device(q, q.dtype)


def check_options(*, dropout_p: float, window_size, softcap: float, alibi_slopes,
                  batch: int, nheads_q: int, device) -> tuple[int, int]:
    """Validate the scalar options; return the window as two ints (-1 = unlimited)."""
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: attention dropout is not implemented in flash_kernels; "
            "pass dropout_p=0.0 (apply dropout outside attention if the model needs it)")
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise UnsupportedInputError(
            f"window_size must be a pair of ints (left, right), -1 for unlimited; got {window_size!r}"
        ) from None
    if softcap < 0:
        raise UnsupportedInputError(f"softcap must be >= 0 (0 disables it); got {softcap}")
    if alibi_slopes is not None:
        if alibi_slopes.dtype != torch.float32:
            raise UnsupportedInputError(
                f"alibi_slopes must be float32; got {alibi_slopes.dtype}")
        if tuple(alibi_slopes.shape) not in ((nheads_q,), (batch, nheads_q)):
            raise UnsupportedInputError(
                f"alibi_slopes must have shape ({nheads_q},) or ({batch}, {nheads_q}); "
                f"got {tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != device:
            raise UnsupportedInputError(
                f"alibi_slopes must be on {device}; got {alibi_slopes.device}")
    return left, right


def check_cu_seqlens(name: str, cu: torch.Tensor, device) -> None:
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
        raise UnsupportedInputError(
            f"{name} must be a 1-D torch.int32 tensor of batch+1 cumulative lengths starting at 0")
    if cu.device != device:
        raise UnsupportedInputError(f"{name} must be on {device}; got {cu.device}")
