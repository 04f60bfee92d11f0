"""KV-cache preparation kernels, run before the attention kernel of flash_attn_with_kvcache:
rotary embedding of q, and the in-place append of new k (rotated) and v into a dense or paged
cache.

Rotary follows flash_attn: cos/sin are (seqlen_ro, rotary_dim / 2); the first rotary_dim
dims of each head rotate, the rest pass through. Non-interleaved (GPT-NeoX) pairs dim d with
d + rotary_dim/2; interleaved (GPT-J) pairs 2i with 2i+1. The arithmetic is fp32 and the result
is rounded to the tensor's dtype once. A position past the end of cos/sin is not rotated
(the host requires seqlen_ro >= the cache capacity, so only query rows past it can be).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotary_rows(row_ptrs, row_ok, positions, COS, SIN, stride_ro, seqlen_ro,
                 HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                 ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Rows of one token (one per head), rotated by the angles at ``positions``, in fp32."""
    HALF: tl.constexpr = ROTARY_DIM // 2
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    x = tl.load(row_ptrs[:, None] + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0).to(tl.float32)
    if INTERLEAVED:
        partner_d = offs_d ^ 1
        freq = offs_d // 2
        sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
    else:
        partner_d = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
        freq = tl.where(offs_d < HALF, offs_d, offs_d - HALF)
        sign = tl.where(offs_d < HALF, -1.0, 1.0)
    rot = row_ok[:, None] & (offs_d < ROTARY_DIM)[None, :]
    partner = tl.load(row_ptrs[:, None] + partner_d[None, :], mask=rot, other=0.0).to(tl.float32)
    # Outside the rotary dims (and past the table) cos = 1, sin = 0: x passes through unchanged.
    angle_ok = rot & ((positions >= 0) & (positions < seqlen_ro))[:, None]
    angle = positions[:, None] * stride_ro + freq[None, :]
    cos = tl.load(COS + angle, mask=angle_ok, other=1.0).to(tl.float32)
    sin = tl.load(SIN + angle, mask=angle_ok, other=0.0).to(tl.float32)
    return x * cos + sign[None, :] * partner * sin


@triton.jit
def _rotary_q(Q, OUT, COS, SIN, CACHE_SEQLENS,
              stride_qb, stride_qs, stride_qh, stride_ob, stride_os, stride_oh, stride_ro,
              seqlen_q, seqlen_ro, nheads,
              PER_ROW: tl.constexpr,  # query i at cache_seqlens + i (causal/local), else all at cache_seqlens
              HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
              ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr):
    token = tl.program_id(0)
    off_b = token // seqlen_q
    i = token % seqlen_q
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < nheads
    position = tl.load(CACHE_SEQLENS + off_b)
    if PER_ROW:
        position += i
    x = _rotary_rows(Q + off_b * stride_qb + i * stride_qs + heads * stride_qh, head_ok,
                     position + 0 * heads, COS, SIN, stride_ro, seqlen_ro,
                     HEAD_DIM, HEAD_DIM_PAD, ROTARY_DIM, INTERLEAVED)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    tl.store(OUT + off_b * stride_ob + i * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
             x.to(OUT.dtype.element_ty), mask=head_ok[:, None] & (offs_d < HEAD_DIM)[None, :])


@triton.jit
def _append_kv(K_NEW, V_NEW, K_CACHE, V_CACHE, CACHE_SEQLENS, BATCH_IDX, BLOCK_TABLE, COS, SIN,
               stride_knb, stride_kns, stride_knh, stride_vnb, stride_vns, stride_vnh,
               stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
               stride_btb, stride_ro, seqlen_new, capacity, num_pages, seqlen_ro, nheads_k,
               HAS_BATCH_IDX: tl.constexpr, PAGE_SIZE: tl.constexpr, ROTARY: tl.constexpr,
               ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
               HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_H: tl.constexpr):
    """Write token j of sequence b at cache position cache_seqlens[b] + j (k rotated there).

    A position outside [0, capacity) or on a page id outside [0, num_pages) is not written:
    the cache is never written out of bounds, whatever the device-side lengths say.
    """
    token = tl.program_id(0)
    off_b = token // seqlen_new
    j = token % seqlen_new
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    # Per-head vectors of one value: the interpreter refuses masks mixing scalars and blocks.
    position = tl.load(CACHE_SEQLENS + off_b) + j + 0 * heads
    ok = (heads < nheads_k) & (position >= 0) & (position < capacity)
    if PAGE_SIZE > 0:
        page = tl.load(BLOCK_TABLE + off_b * stride_btb + position // PAGE_SIZE, mask=ok, other=-1)
        ok = ok & (page >= 0) & (page < num_pages)
        k_dst = K_CACHE + page.to(tl.int64) * stride_kcb + (position % PAGE_SIZE) * stride_kcs
        v_dst = V_CACHE + page.to(tl.int64) * stride_vcb + (position % PAGE_SIZE) * stride_vcs
    else:
        off_bk = off_b
        if HAS_BATCH_IDX:
            off_bk = tl.load(BATCH_IDX + off_b)
        k_dst = K_CACHE + off_bk.to(tl.int64) * stride_kcb + position.to(tl.int64) * stride_kcs
        v_dst = V_CACHE + off_bk.to(tl.int64) * stride_vcb + position.to(tl.int64) * stride_vcs
    head_ok = heads < nheads_k
    mask = ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    k_src = K_NEW + off_b * stride_knb + j * stride_kns + heads * stride_knh
    if ROTARY:
        k = _rotary_rows(k_src, head_ok, position, COS, SIN, stride_ro, seqlen_ro,
                         HEAD_DIM, HEAD_DIM_PAD, ROTARY_DIM, INTERLEAVED)
    else:
        k = tl.load(k_src[:, None] + offs_d[None, :], mask=mask, other=0.0)
    tl.store(k_dst[:, None] + heads[:, None] * stride_kch + offs_d[None, :],
             k.to(K_CACHE.dtype.element_ty), mask=mask)
    v = tl.load(V_NEW + off_b * stride_vnb + j * stride_vns + heads[:, None] * stride_vnh
                + offs_d[None, :], mask=mask, other=0.0)
    tl.store(v_dst[:, None] + heads[:, None] * stride_vch + offs_d[None, :], v, mask=mask)
