// The one parameter struct every kernel of this extension receives (forward and backward).
// Host code (ops.cpp) fills it after validating the tensors; kernels only read it.
#pragma once
#include <cstdint>

namespace flash_kernels {

struct AttnParams {
  // Tensors are (batch, seqlen, heads, head_dim) with a contiguous last dim; strides are in elements.
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // (batch, heads_q, seqlen_q), natural log; +inf for rows that see no key
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;

  // Backward only (null in the forward).
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* delta;  // (batch, heads_q, seqlen_q): rowsum(dout * out), scratch
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

  int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  int head_group;  // heads_q / heads_kv (MQA/GQA): q head h reads kv head h / head_group

  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e): the kernels use exp2

  // Key j is visible from query i iff -window_left <= j - i - diag_offset <= window_right and j < seqlen_k.
  // diag_offset = seqlen_k - seqlen_q aligns causal masks bottom-right (flash_attn convention).
  // Host code resolves "unbounded" (-1) to values no pair reaches, so kernels never test for -1.
  int window_left, window_right, diag_offset;
};

}  // namespace flash_kernels
