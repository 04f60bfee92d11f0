"""Backward kernels: delta = rowsum(dO * O), then dK/dV per key block, then dQ per query block.

No atomics: every output element is written by exactly one program (dK/dV sum a GQA group's
query heads in registers), so gradients are bitwise reproducible run to run.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_scores import LOG2E, _dropout_keep, _key_block_bounds, _scores, _sequence_bounds


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
                    seed, rng_head, rng_sk, dropout_p, dropout_scale,
                    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key block over query blocks [start_m, end_m) (transposed tiles).

    With dropout (Z the keep mask, P the probabilities before dropout): dV += (P*Z)^T dO, the
    1/(1-p) factor applied once by the caller; dS = P * (Z * dP / (1-p) - delta).
    """
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
        sT, tT = _scores(qkT, key_pos_of_row[None, :], cols[:, None], seqlen_k, 0, sm_scale,
                         softcap, slope_log2, window_left, window_right,
                         MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI)
        pT = tl.exp2(sT - lse2[None, :])
        do = tl.load(do_base + pos[:, None] * stride_dos + offs_d[None, :],
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        delta = tl.load(delta_base + pos, mask=row_ok, other=0.0)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        if DROPOUT:
            keepT = _dropout_keep(seed, ((rng_head + pos) * rng_sk)[None, :], cols[:, None],
                                  dropout_p)
            dv = tl.dot(tl.where(keepT, pT, 0.0).to(do.dtype), do, dv,
                        input_precision=DOT_PRECISION)
            dpT = tl.where(keepT, dpT * dropout_scale, 0.0)
        else:
            dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        if SOFTCAP:
            dsT = dsT * (1.0 - tT * tT)
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "window_left", "window_right", "rng_sq",
                               "rng_sk"])
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES, SEED,
              stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
              stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
              stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
              stride_lb, stride_lh, stride_ab,
              nheads_k, seqlen_q, seqlen_k, sm_scale, softcap, window_left, window_right,
              dropout_p, dropout_scale, rng_sq, rng_sk,
              GROUP: tl.constexpr, IS_VARLEN: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    start_n = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // nheads_k
    off_hk = off_bh % nheads_k
    q_start, k_start, seqlen_q, seqlen_k = _sequence_bounds(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, seqlen_q,
                                                            seqlen_k, IS_VARLEN)
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
    if DROPOUT:
        seed = tl.load(SEED)
    else:
        seed = 0
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
        rng_head = (off_b * nheads_k * GROUP + off_hq).to(tl.int64) * rng_sq
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                 stride_qs, stride_dos, lo, full_lo, cols, offs_d,
                                 seqlen_q, seqlen_k, sm_scale, softcap, slope_log2,
                                 window_left, window_right, seed, rng_head, rng_sk, dropout_p,
                                 dropout_scale, BLOCK_M, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT,
                                 SOFTCAP, ALIBI, DROPOUT, DOT_PRECISION)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                 stride_qs, stride_dos, full_lo, full_hi, cols, offs_d,
                                 seqlen_q, seqlen_k, sm_scale, softcap, slope_log2,
                                 window_left, window_right, seed, rng_head, rng_sk, dropout_p,
                                 dropout_scale, BLOCK_M, HEAD_DIM, False, HAS_LEFT, HAS_RIGHT,
                                 SOFTCAP, ALIBI, DROPOUT, DOT_PRECISION)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                 stride_qs, stride_dos, full_hi, hi, cols, offs_d,
                                 seqlen_q, seqlen_k, sm_scale, softcap, slope_log2,
                                 window_left, window_right, seed, rng_head, rng_sk, dropout_p,
                                 dropout_scale, BLOCK_M, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT,
                                 SOFTCAP, ALIBI, DROPOUT, DOT_PRECISION)
    dk *= sm_scale
    if DROPOUT:
        dv *= dropout_scale
    tl.store(DK + off_b * stride_dkb + off_hk * stride_dkh + (k_start + cols)[:, None] * stride_dks
             + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + off_b * stride_dvb + off_hk * stride_dvh + (k_start + cols)[:, None] * stride_dvs
             + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                  start_n, end_n, key_pos_of_row, offs_d, seqlen_k,
                  sm_scale, softcap, slope_log2, window_left, window_right,
                  seed, rng_rows, dropout_p, dropout_scale,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                  MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                  SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
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
        s, t = _scores(qk, key_pos_of_row[:, None], cols[None, :], seqlen_k, 0, sm_scale, softcap,
                       slope_log2[:, None], window_left, window_right,
                       MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI)
        p = tl.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        if DROPOUT:
            keep = _dropout_keep(seed, rng_rows[:, None], cols[None, :], dropout_p)
            dp = tl.where(keep, dp * dropout_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "window_left", "window_right", "rng_sq",
                               "rng_sk"])
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES, SEED,
            stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
            stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
            stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh, stride_ab,
            nheads_q, seqlen_q, seqlen_k, sm_scale, softcap, window_left, window_right,
            dropout_p, dropout_scale, rng_sq, rng_sk,
            GROUP: tl.constexpr, IS_VARLEN: tl.constexpr,
            HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
            SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
            HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // nheads_q
    off_h = off_bh % nheads_q
    off_hk = off_h // GROUP
    q_start, k_start, seqlen_q, seqlen_k = _sequence_bounds(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, seqlen_q,
                                                            seqlen_k, IS_VARLEN)
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
                                                 seqlen_k, 0, window_left, window_right,
                                                 BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if DROPOUT:
        seed = tl.load(SEED)
        rng_rows = ((off_b * nheads_q + off_h).to(tl.int64) * rng_sq + pos) * rng_sk
    else:
        seed = 0
        rng_rows = pos.to(tl.int64)
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
                       lo, full_lo, key_pos_of_row, offs_d, seqlen_k, sm_scale, softcap,
                       slope_log2, window_left, window_right, seed, rng_rows, dropout_p,
                       dropout_scale, BLOCK_N, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                       ALIBI, DROPOUT, DOT_PRECISION)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
                       full_lo, full_hi, key_pos_of_row, offs_d, seqlen_k, sm_scale, softcap,
                       slope_log2, window_left, window_right, seed, rng_rows, dropout_p,
                       dropout_scale, BLOCK_N, HEAD_DIM, False, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                       ALIBI, DROPOUT, DOT_PRECISION)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
                       full_hi, hi, key_pos_of_row, offs_d, seqlen_k, sm_scale, softcap,
                       slope_log2, window_left, window_right, seed, rng_rows, dropout_p,
                       dropout_scale, BLOCK_N, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                       ALIBI, DROPOUT, DOT_PRECISION)
    dq *= sm_scale
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + rows[:, None] * stride_dqs + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=mask)

