"""Flash attention in Triton: the host launchers the dispatch layer calls.

The kernels live beside this file, one role each: triton_scores (score/visibility helpers
shared by every kernel), triton_forward (forward, split-KV combine), triton_backward (delta,
dK/dV, dQ), triton_kvcache (rotary and cache append before decode), triton_tiles (tile
shapes, tuner, split count).

Conventions (those of flash_attn):
- q is (batch, seqlen_q, nheads_q, headdim); k and v are (batch, seqlen_k, nheads_k, headdim),
  or (total_tokens, nheads, headdim) with cu_seqlens for the varlen form.
- Query row i sits at key position ``i + seqlen_k - seqlen_q`` (bottom-right alignment), so a
  window (left, right) keeps key j when ``i + off - left <= j <= i + off + right``; causal is
  right = 0. A negative bound is unlimited.
- softcap applies ``softcap * tanh(score * scale / softcap)`` before the ALiBi bias
  ``-slope * |i + off - j|``.
- The log-sum-exp is in natural-log units, float32, (batch, nheads_q, seqlen_q), or
  (nheads_q, total_q) for varlen. A query row that sees no key gets output 0 and lse +inf.

No kernel here uses atomics: every output element is written by exactly one program, so
results are bitwise reproducible run to run whether or not ``deterministic`` is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .targets import Target, current
from .triton_backward import _bwd_delta, _bwd_dkdv, _bwd_dq
from .triton_forward import _attn_fwd, _attn_probs, _combine_splits
from .triton_kvcache import _append_kv, _rotary_q
from .triton_tiles import (
    COMBINE_BLOCK_M,
    DELTA_BLOCK_M,
    MAX_SPLITS,
    TileConfig,
    _choose,
    bwd_candidates,
    bwd_config,
    decode_config,
    decode_num_splits,
    dot_precision,
    fwd_candidates,
    fwd_config,
    heads_block,
    pad_head_dim,
    probs_tiles,
)

__all__ = ["MAX_SPLITS", "Dropout", "append_kv", "attention_backward", "attention_forward",
           "attention_probs", "decode_num_splits", "rotary_q"]
MAX_HEAD_DIM = 256


# Tests flip this to fill every output with NaN before a launch, so an element a kernel
# forgot to write shows up as NaN instead of as stale zeros.
POISON_OUTPUTS = False


def _new_output(shape, dtype, device) -> torch.Tensor:
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


# --------------------------------------------------------------------------------------
# Host launchers. Shapes and dtypes were checked by the dispatch layer before we get here.
# --------------------------------------------------------------------------------------
def _target(t: torch.Tensor) -> Target:
    """The target the kernels launch on: the tensor's GPU (or the interpreter)."""
    return current(t.device if t.device.type == "cuda" else None)


def _window_flags(window_left: int, window_right: int) -> dict:
    return {"HAS_LEFT": window_left >= 0, "HAS_RIGHT": window_right >= 0}


def _alibi(alibi_slopes, batch: int, device):
    """Return (tensor, batch stride) for (nheads,) or (batch, nheads) fp32 slopes."""
    if alibi_slopes is None:
        return torch.empty(1, dtype=torch.float32, device=device), 0
    slopes = alibi_slopes.contiguous()
    return slopes, (slopes.stride(0) if slopes.dim() == 2 else 0)


def _dummy(device):
    return torch.empty(1, dtype=torch.int32, device=device)


@dataclass(frozen=True)
class Dropout:
    """Dropout of the attention probabilities: p, and the device tensor holding the Philox seed
    (drawn from torch's generator by the caller, read by the kernels: no host sync)."""
    p: float
    seed: torch.Tensor

    @property
    def scale(self) -> float:
        return 1.0 / (1.0 - self.p)


def _dropout_args(dropout: Dropout | None, dummy, rng_sq: int, rng_sk: int) -> tuple:
    """(SEED, dropout_p, dropout_scale, rng_sq, rng_sk) kernel arguments."""
    if dropout is None:
        return (dummy, 0.0, 1.0, 1, 1)
    return (dropout.seed, float(dropout.p), dropout.scale, max(rng_sq, 1), max(rng_sk, 1))


def attention_forward(q, k, v, sm_scale: float, window_left: int, window_right: int,
                      softcap: float, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q: int = 0, max_seqlen_k: int = 0, seqlens_k=None,
                      batch_idx=None, num_splits: int = 1, pack_gqa: bool = False,
                      block_table=None, leftpad=None, dropout: Dropout | None = None):
    """Return (out, lse). Dense q (b, sq, hq, d) or varlen q (total, hq, d) with cu_seqlens.

    With ``block_table`` (batch, max_pages) int32, k and v are page pools
    (num_pages, page_size, hk, d), in both forms; seqlens_k (KV cache) or cu_seqlens_k (varlen)
    give each sequence's length. ``leftpad`` (batch,) masks each sequence's keys before it.
    """
    is_varlen = cu_seqlens_q is not None
    paged = block_table is not None
    if is_varlen:
        batch = cu_seqlens_q.numel() - 1
        _, nheads_q, head_dim = q.shape
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k
        total_q = q.shape[0]
        q_strides = (0, q.stride(0), q.stride(1))
        out = _new_output(q.shape, q.dtype, q.device)
        o_strides = (0, out.stride(0), out.stride(1))
        lse = _new_output((nheads_q, total_q), torch.float32, q.device)
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, nheads_q, head_dim = q.shape
        seqlen_k = k.shape[1]
        q_strides = (q.stride(0), q.stride(1), q.stride(2))
        out = _new_output(q.shape, q.dtype, q.device)
        o_strides = (out.stride(0), out.stride(1), out.stride(2))
        lse = _new_output((batch, nheads_q, seqlen_q), torch.float32, q.device)
        lse_strides = (lse.stride(0), lse.stride(1))
    if paged:
        page_size = k.shape[1]
        nheads_k = k.shape[2]
        if not is_varlen:
            seqlen_k = block_table.shape[1] * page_size  # the capacity the kernel clamps to
        k_strides = (k.stride(0), k.stride(1), k.stride(2))
        v_strides = (v.stride(0), v.stride(1), v.stride(2))
    elif is_varlen:
        page_size = 0
        nheads_k = k.shape[1]
        k_strides = (0, k.stride(0), k.stride(1))
        v_strides = (0, v.stride(0), v.stride(1))
    else:
        page_size = 0
        nheads_k = k.shape[2]
        k_strides = (k.stride(0), k.stride(1), k.stride(2))
        v_strides = (v.stride(0), v.stride(1), v.stride(2))
    group = nheads_q // nheads_k
    pack_gqa = pack_gqa and group > 1
    head_dim_pad = pad_head_dim(head_dim)
    slopes, stride_ab = _alibi(alibi_slopes, batch, q.device)
    dummy = _dummy(q.device)
    nheads_prog = nheads_k if pack_gqa else nheads_q
    rows = seqlen_q * (group if pack_gqa else 1)
    rng = _dropout_args(dropout, dummy, seqlen_q, seqlen_k)
    target = _target(q)
    precision = dot_precision(q.dtype, target)

    def launch(cfg: TileConfig, splits: int):
        grid = (triton.cdiv(max(rows, 1), cfg.block_m), batch * nheads_prog, splits)
        if splits > 1:
            max_sq = grid[0] * cfg.block_m // (group if pack_gqa else 1)
            o_part = torch.empty((splits, batch, nheads_q, max_sq, head_dim_pad),
                                 dtype=torch.float32, device=q.device)
            lse_part = torch.empty((splits, batch, nheads_q, max_sq), dtype=torch.float32,
                                   device=q.device)
        else:
            o_part = lse_part = dummy
        _attn_fwd[grid](
            q, k, v, out, lse, o_part, lse_part,
            cu_seqlens_q if is_varlen else dummy, cu_seqlens_k if is_varlen else dummy,
            seqlens_k if seqlens_k is not None else dummy,
            batch_idx if batch_idx is not None else dummy,
            leftpad if leftpad is not None else dummy,
            block_table if paged else dummy, slopes, rng[0],
            *q_strides, *k_strides, *v_strides, *o_strides, *lse_strides, stride_ab,
            block_table.stride(0) if paged else 0,
            nheads_prog, seqlen_q, seqlen_k, k.shape[0] if paged else 0,
            sm_scale, softcap if softcap > 0 else 1.0, window_left, window_right, *rng[1:],
            GROUP=group, PACK_GQA=pack_gqa, NUM_SPLITS=splits, IS_VARLEN=is_varlen,
            HAS_SEQLENS_K=seqlens_k is not None, HAS_BATCH_IDX=batch_idx is not None,
            HAS_LEFTPAD=leftpad is not None, PAGE_SIZE=page_size,
            SOFTCAP=softcap > 0, ALIBI=alibi_slopes is not None, DROPOUT=dropout is not None,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
            DOT_PRECISION=precision, **_window_flags(window_left, window_right),
            **cfg.launch_kwargs())
        if splits > 1:
            block = COMBINE_BLOCK_M
            _combine_splits[(triton.cdiv(seqlen_q, block), batch * nheads_q)](
                o_part, lse_part, out, lse, *o_strides, *lse_strides,
                nheads_q, seqlen_q, max_sq, batch,
                NUM_SPLITS=splits, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=block)

    if num_splits > 1 or pack_gqa or seqlens_k is not None:
        # Decode: few query rows, so small row tiles; the keys are split across programs.
        launch(decode_config(rows, head_dim_pad, q.dtype, target), num_splits)
        return out, lse
    default = fwd_config(head_dim_pad, q.dtype, target)
    key = (q.dtype, head_dim_pad, is_varlen, window_left >= 0, window_right >= 0, softcap > 0,
           alibi_slopes is not None, page_size, dropout is not None,
           triton.next_power_of_2(max(seqlen_q, 1)), triton.next_power_of_2(max(seqlen_k, 1)))
    work = batch * nheads_q * seqlen_q * seqlen_k
    cfg = _choose("fwd", key, default, fwd_candidates(head_dim_pad, q.dtype, target), work,
                  lambda c: launch(c, 1))
    launch(cfg, 1)
    return out, lse


def attention_probs(q, k, lse, sm_scale: float, window_left: int, window_right: int,
                    softcap: float, alibi_slopes, dropout: Dropout, cu_seqlens_q=None,
                    cu_seqlens_k=None, max_seqlen_q: int = 0, max_seqlen_k: int = 0):
    """flash_attn's S_dmask: (batch, nheads, round128(seqlen_q), round128(seqlen_k)) in q's
    dtype, the softmax probabilities with the dropped entries negated."""
    is_varlen = cu_seqlens_q is not None
    if is_varlen:
        batch = cu_seqlens_q.numel() - 1
        _, nheads_q, head_dim = q.shape
        nheads_k = k.shape[1]
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k
        q_strides, k_strides = (0, q.stride(0), q.stride(1)), (0, k.stride(0), k.stride(1))
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, nheads_q, head_dim = q.shape
        seqlen_k, nheads_k = k.shape[1], k.shape[2]
        q_strides = (q.stride(0), q.stride(1), q.stride(2))
        k_strides = (k.stride(0), k.stride(1), k.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1))
    rows, cols = _round_up(seqlen_q, 128), _round_up(seqlen_k, 128)
    probs = _new_output((batch, nheads_q, rows, cols), q.dtype, q.device)
    head_dim_pad = pad_head_dim(head_dim)
    slopes, stride_ab = _alibi(alibi_slopes, batch, q.device)
    dummy = _dummy(q.device)
    block_m, block_n = probs_tiles(head_dim_pad)
    _attn_probs[(triton.cdiv(rows, block_m), batch * nheads_q)](
        q, k, lse, probs, cu_seqlens_q if is_varlen else dummy,
        cu_seqlens_k if is_varlen else dummy, slopes, dropout.seed,
        *q_strides, *k_strides, *lse_strides, probs.stride(0), probs.stride(1), probs.stride(2),
        stride_ab, nheads_q, seqlen_q, seqlen_k, rows, cols, sm_scale,
        softcap if softcap > 0 else 1.0, window_left, window_right, float(dropout.p),
        max(seqlen_q, 1), max(seqlen_k, 1),
        GROUP=nheads_q // nheads_k, IS_VARLEN=is_varlen, SOFTCAP=softcap > 0,
        ALIBI=alibi_slopes is not None, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_M=block_m, BLOCK_N=block_n, DOT_PRECISION=dot_precision(q.dtype, _target(q)),
        **_window_flags(window_left, window_right))
    return probs


def _round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def attention_backward(dout, q, k, v, out, lse, sm_scale: float, window_left: int,
                       window_right: int, softcap: float, alibi_slopes=None,
                       cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int = 0,
                       max_seqlen_k: int = 0, dropout: Dropout | None = None):
    """Return (dq, dk, dv) in the dtypes of q, k, v. Atomic-free, so always deterministic.

    With dropout, the kernels redraw the forward's keep mask from the same seed and counters.
    """
    is_varlen = cu_seqlens_q is not None
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    if is_varlen:
        batch = cu_seqlens_q.numel() - 1
        _, nheads_q, head_dim = q.shape
        nheads_k = k.shape[1]
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k

        def strides(t):
            return (0, t.stride(0), t.stride(1))
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, nheads_q, head_dim = q.shape
        seqlen_k, nheads_k = k.shape[1], k.shape[2]

        def strides(t):
            return (t.stride(0), t.stride(1), t.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1))
    group = nheads_q // nheads_k
    head_dim_pad = pad_head_dim(head_dim)
    slopes, stride_ab = _alibi(alibi_slopes, batch, q.device)
    dummy = _dummy(q.device)
    cu_q = cu_seqlens_q if is_varlen else dummy
    cu_k = cu_seqlens_k if is_varlen else dummy
    dq = _new_output(q.shape, q.dtype, q.device)
    dk = _new_output(k.shape, k.dtype, k.device)
    dv = _new_output(v.shape, v.dtype, v.device)
    delta = torch.empty_like(lse)
    softcap_arg = softcap if softcap > 0 else 1.0
    rng = _dropout_args(dropout, dummy, seqlen_q, seqlen_k)
    target = _target(q)
    flags = dict(IS_VARLEN=is_varlen, SOFTCAP=softcap > 0, ALIBI=alibi_slopes is not None,
                 DROPOUT=dropout is not None, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
                 DOT_PRECISION=dot_precision(q.dtype, target),
                 **_window_flags(window_left, window_right))

    block = DELTA_BLOCK_M
    _bwd_delta[(triton.cdiv(max(seqlen_q, 1), block), batch * nheads_q)](
        out, dout, delta, cu_q, *strides(out), *strides(dout), *lse_strides, nheads_q, seqlen_q,
        IS_VARLEN=is_varlen, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=block)

    def launch_dkdv(cfg: TileConfig):
        # BLOCK_N keys per program (the fixed side), BLOCK_M queries per step.
        _bwd_dkdv[(triton.cdiv(max(seqlen_k, 1), cfg.block_n), batch * nheads_k)](
            q, k, v, dout, lse, delta, dk, dv, cu_q, cu_k, slopes, rng[0],
            *strides(q), *strides(k), *strides(v), *strides(dout), *strides(dk), *strides(dv),
            *lse_strides, stride_ab, nheads_k, seqlen_q, seqlen_k, sm_scale, softcap_arg,
            window_left, window_right, *rng[1:], GROUP=group, **flags, **cfg.launch_kwargs())

    def launch_dq(cfg: TileConfig):
        _bwd_dq[(triton.cdiv(max(seqlen_q, 1), cfg.block_m), batch * nheads_q)](
            q, k, v, dout, lse, delta, dq, cu_q, cu_k, slopes, rng[0],
            *strides(q), *strides(k), *strides(v), *strides(dout), *strides(dq),
            *lse_strides, stride_ab, nheads_q, seqlen_q, seqlen_k, sm_scale, softcap_arg,
            window_left, window_right, *rng[1:], GROUP=group, **flags, **cfg.launch_kwargs())

    default = bwd_config(head_dim_pad, q.dtype, target)
    key = (q.dtype, head_dim_pad, group, is_varlen, window_left >= 0, window_right >= 0,
           softcap > 0, alibi_slopes is not None, dropout is not None,
           triton.next_power_of_2(max(seqlen_q, 1)), triton.next_power_of_2(max(seqlen_k, 1)))
    work = batch * nheads_q * seqlen_q * seqlen_k
    candidates = bwd_candidates(head_dim_pad, q.dtype, target)
    launch_dkdv(_choose("dkdv", key, default, candidates, work, launch_dkdv))
    launch_dq(_choose("dq", key, default, candidates, work, launch_dq))
    return dq, dk, dv


# --------------------------------------------------------------------------------------
# KV-cache preparation: rotary embedding of q, in-place append of new k/v.
# --------------------------------------------------------------------------------------
def rotary_q(q, cos, sin, cache_seqlens, interleaved: bool, per_row: bool):
    """q (b, sq, hq, d) rotated at positions cache_seqlens[b] (+ i when per_row)."""
    batch, seqlen_q, nheads, head_dim = q.shape
    out = _new_output(q.shape, q.dtype, q.device)
    head_dim_pad = pad_head_dim(head_dim)
    block_h = heads_block(nheads, head_dim_pad)
    _rotary_q[(batch * seqlen_q, triton.cdiv(nheads, block_h))](
        q, out, cos, sin, cache_seqlens, q.stride(0), q.stride(1), q.stride(2),
        out.stride(0), out.stride(1), out.stride(2), cos.stride(0), seqlen_q, cos.shape[0],
        nheads, PER_ROW=per_row, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        ROTARY_DIM=2 * cos.shape[1], INTERLEAVED=interleaved, BLOCK_H=block_h)
    return out


def append_kv(k_new, v_new, k_cache, v_cache, cache_seqlens, batch_idx=None, block_table=None,
              cos=None, sin=None, interleaved: bool = True) -> None:
    """Write k_new/v_new (b, s_new, hk, d) into the cache in place at cache_seqlens[b] onward,
    rotating k first when cos/sin are given. Dense caches (b_cache, s_cache, hk, d) are
    indexed through batch_idx; paged ones (num_pages, page_size, hk, d) through block_table."""
    batch, seqlen_new, nheads_k, head_dim = k_new.shape
    if batch == 0 or seqlen_new == 0:
        return
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 0
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    head_dim_pad = pad_head_dim(head_dim)
    block_h = heads_block(nheads_k, head_dim_pad)
    dummy = _dummy(k_new.device)
    rotary = cos is not None
    _append_kv[(batch * seqlen_new, triton.cdiv(nheads_k, block_h))](
        k_new, v_new, k_cache, v_cache, cache_seqlens,
        batch_idx if batch_idx is not None else dummy, block_table if paged else dummy,
        cos if rotary else dummy, sin if rotary else dummy,
        k_new.stride(0), k_new.stride(1), k_new.stride(2),
        v_new.stride(0), v_new.stride(1), v_new.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0) if paged else 0, cos.stride(0) if rotary else 0,
        seqlen_new, capacity, k_cache.shape[0] if paged else 0,
        cos.shape[0] if rotary else 0, nheads_k,
        HAS_BATCH_IDX=batch_idx is not None, PAGE_SIZE=page_size, ROTARY=rotary,
        ROTARY_DIM=2 * cos.shape[1] if rotary else 0, INTERLEAVED=interleaved,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_H=block_h)
