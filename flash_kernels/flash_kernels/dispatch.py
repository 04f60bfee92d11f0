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
    # KV-cache and paged calls: the cache's layout, for the CUDA path's support check.
    block_table: Optional[torch.Tensor] = None
    cache_batch_idx: Optional[torch.Tensor] = None
    cache_leftpad: Optional[torch.Tensor] = None

    @property
    def is_paged(self) -> bool:
        return self.block_table is not None


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
    if features.is_kvcache or features.is_paged:
        return _cuda_cache_reason(module, q, k, v, features)
    if features.is_varlen and not hasattr(module, "varlen_fwd"):
        return "the CUDA extension has no varlen path"
    return module.unsupported_reason(
        q, k, v, causal=features.causal, window_size=features.window_size,
        softcap=features.softcap, alibi_slopes=features.alibi_slopes,
        dropout_p=features.dropout_p, is_varlen=features.is_varlen)


def _cuda_cache_reason(module, q, k_cache, v_cache, features: Features) -> Optional[str]:
    """The CUDA path's answer for a KV-cache call or a paged varlen call (k/v are caches)."""
    if features.dropout_p:
        return f"dropout (p={features.dropout_p}) is not implemented in the CUDA path"
    left, right = features.window_size
    if features.is_varlen:
        # Paged varlen runs the general varlen forward with page addressing: the extension's own
        # varlen check, told about the block table, says whether it takes the call.
        return module.unsupported_reason(
            q, k_cache, v_cache, causal=features.causal, window_size=features.window_size,
            softcap=features.softcap, alibi_slopes=features.alibi_slopes, dropout_p=0.0,
            is_varlen=True, block_table=features.block_table)
    if getattr(module, "kvcache_fwd", None) is None:
        return "the CUDA extension has no KV-cache path (flash_kernels._cuda.kvcache_fwd is missing)"
    return module.kvcache_unsupported_reason(
        q, k_cache, v_cache, block_table=features.block_table,
        cache_batch_idx=features.cache_batch_idx, cache_leftpad=features.cache_leftpad,
        softcap=features.softcap, alibi_slopes=features.alibi_slopes, window_left=left,
        window_right=right)


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
    if not 0.0 <= dropout_p < 1.0:
        raise UnsupportedInputError(f"dropout_p must be in [0, 1); got {dropout_p}")
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


def check_cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k, device) -> None:
    check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, device)
    check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise UnsupportedInputError(
            f"cu_seqlens_q and cu_seqlens_k must both have batch+1 entries; got "
            f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")


def check_batch_vector(name: str, t, batch: int, device, dtypes=(torch.int32,)) -> None:
    """A per-sequence int tensor such as cache_leftpad or cache_batch_idx: (batch,) on device."""
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes or tuple(t.shape) != (batch,):
        allowed = " or ".join(str(d) for d in dtypes)
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise UnsupportedInputError(f"{name} must be a {allowed} tensor of shape ({batch},); got {got}")
    if t.device != device:
        raise UnsupportedInputError(f"{name} must be on {device}; got {t.device}")


PAGE_MULTIPLE = 16  # rows of a key block fit a page boundary; vLLM's smallest page is 16


def check_paged_cache(k_cache, v_cache, block_table, batch: int, device) -> int:
    """Validate a paged KV cache (num_pages, page_size, nheads_k, headdim) and its block table
    (batch, max_pages) int32; return the page size.

    Page ids themselves live on the device and are not checked here (that would cost a host sync
    per call): a kernel reads an out-of-range id as page 0 and returns NaN for that sequence,
    and the cache append skips such a page (see flash_kernels/README.md).
    """
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 \
            or block_table.dim() != 2 or block_table.shape[0] != batch:
        got = (f"{block_table.dtype} {tuple(block_table.shape)}"
               if isinstance(block_table, torch.Tensor) else type(block_table).__name__)
        raise UnsupportedInputError(
            f"block_table must be a torch.int32 tensor of shape (batch={batch}, max_pages); got {got}")
    if block_table.device != device:
        raise UnsupportedInputError(f"block_table must be on {device}; got {block_table.device}")
    if block_table.stride(-1) != 1:
        raise UnsupportedInputError("block_table must have a contiguous last dimension")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise UnsupportedInputError(
                f"with block_table, {name} must be a page pool (num_pages, page_size, nheads_k, "
                f"headdim); got shape {tuple(t.shape)}")
    page_size = k_cache.shape[1]
    if page_size == 0 or page_size % PAGE_MULTIPLE:
        raise UnsupportedInputError(
            f"page size (k_cache.shape[1]) must be a positive multiple of {PAGE_MULTIPLE}; got {page_size}")
    if k_cache.shape[0] == 0:
        raise UnsupportedInputError("the page pool (k_cache) has no pages")
    return page_size


def check_rotary(rotary_cos, rotary_sin, *, head_dim: int, capacity: int, dtype, device,
                 appending: bool) -> None:
    """flash_attn's rules for rotary_cos/rotary_sin (seqlen_ro, rotary_dim / 2)."""
    if (rotary_cos is None) != (rotary_sin is None):
        raise UnsupportedInputError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is None:
        return
    if not appending:
        raise UnsupportedInputError(
            "rotary_cos/rotary_sin need the new k and v to append (as in flash_attn): the rotary "
            "positions are those of the appended keys")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise UnsupportedInputError(f"{name} must be a 2-D tensor (seqlen_ro, rotary_dim / 2)")
        if t.dtype not in (dtype, torch.float32):
            raise UnsupportedInputError(f"{name} must have q's dtype ({dtype}) or float32; got {t.dtype}")
        if t.device != device:
            raise UnsupportedInputError(f"{name} must be on {device}; got {t.device}")
        if t.stride(-1) != 1:
            raise UnsupportedInputError(f"{name} must have a contiguous last dimension")
    if rotary_cos.shape != rotary_sin.shape:
        raise UnsupportedInputError(
            f"rotary_cos and rotary_sin must have one shape; got {tuple(rotary_cos.shape)} and "
            f"{tuple(rotary_sin.shape)}")
    seqlen_ro, half = rotary_cos.shape
    if half == 0 or 2 * half > head_dim:
        raise UnsupportedInputError(
            f"rotary_dim (2 * rotary_cos.shape[1] = {2 * half}) must be in [2, head dim {head_dim}]")
    if seqlen_ro < capacity:
        raise UnsupportedInputError(
            f"rotary_cos/rotary_sin have {seqlen_ro} positions; they must cover the cache "
            f"({capacity} positions), as in flash_attn")
