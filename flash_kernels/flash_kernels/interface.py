"""flash_attn's public functions, with its argument names, defaults and return values.

Switching a model from flash_attn means changing the import. Differences and limits (each
raised as a clear exception before any kernel runs; the full list is in flash_kernels/README.md):
- ``return_attn_probs=True`` returns ``(out, softmax_lse, S_dmask)``. With dropout, S_dmask is
  flash_attn's (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128) matrix of
  softmax probabilities in q's dtype, negated where dropout dropped the element (padding and
  masked entries hold 0); without dropout it is None (flash_attn fills it only with dropout).
- Dropout draws a fresh Philox seed from torch's generator on q's device for every call (a device
  tensor the kernels read: no host sync, safe inside CUDA graphs, reproducible after
  torch.manual_seed). The backward redraws the same mask from that seed.
- The gradient flows through ``out`` only, as in flash_attn: ``softmax_lse`` is auxiliary.
- ``deterministic``: the Triton kernels use no atomics and are always bitwise reproducible;
  the flag is forwarded to the CUDA backend.
- Paged KV (``block_table``) takes any page size that is a multiple of 16 (flash_attn: 256).
  Page ids are not checked on the host unless k/v are appended (that would cost a device sync
  per call); an out-of-range id makes that sequence's output NaN and is never dereferenced.
  A paged flash_attn_with_kvcache call checks that cache_seqlens (plus the appended keys) fit the
  pages block_table addresses (checked on the host after one copy, as flash_attn #2711; skipped
  during CUDA-graph capture and torch.compile) and raises CacheCapacityError (a RuntimeError) past them.
- The host checks run once per call signature (flash_kernels.call_memo): a repeated call with
  tensors of the same layout goes straight to the kernels.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from . import call_memo, dispatch, ops
from .errors import CacheCapacityError, UnsupportedInputError
from .out_of_memory import raise_if_out_of_memory


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def _plan(q, k, v, *, varlen, dropout_p, softmax_scale, causal, window_size, softcap,
          alibi_slopes, batch, traced, block_table=None, qkv_checked=False):
    """Every host check of a call and its backend: (softmax_scale, left, right, backend).

    Depends only on what the tensors look like and on the options, so call_memo keeps it per
    call signature.
    """
    if block_table is None and not qkv_checked:
        dispatch.check_qkv(q, k, v, varlen=varlen)
    if batch is None:
        batch = q.shape[0]
    left, right = dispatch.check_options(dropout_p=dropout_p, window_size=window_size,
                                         softcap=softcap, alibi_slopes=alibi_slopes,
                                         batch=batch, nheads_q=q.shape[-2], device=q.device)
    if causal:
        right = 0  # causal = a window with no keys to the right of the (bottom-right) diagonal
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    features = dispatch.Features(causal=causal, window_size=(left, right), softcap=float(softcap),
                                 alibi_slopes=alibi_slopes, dropout_p=float(dropout_p),
                                 is_varlen=varlen, block_table=block_table)
    # Traced by torch.compile, q/k/v are fakes the support checks cannot read: flash_kernels::fwd/bwd
    # then choose on the real tensors at run time (ops._resolve). The kernels get a copy of an
    # operand whose last dim is strided, so the copy's layout is what the CUDA path is judged on.
    backend = "auto" if traced else dispatch.choose_backend(
        *(_last_dim_contiguous(t) for t in (q, k, v)), features)
    return float(softmax_scale), left, right, backend


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _dropout_seed(dropout_p: float, device) -> Optional[torch.Tensor]:
    """A fresh Philox seed from torch's generator of ``device``, left on the device.

    A torch RNG op rather than a host value: under CUDA-graph capture it is recorded in the
    graph and each replay draws a new seed (as torch's own fused attention does with its philox
    state), and torch.manual_seed makes the mask reproducible. The kernels read it; nothing
    here waits for it.
    """
    if dropout_p <= 0.0:
        return None
    return torch.randint(0, 2 ** 62, (1,), dtype=torch.int64, device=device)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """Attention over q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim).

    nheads must be a multiple of nheads_k (MQA/GQA). Returns out (like q), or with
    return_attn_probs (out, softmax_lse (batch, nheads, seqlen_q) float32, None).
    """
    try:
        traced = _compiling()
        key = None if traced else call_memo.signature(
            "func", (q, k, v, alibi_slopes), (dropout_p, softmax_scale, causal, window_size, softcap))
        scale, left, right, backend = call_memo.plan_for(key, lambda: _plan(
            q, k, v, varlen=False, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, batch=None,
            traced=traced))
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        seed = _dropout_seed(dropout_p, q.device)
        args = (q, k, v, scale, left, right, float(softcap), alibi_slopes, float(dropout_p), seed,
                bool(deterministic), backend)
        if traced:
            out, lse = ops.attn_fwd(*args)
        elif _needs_grad(q, k, v):
            out, lse = ops.DenseAttention.apply(*args)
        else:
            out, lse = ops.dense_fwd(*args)
        if not return_attn_probs:
            return out
        s_dmask = None
        if seed is not None:
            s_dmask = (ops.attn_probs if traced else ops.probs)(q.detach(), k.detach(), lse.detach(), None, None, 0, 0, scale,
                                     left, right, float(softcap), alibi_slopes, float(dropout_p), seed)
        return out, lse, s_dmask
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_attn_func")
        raise


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
    With ``block_table`` (batch, max_pages) int32, k and v are paged caches
    (num_pages, page_size, nheads_k, headdim), page_size a multiple of 16, and sequence b's keys
    are its first cu_seqlens_k[b+1] - cu_seqlens_k[b] cache positions. The paged form runs its
    forward on inputs that require grad, as flash_attn does; only a backward through it raises
    NotImplementedError (flash_attn has no paged backward).
    """
    try:
        if block_table is not None:
            return _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 dropout_p, softmax_scale, causal, window_size, softcap,
                                 alibi_slopes, return_attn_probs, block_table)
        traced = _compiling()
        key = None if traced else call_memo.signature(
            "varlen", (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes),
            (dropout_p, softmax_scale, causal, window_size, softcap))

        def plan():
            dispatch.check_qkv(q, k, v, varlen=True)
            dispatch.check_cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k, q.device)
            return _plan(q, k, v, varlen=True, dropout_p=dropout_p, softmax_scale=softmax_scale,
                         causal=causal, window_size=window_size, softcap=softcap,
                         alibi_slopes=alibi_slopes, batch=cu_seqlens_q.numel() - 1, traced=traced,
                         qkv_checked=True)

        scale, left, right, backend = call_memo.plan_for(key, plan)
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        seed = _dropout_seed(dropout_p, q.device)
        args = (q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), scale,
                left, right, float(softcap), alibi_slopes, float(dropout_p), seed,
                bool(deterministic), backend)
        if traced:
            out, lse = ops.attn_varlen_fwd(*args)
        elif _needs_grad(q, k, v):
            out, lse = ops.VarlenAttention.apply(*args)
        else:
            out, lse = ops.varlen_fwd(*args)
        if not return_attn_probs:
            return out
        s_dmask = None
        if seed is not None:
            s_dmask = (ops.attn_probs if traced else ops.probs)(q.detach(), k.detach(), lse.detach(), cu_seqlens_q, cu_seqlens_k,
                                     int(max_seqlen_q), int(max_seqlen_k), scale, left, right,
                                     float(softcap), alibi_slopes, float(dropout_p), seed)
        return out, lse, s_dmask
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_attn_varlen_func")
        raise


def _paged_varlen(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, block_table):
    """flash_attn_varlen_func over a paged KV cache: the forward runs whatever requires grad (as in
    flash_attn); a backward through it raises NotImplementedError."""
    traced = _compiling()
    key = None if traced else call_memo.signature(
        "paged_varlen", (q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, block_table, alibi_slopes),
        (dropout_p, softmax_scale, causal, window_size, softcap, return_attn_probs))

    def plan():
        if return_attn_probs and dropout_p > 0:
            raise NotImplementedError(
                "return_attn_probs with dropout is not implemented for a paged KV cache (S_dmask "
                "is a testing output of the dense and varlen forms)")
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(t, torch.Tensor):
                raise UnsupportedInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if q.dim() != 3:
            raise UnsupportedInputError(
                f"q must have 3 dimensions (total_q, nheads, headdim); got shape {tuple(q.shape)}")
        dispatch.check_cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k, q.device)
        batch = cu_seqlens_q.numel() - 1
        dispatch.check_paged_cache(k_cache, v_cache, block_table, batch, q.device)
        # The checks of the dense form, on one page's rows standing for the pool.
        dispatch.check_qkv(q, k_cache[0], v_cache[0], varlen=True)
        if k_cache.shape != v_cache.shape:
            raise UnsupportedInputError(
                f"k_cache and v_cache must have one shape; got {tuple(k_cache.shape)} and "
                f"{tuple(v_cache.shape)}")
        if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
            raise UnsupportedInputError("k_cache and v_cache must have a contiguous last dimension")
        return _plan(q, k_cache, v_cache, varlen=True, dropout_p=dropout_p,
                     softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                     softcap=softcap, alibi_slopes=alibi_slopes, batch=batch, traced=traced,
                     block_table=block_table)

    scale, left, right, backend = call_memo.plan_for(key, plan)
    q = _last_dim_contiguous(q)
    args = (q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
            block_table, scale, left, right, float(softcap), alibi_slopes, float(dropout_p),
            _dropout_seed(dropout_p, q.device), backend)
    # The registered op carries an autograd formula that raises, so a forward on inputs that
    # require grad gives an output whose backward says why it cannot run.
    if traced or _needs_grad(q, k_cache, v_cache):
        out, lse = ops.attn_paged_varlen_fwd(*args)
    else:
        out, lse = ops.paged_varlen_fwd(*args)
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
    """Decode or chunked prefill against a KV cache, flash_attn's semantics.

    k_cache/v_cache: dense (batch_cache, seqlen_cache, nheads_k, headdim), or with block_table
    (batch, max_pages) int32 a page pool (num_pages, page_size, nheads_k, headdim) with page_size
    a multiple of 16. If k and v (batch, seqlen_new, nheads_k, headdim) are given they are
    written into the cache in place at positions cache_seqlens[b] onward (k rotated first when
    rotary_cos/rotary_sin (seqlen_ro, rotary_dim / 2) are given), and attention covers the
    cache_seqlens[b] + seqlen_new keys. q is rotated too: at cache_seqlens[b] + i when causal or
    local, else every query at cache_seqlens[b]. cache_leftpad[b] is the first valid key slot of
    sequence b (cache_seqlens counts from slot 0, as in flash_attn). cache_batch_idx maps q's
    batch rows to dense cache rows. num_splits=0 picks the split-KV count automatically; a
    positive value is honoured (rounded up to a power of 2, at most 128) on the Triton path and
    passed to the CUDA path.
    Host checks never read device memory, except when appending or paged: then one sync checks
    that the keys fit the cache, or the pages block_table addresses (CacheCapacityError, a
    RuntimeError, says how many columns to allocate), and that appended keys land on valid pages.
    Without k/v, a dense cache_seqlens past the cache end reads as the cache length. Returns out, or (out, softmax_lse) with
    return_softmax_lse. No backward (as flash_attn).
    """
    try:
        traced = _compiling()
        key = None if traced else call_memo.signature(
            "kvcache", (q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                        block_table, rotary_cos, rotary_sin, alibi_slopes),
            (cache_seqlens if isinstance(cache_seqlens, int) else None, softmax_scale, causal,
             window_size, softcap, rotary_interleaved, num_splits))
        scale, left, right, backend, batch, capacity = call_memo.plan_for(key, lambda: _kvcache_plan(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, alibi_slopes,
            traced))
        if cache_seqlens is None:
            cache_seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
        elif isinstance(cache_seqlens, int):
            cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
        if (k is not None or block_table is not None) and not traced and not _capturing(q.device):
            _check_cache_fits(cache_seqlens, 0 if k is None else k.shape[1], capacity, block_table,
                              k_cache.shape[0])
        args = (_last_dim_contiguous(q), k_cache, v_cache,
                None if k is None else _last_dim_contiguous(k),
                None if v is None else _last_dim_contiguous(v),
                cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin,
                bool(rotary_interleaved), scale, left, right, float(softcap), alibi_slopes,
                int(num_splits), backend)
        out, lse = (ops.attn_kvcache_fwd if traced else ops.kvcache_fwd)(*args)
        return (out, lse) if return_softmax_lse else out
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_attn_with_kvcache")
        raise


def _kvcache_plan(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                  cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_size,
                  softcap, alibi_slopes, traced):
    """flash_attn_with_kvcache's host checks and backend: (scale, left, right, backend, batch,
    capacity). Reads no device memory; the bounds that need it are _check_cache_fits'."""
    batch = q.shape[0] if isinstance(q, torch.Tensor) and q.dim() == 4 else -1
    paged = block_table is not None
    if paged:
        if cache_batch_idx is not None:
            raise UnsupportedInputError(
                "cache_batch_idx cannot be combined with block_table (as in flash_attn): the block "
                "table already maps each sequence to its pages")
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise UnsupportedInputError(
                    f"{name} must be a 4-D tensor; got {getattr(t, 'shape', type(t).__name__)}")
        page_size = dispatch.check_paged_cache(k_cache, v_cache, block_table, batch, q.device)
        capacity = block_table.shape[1] * page_size
    else:
        capacity = k_cache.shape[1] if isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4 else 0
    # With cache_batch_idx or pages, the cache may hold more rows than q's batch.
    dispatch.check_qkv(q, k_cache, v_cache, varlen=False,
                       same_batch=cache_batch_idx is None and not paged)
    _, _, nheads_q, head_dim = q.shape
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
        if k.device != q.device or v.device != q.device:
            raise UnsupportedInputError(f"k and v must be on {q.device}")
        if cache_seqlens is None:
            raise UnsupportedInputError(
                "cache_seqlens is required when appending k/v: it says where each sequence ends")
    if cache_seqlens is None:
        cache_seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    dispatch.check_batch_vector("cache_seqlens", cache_seqlens, batch, q.device,
                                (torch.int32, torch.int64))
    if cache_batch_idx is not None:
        dispatch.check_batch_vector("cache_batch_idx", cache_batch_idx, batch, q.device,
                                    (torch.int32, torch.int64))
    if cache_leftpad is not None:
        dispatch.check_batch_vector("cache_leftpad", cache_leftpad, batch, q.device)
    dispatch.check_rotary(rotary_cos, rotary_sin, head_dim=head_dim, capacity=capacity,
                          dtype=q.dtype, device=q.device, appending=k is not None)
    left, right = dispatch.check_options(dropout_p=0.0, window_size=window_size, softcap=softcap,
                                         alibi_slopes=alibi_slopes, batch=batch,
                                         nheads_q=nheads_q, device=q.device)
    if causal:
        right = 0
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise UnsupportedInputError("k_cache and v_cache must have a contiguous last dimension")
    features = dispatch.Features(causal=causal, window_size=(left, right), softcap=float(softcap),
                                 alibi_slopes=alibi_slopes, dropout_p=0.0, is_varlen=False,
                                 is_kvcache=True, block_table=block_table,
                                 cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad)
    backend = "auto" if traced else dispatch.choose_backend(
        _last_dim_contiguous(q), k_cache, v_cache, features)
    return float(softmax_scale), left, right, backend, batch, capacity


def _capturing(device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _check_cache_fits(cache_seqlens, seqlen_new: int, capacity: int, block_table,
                      num_pages: int) -> None:
    """When appending or reading pages: the keys must lie inside the cache.

    A paged call reads block_table up to cache_seqlens + seqlen_new keys, and block_table has
    only capacity / page_size columns: past that a kernel would index it out of bounds, so the
    call raises, as flash_attn does (its #2711). An append also needs its pages valid.
    Skipped under torch.compile and CUDA-graph capture, where a sync is impossible; the kernels
    then clamp each sequence to the capacity and the append drops a write it cannot place.

    cache_seqlens (and, for a paged append, block_table) are copied to the host and checked there.
    A copy launches no kernel: the check needs no device memory and loads no kernel code, so it
    cannot fail on a full GPU. Reductions on the device did: the first use of each of torch's
    kernels loads its module, and on a full H100 shared with other processes' contexts the driver
    failed that load with cudaErrorUnknown, which left the context unusable.
    """
    lengths = cache_seqlens.cpu().long()
    low, high = int(lengths.min()), int(lengths.max()) + seqlen_new
    if seqlen_new and low < 0:
        raise UnsupportedInputError(
            f"cache_seqlens must be >= 0 when appending k/v; got min {low}")
    if high > capacity:
        new = " + seqlen_new" if seqlen_new else ""
        if block_table is not None:
            page_size = capacity // block_table.shape[1]
            raise CacheCapacityError(
                f"paged KV cache: max(cache_seqlens){new} = {high} exceeds the capacity block_table "
                f"addresses (block_table.shape[1] * page_size = {block_table.shape[1]} * "
                f"{page_size} = {capacity}); allocate at least {-(-high // page_size)} columns in "
                "block_table, or the kernel would index it out of bounds")
        raise CacheCapacityError(
            f"max(cache_seqlens){new} = {high} exceeds the cache length (k_cache.shape[1] = "
            f"{capacity}); allocate a longer cache")
    if block_table is not None and seqlen_new:
        table = block_table.cpu()
        page_size = capacity // table.shape[1]
        pages_used = (lengths + seqlen_new + page_size - 1) // page_size
        used = torch.arange(table.shape[1])[None, :] < pages_used[:, None]
        bad = int((used & ((table < 0) | (table >= num_pages))).sum())
        if bad:
            raise UnsupportedInputError(
                f"block_table holds {bad} page id(s) outside [0, {num_pages}) among the pages "
                "the sequences use")
