"""The CUDA C++ backend: the compiled ops (flash_kernels._C) behind the interface dispatch.py calls.

``import flash_kernels._C`` loads the extension, whose TORCH_LIBRARY block registers
``torch.ops.flash_kernels_cuda.{fwd,bwd,varlen_fwd,varlen_bwd,compiled_head_dims}``. A Triton-only
wheel has no ``_C``; then ``is_built()`` is False and ``unsupported_reason`` says so, and dispatch uses
Triton.

What the CUDA path covers (everything else has a reason from ``unsupported_reason``):
fp16/bf16 on sm_80+, every head dim that is a multiple of 8 up to the largest of ``compiled_head_dims()``
(a head dim d runs on the kernel compiled for the smallest compiled head dim >= d, which zero-fills and
never stores the columns past d; head dims that are not multiples of 8 go to Triton because the kernels
copy rows in 16-byte chunks and need 16-byte aligned row strides), causal (bottom-right aligned),
sliding window, MQA/GQA, dense (b, s, h, d) tensors with a contiguous, 16-byte aligned last dim, and
varlen (packed (total, h, d) tensors with int32 cu_seqlens; lse (h, total_q)).
The backward is deterministic always (no atomics).
"""

from __future__ import annotations

import functools

import torch

try:
    from . import _C  # noqa: F401  (importing registers the ops)

    _IMPORT_ERROR: str | None = None
except ImportError as exc:  # Triton-only wheel, or an extension built for another torch
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

_DTYPES = (torch.float16, torch.bfloat16)


def is_built() -> bool:
    """True when the compiled extension loaded and registered its ops."""
    return _IMPORT_ERROR is None and hasattr(torch.ops.flash_kernels_cuda, "fwd")


def import_error() -> str | None:
    """Why the extension did not load (None when it did)."""
    return _IMPORT_ERROR


@functools.lru_cache(maxsize=1)
def compiled_head_dims() -> tuple[int, ...]:
    return tuple(torch.ops.flash_kernels_cuda.compiled_head_dims())


def kernel_head_dim(head_dim: int) -> int | None:
    """The compiled head dim a call with ``head_dim`` runs on (None when the CUDA path cannot take it)."""
    if head_dim <= 0 or head_dim % 8:
        return None
    return min((d for d in compiled_head_dims() if d >= head_dim), default=None)


@functools.cache
def kernel_sets(device_index: int = 0) -> tuple[str, ...]:
    """The kernel sets ``fwd`` / ``bwd`` can run on this GPU, as values of FLASH_KERNELS_CUDA_SM90 that
    select them: ("1", "0") where the Hopper kernels are compiled and the GPU is cc 9.0 (the first is the
    default), else ("0",). Checks that mean to cover every compiled kernel run each of them."""
    hopper = bool(torch.ops.flash_kernels_cuda.sm90_compiled()) and _capability(device_index) == (9, 0)
    return ("1", "0") if hopper else ("0",)


def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _layout_reason(name: str, t: torch.Tensor) -> str | None:
    if t.stride(-1) != 1:
        return f"{name} has a non-contiguous last dim (stride {t.stride(-1)})"
    if t.data_ptr() % 16:
        return f"{name} is not 16-byte aligned"
    for dim in range(t.dim() - 1):
        if t.size(dim) > 1 and t.stride(dim) % 8:
            return f"{name} stride({dim}) = {t.stride(dim)} is not a multiple of 8 elements"
    return None


def unsupported_reason(q, k, v, *, causal, window_size, softcap, alibi_slopes, dropout_p,
                       is_varlen) -> str | None:
    """None when the CUDA path supports this call, else a short reason a person can act on."""
    if not is_built():
        return f"the CUDA extension is not built or failed to load ({_IMPORT_ERROR or 'ops missing'})"
    if torch.version.hip is not None:
        return "ROCm build of torch: the CUDA kernels are NVIDIA-only"
    if dropout_p:
        return f"dropout (p={dropout_p}) is not implemented in the CUDA path"
    if alibi_slopes is not None:
        return "ALiBi is not implemented in the CUDA path"
    if softcap:
        return f"softcap ({softcap}) is not implemented in the CUDA path"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            return f"{name} is on {t.device}, not a CUDA GPU"
        want = 3 if is_varlen else 4
        if t.dim() != want:
            layout = "(total_tokens, heads, head_dim)" if is_varlen else "(batch, seqlen, heads, head_dim)"
            return f"{name} is {t.dim()}-D; the CUDA path takes {layout}"
    major, minor = _capability(q.device.index if q.device.index is not None else torch.cuda.current_device())
    if major < 8:
        return f"GPU is sm_{major}{minor}; the CUDA kernels need sm_80 or newer"
    if q.dtype not in _DTYPES:
        return f"dtype {q.dtype} is not supported by the CUDA path (float16, bfloat16)"
    if not (q.dtype == k.dtype == v.dtype):
        return "q, k and v dtypes differ"
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        return "q, k and v head dims differ"
    if head_dim % 8:
        return (f"head dim {head_dim} is not a multiple of 8; the CUDA kernels copy rows in 16-byte chunks "
                "(the Triton backend takes any head dim)")
    if kernel_head_dim(head_dim) is None:
        dims = compiled_head_dims()
        return (f"head dim {head_dim} is larger than every head dim compiled in the CUDA path "
                f"(compiled: {', '.join(map(str, dims))})")
    if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
        return f"q heads ({q.shape[-2]}) are not a multiple of k/v heads ({k.shape[-2]})"
    for name, t in (("q", q), ("k", k), ("v", v)):
        reason = _layout_reason(name, t)
        if reason:
            return reason
    return None


def _kernel_ready(t: torch.Tensor) -> torch.Tensor:
    # Gradients from autograd may arrive with broadcast (stride 0) or transposed layouts.
    return t if _layout_reason("", t) is None else t.contiguous()


def fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap):
    """(out, lse): out like q, lse (batch, heads_q, seqlen_q) float32 in natural log."""
    return torch.ops.flash_kernels_cuda.fwd(q, k, v, float(softmax_scale), bool(causal), int(window_left),
                                            int(window_right), float(softcap))


def bwd(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, deterministic):
    """(dq, dk, dv) like q, k, v. Always deterministic (no atomics), whatever ``deterministic`` says."""
    return torch.ops.flash_kernels_cuda.bwd(_kernel_ready(dout), q, k, v, _kernel_ready(out),
                                            lse.contiguous(), float(softmax_scale), bool(causal),
                                            int(window_left), int(window_right), float(softcap),
                                            bool(deterministic))


def varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
               window_left, window_right, softcap):
    """(out, lse) for packed sequences: out like q (total_q, h, d), lse (heads_q, total_q) float32."""
    return torch.ops.flash_kernels_cuda.varlen_fwd(
        q, k, v, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), int(max_seqlen_q), int(max_seqlen_k),
        float(softmax_scale), bool(causal), int(window_left), int(window_right), float(softcap))


def varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
               causal, window_left, window_right, softcap, deterministic):
    """(dq, dk, dv) like q, k, v for packed sequences. Always deterministic (no atomics)."""
    return torch.ops.flash_kernels_cuda.varlen_bwd(
        _kernel_ready(dout), q, k, v, _kernel_ready(out), lse.contiguous(), cu_seqlens_q.contiguous(),
        cu_seqlens_k.contiguous(), int(max_seqlen_q), int(max_seqlen_k), float(softmax_scale), bool(causal),
        int(window_left), int(window_right), float(softcap), bool(deterministic))


if is_built():
    # Shapes for torch.compile / FakeTensor tracing through the raw ops.
    @torch.library.register_fake("flash_kernels_cuda::fwd")
    def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap):
        batch, seqlen_q, heads_q, _ = q.shape
        return q.new_empty(q.shape), q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)

    @torch.library.register_fake("flash_kernels_cuda::bwd")
    def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
                  deterministic):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    @torch.library.register_fake("flash_kernels_cuda::varlen_fwd")
    def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                         window_left, window_right, softcap):
        total_q, heads_q, _ = q.shape
        return q.new_empty(q.shape), q.new_empty((heads_q, total_q), dtype=torch.float32)

    @torch.library.register_fake("flash_kernels_cuda::varlen_bwd")
    def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal, window_left, window_right, softcap, deterministic):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
