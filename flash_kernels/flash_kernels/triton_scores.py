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

