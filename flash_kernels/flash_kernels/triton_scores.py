"""Score and visibility helpers shared by every Triton attention kernel (forward, backward, decode).

Conventions (those of flash_attn): query row i sits at key position ``i + seqlen_k - seqlen_q``
(bottom-right alignment), so a window (left, right) keeps key j when
``i + off - left <= j <= i + off + right``; causal is right = 0; a negative bound is unlimited.
softcap applies ``softcap * tanh(score * scale / softcap)`` before the ALiBi bias
``-slope * |i + off - j|``. The kernels work in base 2 (exp2 is the native instruction).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # 1/ln(2)


@triton.jit
def _scores(qk, key_pos_of_row, cols, seqlen_k, key_lo, sm_scale, softcap, slope_log2,
            window_left, window_right,
            MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
            SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """Turn raw q.k (fp32, rows x cols) into base-2 logits; also return tanh for softcap's grad.

    ``key_pos_of_row`` is (rows, 1) and ``cols`` (1, cols) (or the transposed pair), so the
    same code serves the forward tile and the transposed dK/dV tile. Keys before ``key_lo``
    (a left-padded KV cache's first valid slot; 0 otherwise) are masked like those past the end.
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
        keep = (cols < seqlen_k) & (cols >= key_lo)
        if HAS_LEFT:
            keep = keep & (cols >= key_pos_of_row - window_left)
        if HAS_RIGHT:
            keep = keep & (cols <= key_pos_of_row + window_right)
        s = tl.where(keep, s, float("-inf"))
    return s, t


@triton.jit
def _key_block_bounds(row_lo_pos, row_hi_pos, seqlen_k, key_lo, window_left, window_right,
                      BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Key range seen by query key-positions [row_lo_pos, row_hi_pos], split into masked edges.

    Keys lie in [key_lo, seqlen_k). Returns (lo, full_lo, full_hi, hi), all multiples of
    BLOCK_N except hi: blocks in [full_lo, full_hi) need no mask at all; [lo, full_lo) and
    [full_hi, hi) do.
    """
    lo = key_lo
    full_lo = key_lo
    if HAS_LEFT:
        lo = tl.maximum(row_lo_pos - window_left, key_lo)
        full_lo = tl.maximum(row_hi_pos - window_left, key_lo)
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



@triton.jit
def _sequence_bounds(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    """(q_start, k_start, seqlen_q, seqlen_k) of sequence off_b: its packed rows in the varlen
    form, the whole (batch-strided) tensors otherwise."""
    q_start = 0
    k_start = 0
    if IS_VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + off_b)
        seqlen_q = tl.load(CU_SEQLENS_Q + off_b + 1) - q_start
        k_start = tl.load(CU_SEQLENS_K + off_b)
        seqlen_k = tl.load(CU_SEQLENS_K + off_b + 1) - k_start
    return q_start, k_start, seqlen_q, seqlen_k


@triton.jit
def _kv_rows(n0, offs_n, seqlen_k, table_row, num_pages, stride_page, stride_slot,
             PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Element offsets of key rows ``n0 + offs_n`` of one sequence and head, and which of them
    sit on an out-of-range page id.

    Dense (PAGE_SIZE = 0): rows are ``stride_slot`` apart from the sequence's base pointer.
    Paged: key j lives in page ``table_row[j // PAGE_SIZE]`` at slot ``j % PAGE_SIZE``, offsets
    from the head's base in the page pool. A page id outside [0, num_pages) is read as page 0
    (never out of bounds) and flagged, so the caller can poison that row's result. Callers keep
    n0 < seqlen_k <= the table's capacity, so the table itself is never over-read.
    """
    cols = n0 + offs_n
    # One return: compiled Triton wants every return of a function to have one type, even
    # across constexpr branches.
    if PAGE_SIZE == 0:
        rows = cols * stride_slot
        bad = cols < 0
    elif PAGE_SIZE % BLOCK_N == 0:
        # The whole key block sits in one page: one id, contiguous rows.
        page = tl.load(table_row + n0 // PAGE_SIZE)
        page_bad = (page < 0) | (page >= num_pages)
        page = tl.where(page_bad, 0, page)
        rows = page.to(tl.int64) * stride_page + (n0 % PAGE_SIZE + offs_n) * stride_slot
        bad = (offs_n < 0) | page_bad
    else:
        pages = tl.load(table_row + cols // PAGE_SIZE, mask=cols < seqlen_k, other=0)
        bad = (pages < 0) | (pages >= num_pages)
        pages = tl.where(bad, 0, pages)
        rows = pages.to(tl.int64) * stride_page + (cols % PAGE_SIZE) * stride_slot
    return rows, bad


@triton.jit
def _dropout_keep(seed, rng_rows, cols, dropout_p):
    """Which elements of a score tile survive dropout: Philox(seed, counter) >= dropout_p.

    The counter of element (b, h, i, j) is ``((b * nheads + h) * rng_sq + i) * rng_sk + j``
    (``rng_rows`` holds everything but ``+ j``, int64), so the forward, both backward kernels
    and the S_dmask kernel draw the same number for the same element whatever their tiling.
    """
    return tl.rand(seed, rng_rows + cols) >= dropout_p
