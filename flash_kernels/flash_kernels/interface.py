"""flash_attn's public functions, with its argument names, defaults and return values.

Switching a model from flash_attn means changing the import. Differences, all raised clearly:
- ``dropout_p > 0`` raises NotImplementedError.
- ``return_attn_probs=True`` returns ``(out, softmax_lse, S_dmask)``; ``S_dmask`` is always
  None. (flash_attn fills it only when dropout_p > 0, for its tests; we have no dropout.)
- The gradient flows through ``out`` only, as in flash_attn: ``softmax_lse`` is auxiliary.
- ``deterministic``: the Triton kernels use no atomics and are always bitwise reproducible;
  the flag is forwarded to the CUDA backend.
- flash_attn_with_kvcache: rotary embedding, cache_leftpad and block_table (paged KV cache)
  raise NotImplementedError.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from . import dispatch, ops
from .errors import UnsupportedInputError


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def _prepare(q, k, v, *, varlen, dropout_p, softmax_scale, causal, window_size, softcap,
             alibi_slopes, batch):
    dispatch.check_qkv(q, k, v, varlen=varlen)
    left, right = dispatch.check_options(dropout_p=dropout_p, window_size=window_size,
                                         softcap=softcap, alibi_slopes=alibi_slopes,
                                         batch=batch, nheads_q=q.shape[-2], device=q.device)
    if causal:
        right = 0  # causal = a window with no keys to the right of the (bottom-right) diagonal
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    features = dispatch.Features(causal=causal, window_size=(left, right), softcap=float(softcap),
                                 alibi_slopes=alibi_slopes, dropout_p=dropout_p, is_varlen=varlen)
    # Traced by torch.compile, q/k/v are fakes the support checks cannot read: flash_kernels::fwd/bwd
    # then choose on the real tensors at run time (ops._resolve).
    backend = "auto" if _compiling() else dispatch.choose_backend(q, k, v, features)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    return q, k, v, float(softmax_scale), left, right, backend


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """Attention over q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim).

    nheads must be a multiple of nheads_k (MQA/GQA). Returns out (like q), or with
    return_attn_probs (out, softmax_lse (batch, nheads, seqlen_q) float32, None).
    """
    q, k, v, scale, left, right, backend = _prepare(
        q, k, v, varlen=False, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, batch=q.shape[0])
    out, lse = ops.attn_fwd(q, k, v, scale, left, right, float(softcap), alibi_slopes,
                            bool(deterministic), backend)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """qkv is (batch, seqlen, 3, nheads, headdim)."""
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise UnsupportedInputError(
            f"qkv must have shape (batch, seqlen, 3, nheads, headdim); got {tuple(qkv.shape)}")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """kv is (batch, seqlen_k, 2, nheads_k, headdim)."""
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise UnsupportedInputError(
            f"kv must have shape (batch, seqlen_k, 2, nheads_k, headdim); got {tuple(kv.shape)}")
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """Packed sequences: q (total_q, nheads, headdim), k/v (total_k, nheads_k, headdim).

    cu_seqlens_* are int32 (batch + 1,) cumulative lengths; softmax_lse is (nheads, total_q).
    """
    if block_table is not None:
        raise NotImplementedError(
            "block_table (paged KV) is not implemented in flash_kernels' varlen attention")
    dispatch.check_qkv(q, k, v, varlen=True)
    dispatch.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device)
    dispatch.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise UnsupportedInputError(
            f"cu_seqlens_q and cu_seqlens_k must both have batch+1 entries; got "
            f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    q, k, v, scale, left, right, backend = _prepare(
        q, k, v, varlen=True, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        batch=cu_seqlens_q.numel() - 1)
    out, lse = ops.attn_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                   int(max_seqlen_k), scale, left, right, float(softcap),
                                   alibi_slopes, bool(deterministic), backend)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv is (total, 3, nheads, headdim)."""
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise UnsupportedInputError(
            f"qkv must have shape (total, 3, nheads, headdim); got {tuple(qkv.shape)}")
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False,
                                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                    deterministic=False, return_attn_probs=False):
    """kv is (total_k, 2, nheads_k, headdim)."""
    if kv.dim() != 4 or kv.shape[1] != 2:
        raise UnsupportedInputError(
            f"kv must have shape (total_k, 2, nheads_k, headdim); got {tuple(kv.shape)}")
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
                            cache_batch_idx: Optional[torch.Tensor] = None,
                            cache_leftpad: Optional[torch.Tensor] = None,
                            block_table: Optional[torch.Tensor] = None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """Decode against a KV cache (batch_cache, seqlen_cache, nheads_k, headdim).

    If k and v (batch, seqlen_new, nheads_k, headdim) are given they are written into the
    cache in place at positions cache_seqlens[b] onward, and attention covers
    cache_seqlens[b] + seqlen_new keys. num_splits=0 picks the split-KV count automatically.
    Without k/v, cache_seqlens is not checked on the host (that would cost a device sync per
    decode step); a length past the cache end is read as the cache length.
    Returns out, or (out, softmax_lse) with return_softmax_lse. No backward (as flash_attn).
    """
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                        ("cache_leftpad", cache_leftpad), ("block_table", block_table)):
        if value is not None:
            raise NotImplementedError(
                f"flash_attn_with_kvcache({name}=...) is not implemented in flash_kernels; "
                "apply rotary embeddings before the call and use a contiguous (non-paged) cache")
    # With cache_batch_idx, the cache may hold more sequences than q's batch.
    dispatch.check_qkv(q, k_cache, v_cache, varlen=False, same_batch=cache_batch_idx is None)
    batch, _, nheads_q, head_dim = q.shape
    if (k is None) != (v is None):
        raise UnsupportedInputError("k and v must be given together (or both left None)")
    if k is not None:
        if k.shape != v.shape or k.dim() != 4 or k.shape[0] != batch or \
                tuple(k.shape[2:]) != tuple(k_cache.shape[2:]):
            raise UnsupportedInputError(
                f"k and v must have shape (batch={batch}, seqlen_new, nheads_k={k_cache.shape[2]}, "
                f"headdim={head_dim}); got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:
            raise UnsupportedInputError("k and v must have the dtype of the cache")
        if cache_seqlens is None:
            raise UnsupportedInputError(
                "cache_seqlens is required when appending k/v: it says where each sequence ends")
    if cache_seqlens is None:
        cache_seqlens = torch.full((batch,), k_cache.shape[1], dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    if cache_seqlens.shape != (batch,) or cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise UnsupportedInputError(
            f"cache_seqlens must be an int or an int32 tensor of shape ({batch},); got "
            f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
    if cache_batch_idx is not None and (cache_batch_idx.shape != (batch,)
                                        or cache_batch_idx.dtype not in (torch.int32, torch.int64)):
        raise UnsupportedInputError(
            f"cache_batch_idx must be an int32 tensor of shape ({batch},)")
    if k is not None:
        # One host sync, only when appending: an out-of-range append would write past the cache.
        # (Reads need no check: the kernel never reads past the cache length.)
        if int(cache_seqlens.max()) + k.shape[1] > k_cache.shape[1] or int(cache_seqlens.min()) < 0:
            raise UnsupportedInputError(
                f"cache_seqlens + seqlen_new must lie in [0, {k_cache.shape[1]}] (the cache "
                f"length); got max {int(cache_seqlens.max())} + {k.shape[1]}")
    left, right = dispatch.check_options(dropout_p=0.0, window_size=window_size, softcap=softcap,
                                         alibi_slopes=alibi_slopes, batch=batch,
                                         nheads_q=nheads_q, device=q.device)
    if causal:
        right = 0
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    features = dispatch.Features(causal=causal, window_size=(left, right), softcap=float(softcap),
                                 alibi_slopes=alibi_slopes, dropout_p=0.0, is_varlen=False,
                                 is_kvcache=True)
    dispatch.choose_backend(q, k_cache, v_cache, features)  # raises if cuda is forced: no decode path
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise UnsupportedInputError("k_cache and v_cache must have a contiguous last dimension")
    out, lse = ops.attn_kvcache_fwd(
        _last_dim_contiguous(q), k_cache, v_cache,
        None if k is None else _last_dim_contiguous(k), None if v is None else _last_dim_contiguous(v),
        cache_seqlens, cache_batch_idx, float(softmax_scale), left, right, float(softcap),
        alibi_slopes, int(num_splits))
    return (out, lse) if return_softmax_lse else out
