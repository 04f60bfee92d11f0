"""Forward kernels: the attention forward with its log-sum-exp (dense, varlen, KV cache, paged),
the split-KV combine, and the dropout-signed probabilities flash_attn returns as S_dmask."""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_scores import LOG2E, _dropout_keep, _key_block_bounds, _kv_rows, _scores, _sequence_bounds


@triton.jit
def _fwd_inner(acc, m_i, l_i, q, k_base, v_base, stride_kb, stride_ks, stride_vb, stride_vs,
               table_row, num_pages, start_n, end_n, key_pos_of_row, offs_d, seqlen_k, key_lo,
               sm_scale, softcap, slope_log2, window_left, window_right,
               seed, rng_rows, dropout_p,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
               MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, PAGE_SIZE: tl.constexpr,
               DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over key blocks [start_n, end_n); MASKED edges check every element.

    With dropout, l_i sums the probabilities before dropout (the softmax normaliser) while acc
    sums only the kept ones; the caller applies the 1/(1-p) rescale once at the end.
    """
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    for n0 in range(start_n, end_n, BLOCK_N):
        cols = n0 + offs_n
        if MASKED:
            # Slots before key_lo (a left-padded cache) may hold anything, NaN included: never load
            # them, since p = 0 times a NaN value is NaN.
            kv_mask = ((cols < seqlen_k) & (cols >= key_lo))[:, None] & d_ok[None, :]
        else:
            kv_mask = d_ok[None, :]
        k_rows, bad_page = _kv_rows(n0, offs_n, seqlen_k, table_row, num_pages, stride_kb,
                                    stride_ks, PAGE_SIZE, BLOCK_N)
        k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s, _ = _scores(qk, key_pos_of_row[:, None], cols[None, :], seqlen_k, key_lo, sm_scale,
                       softcap, slope_log2[:, None], window_left, window_right,
                       MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI)
        if PAGE_SIZE > 0:
            # A bad page id turns the row's result into NaN rather than into someone else's keys.
            s = tl.where(bad_page[None, :], float("nan"), s)
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
        if DROPOUT:
            p = tl.where(_dropout_keep(seed, rng_rows[:, None], cols[None, :], dropout_p), p, 0.0)
        v_rows, _ = _kv_rows(n0, offs_n, seqlen_k, table_row, num_pages, stride_vb, stride_vs,
                             PAGE_SIZE, BLOCK_N)
        v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "window_left", "window_right", "rng_sq",
                               "rng_sk", "num_pages"])
def _attn_fwd(Q, K, V, OUT, LSE, O_PART, LSE_PART,
              CU_SEQLENS_Q, CU_SEQLENS_K, SEQLENS_K, BATCH_IDX, LEFTPAD, BLOCK_TABLE,
              ALIBI_SLOPES, SEED,
              stride_qb, stride_qs, stride_qh,
              stride_kb, stride_ks, stride_kh,
              stride_vb, stride_vs, stride_vh,
              stride_ob, stride_os, stride_oh,
              stride_lb, stride_lh,
              stride_ab, stride_btb,
              nheads_prog, seqlen_q, seqlen_k, num_pages,
              sm_scale, softcap, window_left, window_right,
              dropout_p, dropout_scale, rng_sq, rng_sk,
              GROUP: tl.constexpr,  # query heads per KV head
              PACK_GQA: tl.constexpr,  # rows of one program span the GROUP heads (decode)
              NUM_SPLITS: tl.constexpr,  # >1: write per-split partials for the combine kernel
              IS_VARLEN: tl.constexpr, HAS_SEQLENS_K: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
              HAS_LEFTPAD: tl.constexpr,
              PAGE_SIZE: tl.constexpr,  # 0: dense K/V; else keys reach K/V through BLOCK_TABLE
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    tl.static_assert(HEAD_DIM <= HEAD_DIM_PAD)
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16)
    tl.static_assert(PAGE_SIZE % 16 == 0)
    tl.static_assert(not (DROPOUT and PACK_GQA))
    tl.static_assert(not (IS_VARLEN and HAS_SEQLENS_K))
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    split = tl.program_id(2)
    off_b = off_bh // nheads_prog
    off_hp = off_bh % nheads_prog  # KV head when PACK_GQA, query head otherwise
    ROWS_PER_POS: tl.constexpr = GROUP if PACK_GQA else 1

    q_start, k_start, seqlen_q, seqlen_k = _sequence_bounds(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, seqlen_q,
                                                            seqlen_k, IS_VARLEN)
    if HAS_SEQLENS_K:
        # seqlen_k is the cache length here: never read past it, whatever the caller passed.
        seqlen_k = tl.minimum(tl.load(SEQLENS_K + off_b), seqlen_k)
    if start_m * BLOCK_M >= seqlen_q * ROWS_PER_POS:
        return
    key_lo = 0
    if HAS_LEFTPAD:
        key_lo = tl.maximum(tl.load(LEFTPAD + off_b), 0)
    off_bk = off_b
    if HAS_BATCH_IDX:
        off_bk = tl.load(BATCH_IDX + off_b)
    if PACK_GQA:
        off_hk = off_hp
        head0 = off_hp * GROUP
    else:
        off_hk = off_hp // GROUP
        head0 = off_hp
    nheads_q = nheads_prog * GROUP if PACK_GQA else nheads_prog

    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pos = rows // ROWS_PER_POS  # query index within the sequence
    head = head0 + rows % ROWS_PER_POS  # query head of each row
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_ok = pos < seqlen_q
    d_ok = offs_d < HEAD_DIM

    q_ptrs = (Q + off_b * stride_qb + q_start * stride_qs
              + pos[:, None] * stride_qs + head[:, None] * stride_qh + offs_d[None, :])
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if PAGE_SIZE > 0:
        # Paged: a sequence's keys start at slot 0 of its first page, also in the varlen form.
        table_row = BLOCK_TABLE + off_b * stride_btb
        k_base = K + off_hk * stride_kh
        v_base = V + off_hk * stride_vh
    else:
        table_row = BLOCK_TABLE
        k_base = K + off_bk * stride_kb + k_start * stride_ks + off_hk * stride_kh
        v_base = V + off_bk * stride_vb + k_start * stride_vs + off_hk * stride_vh

    key_pos_of_row = pos + (seqlen_k - seqlen_q)
    if ALIBI:
        slope_log2 = tl.load(ALIBI_SLOPES + off_b * stride_ab + head).to(tl.float32) * LOG2E
    else:
        slope_log2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    if DROPOUT:
        seed = tl.load(SEED)
        rng_rows = ((off_b * nheads_q + head).to(tl.int64) * rng_sq + pos) * rng_sk
    else:
        seed = 0
        rng_rows = pos.to(tl.int64)
    row_lo_pos = (start_m * BLOCK_M) // ROWS_PER_POS + seqlen_k - seqlen_q
    row_hi_pos = (start_m * BLOCK_M + BLOCK_M - 1) // ROWS_PER_POS + seqlen_k - seqlen_q
    lo, full_lo, full_hi, hi = _key_block_bounds(row_lo_pos, row_hi_pos, seqlen_k, key_lo,
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
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, stride_kb, stride_ks,
                               stride_vb, stride_vs, table_row, num_pages, lo, full_lo,
                               key_pos_of_row, offs_d, seqlen_k, key_lo,
                               sm_scale, softcap, slope_log2, window_left, window_right,
                               seed, rng_rows, dropout_p,
                               BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, HAS_LEFT, HAS_RIGHT,
                               SOFTCAP, ALIBI, PAGE_SIZE, DROPOUT, DOT_PRECISION)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, stride_kb, stride_ks,
                               stride_vb, stride_vs, table_row, num_pages, full_lo, full_hi,
                               key_pos_of_row, offs_d, seqlen_k, key_lo,
                               sm_scale, softcap, slope_log2, window_left, window_right,
                               seed, rng_rows, dropout_p,
                               BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, HAS_LEFT, HAS_RIGHT,
                               SOFTCAP, ALIBI, PAGE_SIZE, DROPOUT, DOT_PRECISION)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, stride_kb, stride_ks,
                               stride_vb, stride_vs, table_row, num_pages, full_hi, hi,
                               key_pos_of_row, offs_d, seqlen_k, key_lo,
                               sm_scale, softcap, slope_log2, window_left, window_right,
                               seed, rng_rows, dropout_p,
                               BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, HAS_LEFT, HAS_RIGHT,
                               SOFTCAP, ALIBI, PAGE_SIZE, DROPOUT, DOT_PRECISION)

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    if DROPOUT:
        out = out * dropout_scale
    lse = (m_i + tl.log2(l_safe)) / LOG2E
    out_mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS > 1:
        # Partials are (splits, batch, heads_q, max_seqlen_q, HEAD_DIM_PAD) fp32, contiguous.
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
        # Columns past HEAD_DIM were never written: leave them out rather than sum garbage.
        o_s = tl.load(O_PART + row[:, None] * HEAD_DIM_PAD + offs_d[None, :],
                      mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
        w_s = tl.sum(tl.where(offs_s[:, None] == s, w, 0.0), 0)
        acc += o_s * w_s[:, None]
    lse = tl.where(empty, float("inf"), shift + tl.log2(tl.where(empty, 1.0, w_sum)) / LOG2E)
    o_ptrs = OUT + off_b * stride_ob + pos[:, None] * stride_os + off_h * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, acc.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :])
    tl.store(LSE + off_b * stride_lb + off_h * stride_lh + pos, lse, mask=row_ok)


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "window_left", "window_right", "rng_sq",
                               "rng_sk"])
def _attn_probs(Q, K, LSE, PROBS, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES, SEED,
                stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                stride_lb, stride_lh, stride_pb, stride_ph, stride_ps, stride_ab,
                nheads_q, seqlen_q, seqlen_k, probs_rows, probs_cols,
                sm_scale, softcap, window_left, window_right, dropout_p, rng_sq, rng_sk,
                GROUP: tl.constexpr, IS_VARLEN: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """S_dmask as flash_attn encodes it: the softmax probability of every (query, key), negated
    where dropout dropped it. Recomputed from q, k and the forward's lse (a testing output, so
    it costs the forward nothing). Rows and columns past a sequence's end hold 0."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // nheads_q
    off_h = off_bh % nheads_q
    off_hk = off_h // GROUP
    q_start, k_start, seqlen_q, seqlen_k = _sequence_bounds(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, seqlen_q,
                                                            seqlen_k, IS_VARLEN)
    pos = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = pos < seqlen_q
    d_ok = offs_d < HEAD_DIM
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + (q_start + pos)[:, None] * stride_qs
                + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    lse2 = tl.load(LSE + off_b * stride_lb + off_h * stride_lh + q_start + pos, mask=row_ok,
                   other=float("inf")) * LOG2E
    if ALIBI:
        slope_log2 = tl.load(ALIBI_SLOPES + off_b * stride_ab + off_h + 0 * pos).to(tl.float32) * LOG2E
    else:
        slope_log2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    seed = tl.load(SEED)
    rng_rows = ((off_b * nheads_q + off_h).to(tl.int64) * rng_sq + pos) * rng_sk
    key_pos_of_row = pos + (seqlen_k - seqlen_q)
    k_base = K + off_b * stride_kb + k_start * stride_ks + off_hk * stride_kh
    p_base = PROBS + off_b * stride_pb + off_h * stride_ph
    for n0 in range(0, probs_cols, BLOCK_N):
        cols = n0 + offs_n
        k = tl.load(k_base + cols[:, None] * stride_ks + offs_d[None, :],
                    mask=(cols < seqlen_k)[:, None] & d_ok[None, :], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s, _ = _scores(qk, key_pos_of_row[:, None], cols[None, :], seqlen_k, 0, sm_scale, softcap,
                       slope_log2[:, None], window_left, window_right,
                       True, HAS_LEFT, HAS_RIGHT, SOFTCAP, ALIBI)
        p = tl.exp2(s - lse2[:, None])  # rows past the end: lse2 = +inf, so p = 0
        p = tl.where(row_ok[:, None], p, 0.0)
        keep = _dropout_keep(seed, rng_rows[:, None], cols[None, :], dropout_p)
        tl.store(p_base + pos[:, None] * stride_ps + cols[None, :],
                 tl.where(keep, p, -p).to(PROBS.dtype.element_ty),
                 mask=(pos < probs_rows)[:, None] & (cols < probs_cols)[None, :])
