"""Flash attention in Triton: forward (with log-sum-exp), backward, and split-KV decode.

Reads top to bottom: constants and capability probes, the score helper shared by every
kernel, the forward kernel and its inner loop, the split-KV combine kernel, the backward
kernels (delta preprocess, dK/dV, dQ), launch-configuration choice, then the host-side
launchers that the dispatch layer calls.

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

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # 1/ln(2): the kernels work in base 2 (exp2 is native)
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
IS_HIP = torch.version.hip is not None
MAX_HEAD_DIM = 256

# Tests flip this to fill every output with NaN before a launch, so an element a kernel
# forgot to write shows up as NaN instead of as stale zeros.
POISON_OUTPUTS = False


def _new_output(shape, dtype, device) -> torch.Tensor:
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


# --------------------------------------------------------------------------------------
# Scores: scale, softcap, ALiBi and the window/causal/length mask, in base-2 units.
# --------------------------------------------------------------------------------------
@triton.jit
def _scores(qk, key_pos_of_row, cols, seqlen_k, sm_scale, softcap, slope_log2,
            window_left, window_right,
            MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
            SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """Turn raw q.k (fp32, rows x cols) into base-2 logits; also return tanh for softcap's grad.

    ``key_pos_of_row`` is (rows, 1) and ``cols`` (1, cols) (or the transposed pair), so the
    same code serves the forward tile and the transposed dK/dV tile.
    """
    if SOFTCAP:
        # tanh(x) = 1 - 2 / (exp(2x) + 1), in fp32; saturates cleanly at +-1 for large |x|.
        t = 1.0 - 2.0 / (tl.exp2(qk * (2.0 * LOG2E * sm_scale / softcap)) + 1.0)
        s = t * (softcap * LOG2E)
    else:
        t = qk
        s = qk * (sm_scale * LOG2E)
    if ALIBI:
        s -= slope_log2 * tl.abs(key_pos_of_row - cols).to(tl.float32)
    if MASKED:
        keep = cols < seqlen_k
        if HAS_LEFT:
            keep = keep & (cols >= key_pos_of_row - window_left)
        if HAS_RIGHT:
            keep = keep & (cols <= key_pos_of_row + window_right)
        s = tl.where(keep, s, float("-inf"))
    return s, t


@triton.jit
def _key_block_bounds(row_lo_pos, row_hi_pos, seqlen_k, window_left, window_right,
                      BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Key range seen by query key-positions [row_lo_pos, row_hi_pos], split into masked edges.

    Returns (lo, full_lo, full_hi, hi), all multiples of BLOCK_N except hi: blocks in
    [full_lo, full_hi) need no mask at all; [lo, full_lo) and [full_hi, hi) do.
    """
    lo = 0
    full_lo = 0
    if HAS_LEFT:
        lo = tl.maximum(row_lo_pos - window_left, 0)
        full_lo = tl.maximum(row_hi_pos - window_left, 0)
    hi = seqlen_k
    full_hi = seqlen_k
    if HAS_RIGHT:
        hi = tl.minimum(row_hi_pos + window_right + 1, seqlen_k)
        full_hi = tl.minimum(row_lo_pos + window_right + 1, seqlen_k)
    hi = tl.maximum(hi, 0)
    lo = (lo // BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, hi)
    full_lo = tl.maximum(full_lo, lo)
    full_hi = tl.maximum((full_hi // BLOCK_N) * BLOCK_N, full_lo)
    return lo, full_lo, full_hi, hi


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------
@triton.jit
def _fwd_inner(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn,
               start_n, end_n, key_pos_of_row, offs_d, seqlen_k,
               sm_scale, softcap, slope_log2, window_left, window_right,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
               MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over key blocks [start_n, end_n); MASKED edges check every element."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    for n0 in range(start_n, end_n, BLOCK_N):
        cols = n0 + offs_n
        if MASKED:
            kv_mask = (cols < seqlen_k)[:, None] & d_ok[None, :]
        else:
            kv_mask = d_ok[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s, _ = _scores(qk, key_pos_of_row[:, None], cols[None, :], seqlen_k, sm_scale, softcap,
                       slope_log2[:, None], window_left, window_right,
                       MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED:
            # A row with nothing visible yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_shift = m_new
        p = tl.exp2(s - m_shift[:, None])
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "window_left", "window_right"])
def _attn_fwd(Q, K, V, OUT, LSE, O_PART, LSE_PART,
              CU_SEQLENS_Q, CU_SEQLENS_K, SEQLENS_K, BATCH_IDX, ALIBI_SLOPES,
              stride_qb, stride_qs, stride_qh,
              stride_kb, stride_ks, stride_kh,
              stride_vb, stride_vs, stride_vh,
              stride_ob, stride_os, stride_oh,
              stride_lb, stride_lh,
              stride_ab,
              nheads_prog, seqlen_q, seqlen_k,
              sm_scale, softcap, window_left, window_right,
              GROUP: tl.constexpr,  # query heads per KV head
              PACK_GQA: tl.constexpr,  # rows of one program span the GROUP heads (decode)
              NUM_SPLITS: tl.constexpr,  # >1: write per-split partials for the combine kernel
              IS_VARLEN: tl.constexpr, HAS_SEQLENS_K: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    tl.static_assert(HEAD_DIM <= HEAD_DIM_PAD)
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16)
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    split = tl.program_id(2)
    off_b = off_bh // nheads_prog
    off_hp = off_bh % nheads_prog  # KV head when PACK_GQA, query head otherwise
    ROWS_PER_POS: tl.constexpr = GROUP if PACK_GQA else 1

    q_start = 0
    k_start = 0
    if IS_VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + off_b)
        seqlen_q = tl.load(CU_SEQLENS_Q + off_b + 1) - q_start
        k_start = tl.load(CU_SEQLENS_K + off_b)
        seqlen_k = tl.load(CU_SEQLENS_K + off_b + 1) - k_start
    elif HAS_SEQLENS_K:
        # seqlen_k is the cache length here: never read past it, whatever the caller passed.
        seqlen_k = tl.minimum(tl.load(SEQLENS_K + off_b), seqlen_k)
    if start_m * BLOCK_M >= seqlen_q * ROWS_PER_POS:
        return
    off_bk = off_b
    if HAS_BATCH_IDX:
        off_bk = tl.load(BATCH_IDX + off_b)
    if PACK_GQA:
        off_hk = off_hp
        head0 = off_hp * GROUP
    else:
        off_hk = off_hp // GROUP
        head0 = off_hp

    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pos = rows // ROWS_PER_POS  # query index within the sequence
    head = head0 + rows % ROWS_PER_POS  # query head of each row
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_ok = pos < seqlen_q
    d_ok = offs_d < HEAD_DIM

    q_ptrs = (Q + off_b * stride_qb + q_start * stride_qs
              + pos[:, None] * stride_qs + head[:, None] * stride_qh + offs_d[None, :])
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + off_bk * stride_kb + k_start * stride_ks + off_hk * stride_kh
    v_base = V + off_bk * stride_vb + k_start * stride_vs + off_hk * stride_vh

    key_pos_of_row = pos + (seqlen_k - seqlen_q)
    if ALIBI:
        slope_log2 = tl.load(ALIBI_SLOPES + off_b * stride_ab + head).to(tl.float32) * LOG2E
    else:
        slope_log2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_lo_pos = (start_m * BLOCK_M) // ROWS_PER_POS + seqlen_k - seqlen_q
    row_hi_pos = (start_m * BLOCK_M + BLOCK_M - 1) // ROWS_PER_POS + seqlen_k - seqlen_q
    lo, full_lo, full_hi, hi = _key_block_bounds(row_lo_pos, row_hi_pos, seqlen_k,
                                                 window_left, window_right,
                                                 BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if NUM_SPLITS > 1:
        blocks_per_split = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), NUM_SPLITS)
        split_lo = lo + split * blocks_per_split * BLOCK_N
        split_hi = tl.minimum(split_lo + blocks_per_split * BLOCK_N, hi)
        lo = tl.minimum(split_lo, hi)
        hi = tl.maximum(split_hi, lo)
        full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    # Leading masked edge, mask-free middle, trailing masked edge.
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, stride_ks, stride_vs,
                               lo, full_lo, key_pos_of_row, offs_d, seqlen_k,
                               sm_scale, softcap, slope_log2, window_left, window_right,
                               BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, HAS_LEFT, HAS_RIGHT,
                               SOFTCAP, ALIBI, DOT_PRECISION)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, stride_ks, stride_vs,
                               full_lo, full_hi, key_pos_of_row, offs_d, seqlen_k,
                               sm_scale, softcap, slope_log2, window_left, window_right,
                               BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, HAS_LEFT, HAS_RIGHT,
                               SOFTCAP, ALIBI, DOT_PRECISION)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, stride_ks, stride_vs,
                               full_hi, hi, key_pos_of_row, offs_d, seqlen_k,
                               sm_scale, softcap, slope_log2, window_left, window_right,
                               BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, HAS_LEFT, HAS_RIGHT,
                               SOFTCAP, ALIBI, DOT_PRECISION)

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = (m_i + tl.log2(l_safe)) / LOG2E
    out_mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS > 1:
        # Partials are (splits, batch, heads_q, max_seqlen_q, HEAD_DIM_PAD) fp32, contiguous.
        nheads_q = nheads_prog * GROUP if PACK_GQA else nheads_prog
        max_sq = tl.num_programs(0) * BLOCK_M // ROWS_PER_POS
        part_row = ((split * tl.num_programs(1) // nheads_prog + off_b) * nheads_q + head) * max_sq + pos
        tl.store(O_PART + part_row[:, None] * HEAD_DIM_PAD + offs_d[None, :], out, mask=out_mask)
        tl.store(LSE_PART + part_row, tl.where(empty, float("-inf"), lse), mask=row_ok)
    else:
        o_ptrs = (OUT + off_b * stride_ob + q_start * stride_os
                  + pos[:, None] * stride_os + head[:, None] * stride_oh + offs_d[None, :])
        tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=out_mask)
        tl.store(LSE + off_b * stride_lb + head * stride_lh + q_start + pos,
                 tl.where(empty, float("inf"), lse), mask=row_ok)


@triton.jit
def _combine_splits(O_PART, LSE_PART, OUT, LSE,
                    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                    nheads_q, seqlen_q, max_sq, batch,
                    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                    BLOCK_M: tl.constexpr):
    """Merge per-split (out, lse) partials: weights exp(lse_s - lse), lse = logsumexp_s(lse_s)."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // nheads_q
    off_h = off_bh % nheads_q
    pos = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_ok = pos < seqlen_q
    offs_s = tl.arange(0, NUM_SPLITS)
    part_rows = ((offs_s[:, None] * batch + off_b) * nheads_q + off_h) * max_sq + pos[None, :]
    lse_s = tl.load(LSE_PART + part_rows, mask=row_ok[None, :], other=float("-inf"))
    lse_max = tl.max(lse_s, 0)
    shift = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.exp2((lse_s - shift[None, :]) * LOG2E)
    w_sum = tl.sum(w, 0)
    empty = w_sum == 0.0
    w = w / tl.where(empty, 1.0, w_sum)[None, :]
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    for s in range(NUM_SPLITS):
        row = ((s * batch + off_b) * nheads_q + off_h) * max_sq + pos
        o_s = tl.load(O_PART + row[:, None] * HEAD_DIM_PAD + offs_d[None, :],
                      mask=row_ok[:, None], other=0.0)
        w_s = tl.sum(tl.where(offs_s[:, None] == s, w, 0.0), 0)
        acc += o_s * w_s[:, None]
    lse = tl.where(empty, float("inf"), shift + tl.log2(tl.where(empty, 1.0, w_sum)) / LOG2E)
    o_ptrs = OUT + off_b * stride_ob + pos[:, None] * stride_os + off_h * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, acc.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :])
    tl.store(LSE + off_b * stride_lb + off_h * stride_lh + pos, lse, mask=row_ok)


# --------------------------------------------------------------------------------------
# Backward: delta = rowsum(dO * O), then dK/dV per key block, then dQ per query block.
# --------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["seqlen_q"])
def _bwd_delta(OUT, DO, DELTA, CU_SEQLENS_Q,
               stride_ob, stride_os, stride_oh, stride_dob, stride_dos, stride_doh,
               stride_lb, stride_lh, nheads_q, seqlen_q,
               IS_VARLEN: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
               BLOCK_M: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // nheads_q
    off_h = off_bh % nheads_q
    q_start = 0
    if IS_VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + off_b)
        seqlen_q = tl.load(CU_SEQLENS_Q + off_b + 1) - q_start
    pos = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (pos < seqlen_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    rows = q_start + pos
    o = tl.load(OUT + off_b * stride_ob + off_h * stride_oh + rows[:, None] * stride_os + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + rows[:, None] * stride_dos
                 + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + off_b * stride_lb + off_h * stride_lh + rows, tl.sum(o * do, 1),
             mask=pos < seqlen_q)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                    stride_qs, stride_dos, start_m, end_m, cols, offs_d, seqlen_q, seqlen_k,
                    sm_scale, softcap, slope_log2, window_left, window_right,
                    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key block over query blocks [start_m, end_m) (transposed tiles)."""
    offs_m = tl.arange(0, BLOCK_M)
    d_ok = offs_d < HEAD_DIM
    for m0 in range(start_m, end_m, BLOCK_M):
        pos = m0 + offs_m
        row_ok = pos < seqlen_q
        q = tl.load(q_base + pos[:, None] * stride_qs + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        # Rows past the end get lse = +inf, hence p = 0, and q = do = 0: they add nothing.
        lse2 = tl.load(lse_base + pos, mask=row_ok, other=float("inf")) * LOG2E
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        key_pos_of_row = pos + (seqlen_k - seqlen_q)
        sT, tT = _scores(qkT, key_pos_of_row[None, :], cols[:, None], seqlen_k, sm_scale,
                         softcap, slope_log2, window_left, window_right,
                         MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI)
        pT = tl.exp2(sT - lse2[None, :])
        do = tl.load(do_base + pos[:, None] * stride_dos + offs_d[None, :],
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        delta = tl.load(delta_base + pos, mask=row_ok, other=0.0)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        if SOFTCAP:
            dsT = dsT * (1.0 - tT * tT)
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "window_left", "window_right"])
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES,
              stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
              stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
              stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
              stride_lb, stride_lh, stride_ab,
              nheads_k, seqlen_q, seqlen_k, sm_scale, softcap, window_left, window_right,
              GROUP: tl.constexpr, IS_VARLEN: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    start_n = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // nheads_k
    off_hk = off_bh % nheads_k
    q_start = 0
    k_start = 0
    if IS_VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + off_b)
        seqlen_q = tl.load(CU_SEQLENS_Q + off_b + 1) - q_start
        k_start = tl.load(CU_SEQLENS_K + off_b)
        seqlen_k = tl.load(CU_SEQLENS_K + off_b + 1) - k_start
    n0 = start_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    kv_mask = (cols < seqlen_k)[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(K + off_b * stride_kb + off_hk * stride_kh + (k_start + cols)[:, None] * stride_ks
                + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + off_b * stride_vb + off_hk * stride_vh + (k_start + cols)[:, None] * stride_vs
                + offs_d[None, :], mask=kv_mask, other=0.0)

    # Query rows that can see this key block: key j is seen by row i iff
    # j - off - right <= i <= j - off + left, with off = seqlen_k - seqlen_q.
    off = seqlen_k - seqlen_q
    lo = 0
    full_lo = 0
    hi = seqlen_q
    full_hi = seqlen_q
    if HAS_RIGHT:
        lo = tl.maximum(n0 - off - window_right, 0)
        full_lo = tl.maximum(n0 + BLOCK_N - 1 - off - window_right, 0)
    if HAS_LEFT:
        hi = tl.minimum(n0 + BLOCK_N - 1 - off + window_left + 1, seqlen_q)
        full_hi = tl.minimum(n0 - off + window_left + 1, seqlen_q)
    hi = tl.maximum(hi, 0)
    lo = (lo // BLOCK_M) * BLOCK_M
    full_lo = tl.maximum(tl.minimum(tl.cdiv(full_lo, BLOCK_M) * BLOCK_M, hi), lo)
    full_hi = tl.maximum((full_hi // BLOCK_M) * BLOCK_M, full_lo)
    # Key columns past seqlen_k compute garbage dk/dv rows that are never stored, and rows
    # past seqlen_q contribute zero, so the middle range needs no element mask at all.

    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    for g in range(GROUP):
        off_hq = off_hk * GROUP + g
        q_base = Q + off_b * stride_qb + off_hq * stride_qh + q_start * stride_qs
        do_base = DO + off_b * stride_dob + off_hq * stride_doh + q_start * stride_dos
        lse_base = LSE + off_b * stride_lb + off_hq * stride_lh + q_start
        delta_base = DELTA + off_b * stride_lb + off_hq * stride_lh + q_start
        if ALIBI:
            slope_log2 = tl.load(ALIBI_SLOPES + off_b * stride_ab + off_hq).to(tl.float32) * LOG2E
        else:
            slope_log2 = 0.0
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                 stride_qs, stride_dos, lo, full_lo, cols, offs_d,
                                 seqlen_q, seqlen_k, sm_scale, softcap, slope_log2,
                                 window_left, window_right, BLOCK_M, HEAD_DIM,
                                 True, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, DOT_PRECISION)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                 stride_qs, stride_dos, full_lo, full_hi, cols, offs_d,
                                 seqlen_q, seqlen_k, sm_scale, softcap, slope_log2,
                                 window_left, window_right, BLOCK_M, HEAD_DIM,
                                 False, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, DOT_PRECISION)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                 stride_qs, stride_dos, full_hi, hi, cols, offs_d,
                                 seqlen_q, seqlen_k, sm_scale, softcap, slope_log2,
                                 window_left, window_right, BLOCK_M, HEAD_DIM,
                                 True, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, DOT_PRECISION)
    dk *= sm_scale
    tl.store(DK + off_b * stride_dkb + off_hk * stride_dkh + (k_start + cols)[:, None] * stride_dks
             + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + off_b * stride_dvb + off_hk * stride_dvh + (k_start + cols)[:, None] * stride_dvs
             + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                  start_n, end_n, key_pos_of_row, offs_d, seqlen_k,
                  sm_scale, softcap, slope_log2, window_left, window_right,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                  MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                  SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [start_n, end_n)."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    for n0 in range(start_n, end_n, BLOCK_N):
        cols = n0 + offs_n
        if MASKED:
            kv_mask = (cols < seqlen_k)[:, None] & d_ok[None, :]
        else:
            kv_mask = d_ok[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s, t = _scores(qk, key_pos_of_row[:, None], cols[None, :], seqlen_k, sm_scale, softcap,
                       slope_log2[:, None], window_left, window_right,
                       MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI)
        p = tl.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "window_left", "window_right"])
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES,
            stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
            stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
            stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh, stride_ab,
            nheads_q, seqlen_q, seqlen_k, sm_scale, softcap, window_left, window_right,
            GROUP: tl.constexpr, IS_VARLEN: tl.constexpr,
            HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
            SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
            HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // nheads_q
    off_h = off_bh % nheads_q
    off_hk = off_h // GROUP
    q_start = 0
    k_start = 0
    if IS_VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + off_b)
        seqlen_q = tl.load(CU_SEQLENS_Q + off_b + 1) - q_start
        k_start = tl.load(CU_SEQLENS_K + off_b)
        seqlen_k = tl.load(CU_SEQLENS_K + off_b + 1) - k_start
    m0 = start_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    pos = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_ok = pos < seqlen_q
    mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    rows = q_start + pos
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + rows[:, None] * stride_qs + offs_d[None, :],
                mask=mask, other=0.0)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + rows[:, None] * stride_dos
                 + offs_d[None, :], mask=mask, other=0.0)
    lse2 = tl.load(LSE + off_b * stride_lb + off_h * stride_lh + rows, mask=row_ok,
                   other=float("inf")) * LOG2E
    delta = tl.load(DELTA + off_b * stride_lb + off_h * stride_lh + rows, mask=row_ok, other=0.0)
    if ALIBI:
        slope_log2 = tl.load(ALIBI_SLOPES + off_b * stride_ab + off_h + 0 * pos).to(tl.float32) * LOG2E
    else:
        slope_log2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_base = K + off_b * stride_kb + k_start * stride_ks + off_hk * stride_kh
    v_base = V + off_b * stride_vb + k_start * stride_vs + off_hk * stride_vh
    key_pos_of_row = pos + (seqlen_k - seqlen_q)
    lo, full_lo, full_hi, hi = _key_block_bounds(m0 + seqlen_k - seqlen_q,
                                                 m0 + BLOCK_M - 1 + seqlen_k - seqlen_q,
                                                 seqlen_k, window_left, window_right,
                                                 BLOCK_N, HAS_LEFT, HAS_RIGHT)
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
                       lo, full_lo, key_pos_of_row, offs_d, seqlen_k, sm_scale, softcap,
                       slope_log2, window_left, window_right, BLOCK_N, HEAD_DIM,
                       True, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, DOT_PRECISION)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
                       full_lo, full_hi, key_pos_of_row, offs_d, seqlen_k, sm_scale, softcap,
                       slope_log2, window_left, window_right, BLOCK_N, HEAD_DIM,
                       False, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, DOT_PRECISION)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
                       full_hi, hi, key_pos_of_row, offs_d, seqlen_k, sm_scale, softcap,
                       slope_log2, window_left, window_right, BLOCK_N, HEAD_DIM,
                       True, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI, DOT_PRECISION)
    dq *= sm_scale
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + rows[:, None] * stride_dqs + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------
# Launch configuration: tile shapes, warps and pipeline depth per kernel.
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def launch_kwargs(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n,
                "num_warps": self.num_warps, "num_stages": self.num_stages}


def _head_dim_pad(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _fwd_config(head_dim_pad: int, dtype: torch.dtype) -> TileConfig:
    if INTERPRETING:
        # The interpreter's cost is per operation, not per element: few large tiles run fastest.
        return TileConfig(64, 64, 4, 1)
    wide = dtype == torch.float32
    if IS_HIP:
        # MI200/MI300: 64-wide wavefronts and 64 KB LDS favour fewer warps and shallow pipelines.
        if head_dim_pad <= 64:
            return TileConfig(128, 64, 4, 1)
        return TileConfig(128 if head_dim_pad <= 128 and not wide else 64, 32, 4, 1)
    major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 8
    if head_dim_pad <= 64:
        return TileConfig(128, 64 if wide else 128, 4 if wide else 8, 3)
    if head_dim_pad <= 128:
        if wide:
            return TileConfig(64, 32, 4, 2)
        # 128x128 K/V tiles x 3 stages would need ~228 KB of shared memory: over the 227 KB limit.
        return TileConfig(128, 64, 8, 3 if major >= 9 else 2)
    # 256: register file and shared memory bound the tiles.
    return TileConfig(64, 32 if wide else 64, 4 if wide else 8, 2)


def _bwd_config(head_dim_pad: int, dtype: torch.dtype) -> TileConfig:
    if INTERPRETING:
        return TileConfig(64, 64, 4, 1)
    wide = dtype == torch.float32
    if IS_HIP:
        return TileConfig(32 if head_dim_pad > 64 else 64, 64 if head_dim_pad <= 64 else 32, 4, 1)
    if head_dim_pad <= 64:
        return TileConfig(64, 64, 4, 2)
    if head_dim_pad <= 128:
        return TileConfig(32 if wide else 64, 64 if not wide else 32, 4 if wide else 8, 2)
    return TileConfig(32, 32, 4, 1) if wide else TileConfig(64, 32, 8, 1)


def _fwd_candidates(head_dim_pad: int, dtype: torch.dtype) -> list[TileConfig]:
    """Configs the tuner times on large problems, pruned to what fits this head dim."""
    if INTERPRETING or dtype == torch.float32:
        return [_fwd_config(head_dim_pad, dtype)]
    if IS_HIP:
        cands = [TileConfig(bm, bn, w, 1) for bm in (64, 128) for bn in (32, 64) for w in (4, 8)]
    else:
        cands = [TileConfig(128, 64, 8, 3), TileConfig(128, 128, 8, 3), TileConfig(128, 64, 4, 3),
                 TileConfig(64, 64, 4, 3), TileConfig(128, 128, 8, 2), TileConfig(128, 64, 8, 4),
                 TileConfig(64, 128, 4, 3), TileConfig(128, 32, 4, 3)]
    return [c for c in cands if _fits(c, head_dim_pad)]


def _bwd_candidates(head_dim_pad: int, dtype: torch.dtype) -> list[TileConfig]:
    if INTERPRETING or dtype == torch.float32:
        return [_bwd_config(head_dim_pad, dtype)]
    if IS_HIP:
        cands = [TileConfig(bm, bn, 4, 1) for bm in (32, 64) for bn in (32, 64)]
    else:
        cands = [TileConfig(64, 64, 4, 2), TileConfig(64, 64, 8, 2), TileConfig(64, 128, 8, 2),
                 TileConfig(128, 64, 8, 2), TileConfig(32, 128, 4, 2), TileConfig(128, 32, 4, 2),
                 TileConfig(64, 64, 4, 1), TileConfig(64, 128, 8, 1)]
    # Backward holds two fp32 accumulators and recomputes p: at 256 keep tiles small.
    return [c for c in cands if head_dim_pad < 256 or (c.block_m * c.block_n <= 4096
                                                       and c.num_stages == 1)] \
        or [_bwd_config(head_dim_pad, dtype)]


def _fits(cfg: TileConfig, head_dim_pad: int) -> bool:
    """Prune tiles whose fp32 accumulators or K/V stages cannot fit one SM."""
    if head_dim_pad >= 256 and (cfg.block_n > 64 or cfg.num_stages > 2):
        return False
    if head_dim_pad >= 128 and cfg.block_m == 128 and cfg.num_warps < 8:
        return False
    return True


_TUNED: dict[tuple, TileConfig] = {}
AUTOTUNE = os.environ.get("FLASH_KERNELS_AUTOTUNE", "1") != "0"
TUNE_LOG = os.environ.get("FLASH_KERNELS_TUNE_LOG", "0") == "1"
_TUNE_MIN_WORK = 1 << 28  # q-rows x k-rows x heads below which the default config is used


def _choose(kind: str, key: tuple, default: TileConfig, candidates: list[TileConfig], work: int,
            run) -> TileConfig:
    """Pick a tile config: the default for small problems; measured once per key otherwise."""
    if not AUTOTUNE or INTERPRETING or work < _TUNE_MIN_WORK or len(candidates) <= 1:
        return default
    full_key = (kind, *key)
    if full_key not in _TUNED:
        best, best_ms = default, float("inf")
        timings = []
        for cfg in candidates:
            try:
                ms = triton.testing.do_bench(lambda cfg=cfg: run(cfg), warmup=5, rep=20)
            except (triton.runtime.errors.OutOfResources, triton.runtime.errors.PTXASError):
                continue
            timings.append((ms, cfg))
            if ms < best_ms:
                best, best_ms = cfg, ms
        _TUNED[full_key] = best
        if TUNE_LOG:
            ranked = ", ".join(f"{c.block_m}x{c.block_n}w{c.num_warps}s{c.num_stages}={ms:.3f}"
                               for ms, c in sorted(timings, key=lambda t: t[0])[:6])
            print(f"flash_kernels tune {full_key}: default "
                  f"{default.block_m}x{default.block_n}w{default.num_warps}s{default.num_stages}; "
                  f"best {ranked}", flush=True)
    return _TUNED[full_key]


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


def decode_num_splits(batch: int, nheads_k: int, seqlen_q_rows: int, max_seqlen_k: int,
                      block_m: int = 16) -> int:
    """Split the keys until about four programs per SM exist, keeping >= 512 keys per split.

    Decode reads the cache once and is bandwidth-bound: one program per (batch, head) leaves
    most SMs idle or one program deep, too few loads in flight to cover memory latency.
    """
    if INTERPRETING:
        return 2 if max_seqlen_k > 64 else 1
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    programs = batch * nheads_k * max(1, math.ceil(seqlen_q_rows / block_m))
    target = 4 * sms
    if programs >= target:
        return 1
    splits = min(math.ceil(target / programs), max(1, max_seqlen_k // 512), 128)
    return triton.next_power_of_2(splits) if splits > 1 else 1
