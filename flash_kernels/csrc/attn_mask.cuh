// Which (query, key) pairs are visible: the one definition the forward and both backward kernels share.
#pragma once
#include "attn_params.h"

namespace flash_kernels {

// Narrow p to sequence b: for varlen, its own lengths and diagonal, and the packed-tensor rows of its first
// query and key; for dense tensors p is unchanged and both offsets are 0. Called once at the top of each
// kernel on the kernel's private copy of the params.
__device__ __forceinline__ void select_sequence(AttnParams& p, int b, int& q_offset, int& k_offset) {
  q_offset = 0;
  k_offset = 0;
  if (p.cu_seqlens_q != nullptr) {
    q_offset = p.cu_seqlens_q[b];
    k_offset = p.cu_seqlens_k[b];
    p.seqlen_q = p.cu_seqlens_q[b + 1] - q_offset;
    p.seqlen_k = p.cu_seqlens_k[b + 1] - k_offset;
    p.diag_offset = p.seqlen_k - p.seqlen_q;
  }
}

// Sequence bounds plus the causal / sliding-window band (see AttnParams for the convention).
template <bool kBanded>
__device__ __forceinline__ bool key_visible(const AttnParams& p, int query, int key) {
  if (key >= p.seqlen_k) return false;
  if (!kBanded) return true;
  const int rel = key - query - p.diag_offset;
  return rel >= -p.window_left && rel <= p.window_right;
}

// True when every pair of the block [q0, q0+nq) x [k0, k0+nk) is visible, so per-element masking can be
// skipped (the common case far from the diagonal and the sequence end).
template <bool kBanded>
__device__ __forceinline__ bool block_fully_visible(const AttnParams& p, int q0, int nq, int k0, int nk) {
  if (k0 + nk > p.seqlen_k) return false;
  if (!kBanded) return true;
  const int rel_max = (k0 + nk - 1) - q0 - p.diag_offset;
  const int rel_min = k0 - (q0 + nq - 1) - p.diag_offset;
  return rel_max <= p.window_right && rel_min >= -p.window_left;
}

// Blocks [first, last) of block_n keys that hold every key queries [q0, q0 + nq) can see; first == last
// when they see none.
struct BlockRange {
  int first, last;
};
template <bool kBanded>
__device__ __forceinline__ BlockRange key_blocks(const AttnParams& p, int q0, int nq, int block_n) {
  int begin = 0, end = p.seqlen_k;
  if (kBanded) {
    begin = max(0, q0 + p.diag_offset - p.window_left);
    end = min(p.seqlen_k, q0 + nq - 1 + p.diag_offset + p.window_right + 1);
  }
  if (begin >= end) return {0, 0};
  return {begin / block_n, (end + block_n - 1) / block_n};
}

// Blocks [first, last) of block_m queries that hold every query that can see one of keys [k0, k0 + nk).
template <bool kBanded>
__device__ __forceinline__ BlockRange query_blocks(const AttnParams& p, int k0, int nk, int block_m) {
  int begin = 0, end = p.seqlen_q;
  if (kBanded) {
    begin = max(0, k0 - p.diag_offset - p.window_right);
    end = min(p.seqlen_q, k0 + nk - 1 - p.diag_offset + p.window_left + 1);
  }
  if (begin >= end) return {0, 0};
  return {begin / block_m, (end + block_m - 1) / block_m};
}

}  // namespace flash_kernels
