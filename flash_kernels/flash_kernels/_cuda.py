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
varlen (packed (total, h, d) tensors with int32 cu_seqlens; lse (h, total_q)), and paged K/V in the
varlen forward (``block_table``; general kernel, also on Hopper).
The backward is deterministic always: bitwise the same result on every run (no atomics, or, in the
single-pass Hopper backward, dQ additions in a fixed order).

KV cache (``kvcache_fwd``, flash_attn_with_kvcache's attention once rotary and the k/v append are done):
dense or paged caches, split-KV with the split count planned on the host from batch, kv heads, cache
capacity and SM count, GQA heads packed into one tile, seqlen_q >= 1 with causal/window (bottom-right),
cache_leftpad, cache_batch_idx (dense), softcap; ``kvcache_unsupported_reason`` says what it cannot take.
No host sync: cache_seqlens, cache_leftpad, cache_batch_idx and block_table stay on the device, so the
call can be captured in a CUDA graph.
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


@functools.lru_cache(maxsize=1)
def kvcache_head_dims() -> tuple[int, ...]:
    """Head dims the KV-cache kernel is compiled for; a head dim d runs on the smallest one >= d."""
    return tuple(torch.ops.flash_kernels_cuda.kvcache_head_dims())


def prepare_kernels(device_index: int) -> int:
    """Load every kernel of the extension on the device now (see out_of_memory.prepare_kernels); returns how
    many launchers were walked, 0 for an extension built before the op existed."""
    if not hasattr(torch.ops.flash_kernels_cuda, "prepare_kernels"):
        return 0
    return int(torch.ops.flash_kernels_cuda.prepare_kernels(int(device_index)))


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
                       is_varlen, block_table=None) -> str | None:
    """None when the CUDA path supports this call, else a short reason a person can act on.

    block_table (varlen forward only): k and v are paged caches (num_pages, page_size, heads_k, d)."""
    if block_table is not None:
        if not is_varlen:
            return "block_table (paged KV) is supported by the CUDA path in the varlen forward and kvcache_fwd only"
        reason = _paged_reason(k, v, block_table)
        if reason:
            return reason
        k = v = k[:1].flatten(0, 1)  # one page as (rows, heads, d), for the common checks below
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
    want = 3 if is_varlen else 4
    layout = "(total_tokens, heads, head_dim)" if is_varlen else "(batch, seqlen, heads, head_dim)"
    reason = _tensors_reason((("q", q), ("k", k), ("v", v)), want, layout)
    if reason:
        return reason
    head_dim = q.shape[-1]
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


def _tensors_reason(named, want_dim, layout) -> str | None:
    """What every CUDA op needs of its (name, tensor) operands, q first: CUDA device, rank, sm_80+, one
    fp16/bf16 dtype, one head dim that is a multiple of 8."""
    q = named[0][1]
    for name, t in named:
        if t.device.type != "cuda":
            return f"{name} is on {t.device}, not a CUDA GPU"
        if t.dim() != want_dim:
            return f"{name} is {t.dim()}-D; the CUDA path takes {layout}"
    major, minor = _capability(q.device.index if q.device.index is not None else torch.cuda.current_device())
    if major < 8:
        return f"GPU is sm_{major}{minor}; the CUDA kernels need sm_80 or newer"
    if q.dtype not in _DTYPES:
        return f"dtype {q.dtype} is not supported by the CUDA path (float16, bfloat16)"
    names = ", ".join(n for n, _ in named[:-1]) + f" and {named[-1][0]}"
    if any(t.dtype != q.dtype for _, t in named):
        return f"{names} dtypes differ"
    head_dim = q.shape[-1]
    if any(t.shape[-1] != head_dim for _, t in named):
        return f"{names} head dims differ"
    if head_dim % 8:
        return (f"head dim {head_dim} is not a multiple of 8; the CUDA kernels copy rows in 16-byte chunks "
                "(the Triton backend takes any head dim)")
    return None


def _paged_reason(k_cache, v_cache, block_table) -> str | None:
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        return "a paged cache must be 4-D (num_pages, page_size, heads_k, head_dim)"
    if k_cache.shape != v_cache.shape:
        return "k_cache and v_cache shapes differ"
    if k_cache.shape[1] % 16 or k_cache.shape[1] == 0:
        return f"page size {k_cache.shape[1]} is not a multiple of 16"
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        return "block_table must be a 2-D int32 tensor (batch, max_blocks)"
    if block_table.device != k_cache.device:
        return "block_table is not on the cache's device"
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        return "block_table has a non-contiguous last dim"
    return None


def kvcache_unsupported_reason(q, k_cache, v_cache, *, block_table, cache_batch_idx, cache_leftpad, softcap,
                               alibi_slopes, window_left, window_right) -> str | None:
    """None when ``kvcache_fwd`` takes this call, else a short reason (for dispatch to route it to Triton).

    q (batch, seqlen_q, heads_q, d); caches dense (cache_batch, capacity, heads_k, d) or paged
    (num_pages, page_size, heads_k, d) with block_table."""
    if not is_built():
        return f"the CUDA extension is not built or failed to load ({_IMPORT_ERROR or 'ops missing'})"
    if not hasattr(torch.ops.flash_kernels_cuda, "kvcache_fwd"):
        return "this build of the CUDA extension has no KV-cache kernel"
    if torch.version.hip is not None:
        return "ROCm build of torch: the CUDA kernels are NVIDIA-only"
    if alibi_slopes is not None:
        return "ALiBi is not implemented in the CUDA KV-cache kernel"
    if softcap < 0:
        return f"softcap must be >= 0, got {softcap}"
    if window_left < -1 or window_right < -1:
        return f"window ({window_left}, {window_right}) must be >= -1"
    reason = _tensors_reason((("q", q), ("k_cache", k_cache), ("v_cache", v_cache)), 4,
                             "(batch, seqlen, heads, head_dim) / (num_pages, page_size, heads, head_dim)")
    if reason:
        return reason
    head_dim = q.shape[-1]
    if head_dim > max(kvcache_head_dims()):
        return f"head dim {head_dim} is larger than the KV-cache kernel's largest ({max(kvcache_head_dims())})"
    heads_k = k_cache.shape[2]
    if heads_k == 0 or q.shape[2] % heads_k:
        return f"q heads ({q.shape[2]}) are not a multiple of k/v heads ({heads_k})"
    if q.shape[0] >= 65536 or heads_k >= 65536:
        return "batch and kv heads must be < 65536 (grid limits)"
    if block_table is not None:
        if cache_batch_idx is not None:
            return "cache_batch_idx with block_table (flash_attn does not take both either)"
        reason = _paged_reason(k_cache, v_cache, block_table)
        if reason:
            return reason
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape != v_cache.shape:
            return "k_cache and v_cache shapes differ"
        capacity = k_cache.shape[1]
    if capacity + q.shape[1] >= 2**30:
        return "cache length + seqlen_q must be < 2^30"
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None and (t.dtype != torch.int32 or t.shape != (q.shape[0],)):
            return f"{name} must be an int32 tensor of shape ({q.shape[0]},)"
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
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
    """(dq, dk, dv) like q, k, v. Always deterministic, whatever ``deterministic`` says."""
    return torch.ops.flash_kernels_cuda.bwd(_kernel_ready(dout), q, k, v, _kernel_ready(out),
                                            lse.contiguous(), float(softmax_scale), bool(causal),
                                            int(window_left), int(window_right), float(softcap),
                                            bool(deterministic))


def varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
               window_left, window_right, softcap, block_table=None):
    """(out, lse) for packed sequences: out like q (total_q, h, d), lse (heads_q, total_q) float32.

    With block_table (batch, max_blocks) int32, k and v are paged caches (num_pages, page_size, heads_k, d)
    (page size a multiple of 16) and sequence b's keys are positions [0, cu_seqlens_k[b+1] - cu_seqlens_k[b])
    of its block table. Page ids outside [0, num_pages) are not checked (a host sync): they read as zeros."""
    return torch.ops.flash_kernels_cuda.varlen_fwd(
        q, k, v, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), int(max_seqlen_q), int(max_seqlen_k),
        float(softmax_scale), bool(causal), int(window_left), int(window_right), float(softcap), block_table)


def kvcache_fwd(q, k_cache, v_cache, cache_seqlens, block_table, cache_batch_idx, cache_leftpad, softmax_scale,
                window_left, window_right, softcap, num_splits):
    """(out, lse): out like q (batch, seqlen_q, heads_q, d), lse (batch, heads_q, seqlen_q) float32 (natural
    log; +inf where a row sees no key, whose out is 0).

    cache_seqlens (batch,) int32: keys per sequence, appended ones included; with cache_leftpad (batch,)
    int32 the keys are cache positions [cache_leftpad[b], cache_seqlens[b]). Query i of seqlen_q sees position
    i + cache_seqlens[b] - seqlen_q and before (window_right=0, bottom-right causal), within the window.
    cache_batch_idx (dense caches only): the cache row of sequence b. num_splits 0 picks the split-KV count
    on the host; n > 0 is honoured, capped at 128 and at one 64-128-key block per split.
    Device data is clamped, not checked (that would sync): cache_seqlens to the cache capacity, leftpad to
    [0, cache_seqlens]; a cache_batch_idx outside the cache gives its sequence no key, and a block id outside
    [0, num_pages) reads as zeros. No memory outside the caches is ever read."""
    return torch.ops.flash_kernels_cuda.kvcache_fwd(
        q, k_cache, v_cache, cache_seqlens, block_table, cache_batch_idx, cache_leftpad, float(softmax_scale),
        int(window_left), int(window_right), float(softcap), int(num_splits))


def varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
               causal, window_left, window_right, softcap, deterministic):
    """(dq, dk, dv) like q, k, v for packed sequences. Always deterministic."""
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
                         window_left, window_right, softcap, block_table=None):
        total_q, heads_q, _ = q.shape
        return q.new_empty(q.shape), q.new_empty((heads_q, total_q), dtype=torch.float32)

    if hasattr(torch.ops.flash_kernels_cuda, "kvcache_fwd"):
        @torch.library.register_fake("flash_kernels_cuda::kvcache_fwd")
        def _kvcache_fwd_fake(q, k_cache, v_cache, cache_seqlens, block_table, cache_batch_idx, cache_leftpad,
                              softmax_scale, window_left, window_right, softcap, num_splits):
            batch, seqlen_q, heads_q, _ = q.shape
            return q.new_empty(q.shape), q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)

    @torch.library.register_fake("flash_kernels_cuda::varlen_bwd")
    def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal, window_left, window_right, softcap, deterministic):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
