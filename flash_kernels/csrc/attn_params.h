// The one parameter struct every kernel of this extension receives (forward and backward).
// Host code (ops.cpp) fills it after validating the tensors; kernels only read it.
#pragma once
#include <cstdint>

namespace flash_kernels {

// Queries per tile of the single-pass Hopper backward's dQ workspace.
constexpr int kDqTileRows = 64;
// Up to head dim 128 the Hopper backward is one kernel that also adds dQ tiles to a float32 workspace;
// above it, a dK/dV kernel and a dQ kernel that recomputes the scores.
constexpr bool sm90_bwd_accumulates_dq(int head_dim) { return head_dim <= 128; }

struct AttnParams {
  // Tensors are (batch, seqlen, heads, head_dim) with a contiguous last dim; strides are in elements.
  // Varlen: (total_tokens, heads, head_dim) with batch strides 0, see cu_seqlens_q below.
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // natural log; +inf for rows that see no key. Layout: lse_*_stride below
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;

  // Backward only (null in the forward).
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* delta;  // rowsum(dout * out), scratch, laid out like lse
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  // The single-pass Hopper backward (sm90_bwd_accumulates_dq) adds dQ in float32 to dq_accum, ordered by the
  // counters in dq_semaphore (dq_accum.cuh has the layout); both are zeroed by the host, null otherwise.
  float* dq_accum;
  int* dq_semaphore;
  int64_t dq_accum_rows, dq_semaphores_per_head;

  // Varlen: null for dense tensors. Otherwise sequence b is rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of
  // q, out, dout, dq and rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k, v, dk, dv; seqlen_q / seqlen_k
  // hold the max lengths (grid size) and select_sequence() gives each block its own sequence's values.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int total_q;  // varlen: rows of q (the delta kernel walks them as one sequence)
  int total_k;  // varlen: rows of k and v (the Hopper kernels' tensor maps span them)
  // lse / delta element (b, h, query i of the sequence) is at
  // b * lse_batch_stride + h * lse_head_stride + (row of the sequence's first query, 0 if dense) + i:
  // (batch, heads_q, seqlen_q) dense, (heads_q, total_q) varlen (flash_attn's layouts).
  int64_t lse_batch_stride, lse_head_stride;

  int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  // The call's head dim: a multiple of 8, <= the kernel's compiled kHeadDim. Columns [head_dim, kHeadDim)
  // are zero-filled in shared memory and never stored (one kernel serves every head dim up to its own).
  int head_dim;
  int head_group;  // heads_q / heads_kv (MQA/GQA): q head h reads kv head h / head_group

  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e): the kernels use exp2

  // Key j is visible from query i iff -window_left <= j - i - diag_offset <= window_right and j < seqlen_k.
  // diag_offset = seqlen_k - seqlen_q aligns causal masks bottom-right (flash_attn convention).
  // Host code resolves "unbounded" (-1) to values no pair reaches, so kernels never test for -1.
  int window_left, window_right, diag_offset;

  // Paged KV (block_table != null; kvcache_fwd, and varlen_fwd with a block table): k and v are
  // (num_pages, page_size, heads_kv, head_dim) caches, and key position j of sequence b is row
  // j % page_size of page block_table[b * block_table_stride + j / page_size]. Page ids outside
  // [0, num_pages) are never dereferenced: such a page reads as zeros (checking them on the host would
  // cost a device sync). page_shift = log2(page_size) when it is a power of two (shift instead of divide).
  const int* block_table;
  int64_t block_table_stride;
  int64_t k_page_stride, v_page_stride;
  int page_size, page_shift, num_pages;

  // KV cache (kvcache_fwd). Sequence b sees cache positions [cache_leftpad[b], cache_seqlens[b]) of cache
  // row cache_batch_idx[b] (dense) or of its block table (paged); null pointers mean 0, seqlen_k and b.
  // cache_seqlens is clamped to cache_capacity (dense: the cache length; paged: max_blocks * page_size), and
  // a cache_batch_idx outside [0, cache_batch) gives that sequence no key, so bad device data cannot make
  // a kernel read outside the caches.
  const int* cache_seqlens;
  const int* cache_leftpad;
  const int* cache_batch_idx;
  int cache_capacity, cache_batch;
  // softcap > 0: scores become softcap * tanh(q.k * softcap_scale) with softcap_scale = softmax_scale /
  // softcap, and softmax_scale / scale_log2 then hold 1 / log2(e) (the scale is inside the tanh).
  float softcap, softcap_scale;
  // Split-KV: num_splits blocks share one row tile's keys; with more than one, each writes its normalised
  // partial O (float32, head_dim wide) and lse to row ((split * batch + b) * heads_q + h) * seqlen_q + i of
  // partial_o / partial_lse, and a combine kernel merges them into out and lse.
  int num_splits;
  float* partial_o;
  float* partial_lse;
};

}  // namespace flash_kernels
