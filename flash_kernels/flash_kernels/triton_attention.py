"""Flash attention in Triton: the host launchers the dispatch layer calls.

The kernels live beside this file, one role each: triton_scores (score/visibility helpers
shared by every kernel), triton_forward (forward, split-KV combine), triton_backward (delta,
dK/dV, dQ), triton_tiles (tile shapes, tuner, split count).

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

import torch
import triton

from .triton_backward import _bwd_delta, _bwd_dkdv, _bwd_dq
from .triton_forward import _attn_fwd, _combine_splits
from .triton_tiles import (
    INTERPRETING,
    TileConfig,
    _bwd_candidates,
    _bwd_config,
    _choose,
    _fwd_candidates,
    _fwd_config,
    _head_dim_pad,
    decode_num_splits,
)

__all__ = ["attention_backward", "attention_forward", "decode_num_splits"]
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
def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must not silently drop to tf32 inside tl.dot.
    return "ieee" if dtype == torch.float32 else "tf32"


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


def attention_forward(q, k, v, sm_scale: float, window_left: int, window_right: int,
                      softcap: float, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q: int = 0, max_seqlen_k: int = 0, seqlens_k=None,
                      batch_idx=None, num_splits: int = 1, pack_gqa: bool = False):
    """Return (out, lse). Dense q (b, sq, hq, d) or varlen q (total, hq, d) with cu_seqlens."""
    is_varlen = cu_seqlens_q is not None
    if is_varlen:
        batch = cu_seqlens_q.numel() - 1
        _, nheads_q, head_dim = q.shape
        nheads_k = k.shape[1]
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k
        total_q = q.shape[0]
        q_strides = (0, q.stride(0), q.stride(1))
        k_strides = (0, k.stride(0), k.stride(1))
        v_strides = (0, v.stride(0), v.stride(1))
        out = _new_output(q.shape, q.dtype, q.device)
        o_strides = (0, out.stride(0), out.stride(1))
        lse = _new_output((nheads_q, total_q), torch.float32, q.device)
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, nheads_q, head_dim = q.shape
        seqlen_k, nheads_k = k.shape[1], k.shape[2]
        q_strides = (q.stride(0), q.stride(1), q.stride(2))
        k_strides = (k.stride(0), k.stride(1), k.stride(2))
        v_strides = (v.stride(0), v.stride(1), v.stride(2))
        out = _new_output(q.shape, q.dtype, q.device)
        o_strides = (out.stride(0), out.stride(1), out.stride(2))
        lse = _new_output((batch, nheads_q, seqlen_q), torch.float32, q.device)
        lse_strides = (lse.stride(0), lse.stride(1))
    group = nheads_q // nheads_k
    pack_gqa = pack_gqa and group > 1
    head_dim_pad = _head_dim_pad(head_dim)
    slopes, stride_ab = _alibi(alibi_slopes, batch, q.device)
    dummy = _dummy(q.device)
    nheads_prog = nheads_k if pack_gqa else nheads_q
    rows = seqlen_q * (group if pack_gqa else 1)

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
            batch_idx if batch_idx is not None else dummy, slopes,
            *q_strides, *k_strides, *v_strides, *o_strides, *lse_strides, stride_ab,
            nheads_prog, seqlen_q, seqlen_k, sm_scale, softcap if softcap > 0 else 1.0,
            window_left, window_right,
            GROUP=group, PACK_GQA=pack_gqa, NUM_SPLITS=splits, IS_VARLEN=is_varlen,
            HAS_SEQLENS_K=seqlens_k is not None, HAS_BATCH_IDX=batch_idx is not None,
            SOFTCAP=softcap > 0, ALIBI=alibi_slopes is not None,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
            DOT_PRECISION=_dot_precision(q.dtype), **_window_flags(window_left, window_right),
            **cfg.launch_kwargs())
        if splits > 1:
            block = 16
            _combine_splits[(triton.cdiv(seqlen_q, block), batch * nheads_q)](
                o_part, lse_part, out, lse, *o_strides, *lse_strides,
                nheads_q, seqlen_q, max_sq, batch,
                NUM_SPLITS=splits, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=block)

    default = _fwd_config(head_dim_pad, q.dtype)
    if num_splits > 1 or pack_gqa or seqlens_k is not None:
        # Decode: few query rows, so small row tiles; the keys are split across programs.
        if not INTERPRETING:
            default = TileConfig(16 if rows <= 16 else (64 if rows <= 64 else default.block_m),
                                 64 if head_dim_pad <= 128 else 32, 4, 2)
        launch(default, num_splits)
        return out, lse
    key = (q.dtype, head_dim_pad, is_varlen, window_left >= 0, window_right >= 0, softcap > 0,
           alibi_slopes is not None, triton.next_power_of_2(max(seqlen_q, 1)),
           triton.next_power_of_2(max(seqlen_k, 1)))
    work = batch * nheads_q * seqlen_q * seqlen_k
    cfg = _choose("fwd", key, default, _fwd_candidates(head_dim_pad, q.dtype), work,
                  lambda c: launch(c, 1))
    launch(cfg, 1)
    return out, lse


def attention_backward(dout, q, k, v, out, lse, sm_scale: float, window_left: int,
                       window_right: int, softcap: float, alibi_slopes=None,
                       cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int = 0,
                       max_seqlen_k: int = 0):
    """Return (dq, dk, dv) in the dtypes of q, k, v. Atomic-free, so always deterministic."""
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
    head_dim_pad = _head_dim_pad(head_dim)
    slopes, stride_ab = _alibi(alibi_slopes, batch, q.device)
    dummy = _dummy(q.device)
    cu_q = cu_seqlens_q if is_varlen else dummy
    cu_k = cu_seqlens_k if is_varlen else dummy
    dq = _new_output(q.shape, q.dtype, q.device)
    dk = _new_output(k.shape, k.dtype, k.device)
    dv = _new_output(v.shape, v.dtype, v.device)
    delta = torch.empty_like(lse)
    softcap_arg = softcap if softcap > 0 else 1.0
    flags = dict(IS_VARLEN=is_varlen, SOFTCAP=softcap > 0, ALIBI=alibi_slopes is not None,
                 HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
                 DOT_PRECISION=_dot_precision(q.dtype), **_window_flags(window_left, window_right))

    block = 64
    _bwd_delta[(triton.cdiv(max(seqlen_q, 1), block), batch * nheads_q)](
        out, dout, delta, cu_q, *strides(out), *strides(dout), *lse_strides, nheads_q, seqlen_q,
        IS_VARLEN=is_varlen, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=block)

    def launch_dkdv(cfg: TileConfig):
        # BLOCK_N keys per program (the fixed side), BLOCK_M queries per step.
        _bwd_dkdv[(triton.cdiv(max(seqlen_k, 1), cfg.block_n), batch * nheads_k)](
            q, k, v, dout, lse, delta, dk, dv, cu_q, cu_k, slopes,
            *strides(q), *strides(k), *strides(v), *strides(dout), *strides(dk), *strides(dv),
            *lse_strides, stride_ab, nheads_k, seqlen_q, seqlen_k, sm_scale, softcap_arg,
            window_left, window_right, GROUP=group, **flags, **cfg.launch_kwargs())

    def launch_dq(cfg: TileConfig):
        _bwd_dq[(triton.cdiv(max(seqlen_q, 1), cfg.block_m), batch * nheads_q)](
            q, k, v, dout, lse, delta, dq, cu_q, cu_k, slopes,
            *strides(q), *strides(k), *strides(v), *strides(dout), *strides(dq),
            *lse_strides, stride_ab, nheads_q, seqlen_q, seqlen_k, sm_scale, softcap_arg,
            window_left, window_right, GROUP=group, **flags, **cfg.launch_kwargs())

    default = _bwd_config(head_dim_pad, q.dtype)
    key = (q.dtype, head_dim_pad, group, is_varlen, window_left >= 0, window_right >= 0,
           softcap > 0, alibi_slopes is not None, triton.next_power_of_2(max(seqlen_q, 1)),
           triton.next_power_of_2(max(seqlen_k, 1)))
    work = batch * nheads_q * seqlen_q * seqlen_k
    candidates = _bwd_candidates(head_dim_pad, q.dtype)
    launch_dkdv(_choose("dkdv", key, default, candidates, work, launch_dkdv))
    launch_dq(_choose("dq", key, default, candidates, work, launch_dq))
    return dq, dk, dv

