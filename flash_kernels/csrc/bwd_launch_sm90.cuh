// Backward launch for Hopper: the general delta launch (bwd_launch.cuh, compiled in the general
// instantiation files and only declared here), then the Hopper dK/dV kernel (bwd_kernel_sm90.cuh) and either
// the conversion of the dQ it accumulated (head dims up to 128) or the Hopper dQ kernel.
// Included only by the generated instantiation files (csrc/instantiations/bwd_sm90_*.cu).
#pragma once
#include <cuda_runtime.h>

#include "bwd_kernel_sm90.cuh"
#include "fwd_launch_sm90.cuh"
#include "launch_check.h"

namespace flash_kernels {

template <typename T, int kHeadDim>
void launch_bwd_delta(const AttnParams& p, cudaStream_t stream);

template <typename T, int kHeadDim, bool kBanded>
void run_bwd_sm90(const AttnParams& p, cudaStream_t stream) {
  using KV = BwdSm90Traits<T, kHeadDim>;
  launch_bwd_delta<T, kHeadDim>(p, stream);
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int batch = varlen ? 1 : p.batch;
  const int rows_q = varlen ? p.total_q : p.seqlen_q;
  const int rows_k = varlen ? p.total_k : p.seqlen_k;
  // Each kernel reads q / dO and k / v with its own box height (its query and key blocks).
  auto maps_for = [&](int q_box, int kv_box) {
    Sm90BwdTensorMaps maps{};
    if (t_prepare_only) return maps;  // nothing is launched: no tensors to describe
    maps.q = make_tensor_map<T>(p.q, p.head_dim, rows_q, p.heads_q, batch, p.q_row_stride, p.q_head_stride,
                                p.q_batch_stride, q_box);
    maps.dout = make_tensor_map<T>(p.dout, p.head_dim, rows_q, p.heads_q, batch, p.do_row_stride, p.do_head_stride,
                                   p.do_batch_stride, q_box);
    maps.k = make_tensor_map<T>(p.k, p.head_dim, rows_k, p.heads_kv, batch, p.k_row_stride, p.k_head_stride,
                                p.k_batch_stride, kv_box);
    maps.v = make_tensor_map<T>(p.v, p.head_dim, rows_k, p.heads_kv, batch, p.v_row_stride, p.v_head_stride,
                                p.v_batch_stride, kv_box);
    return maps;
  };
  {
    const dim3 grid((p.seqlen_k + KV::kBlockN - 1) / KV::kBlockN, p.heads_kv, p.batch);
    launch_kernel<attn_bwd_dkdv_sm90_kernel<KV, kBanded>>(grid, KV::kNThreads, KV::kSmemBytes, stream, p,
                                                          maps_for(KV::kBlockM, KV::kBlockN));
  }
  if constexpr (KV::kAccumDq) {
    // The workspace (zeroed by the host) now holds dQ / softmax_scale in float32.
    const dim3 grid((p.seqlen_q + kDqTileRows - 1) / kDqTileRows, p.heads_q, p.batch);
    launch_kernel<dq_convert_kernel<T, kHeadDim>>(grid, 256, 0, stream, p);
  } else {
    using Q = BwdQSm90Traits<T, kHeadDim>;
    const dim3 grid((p.seqlen_q + Q::kBlockM - 1) / Q::kBlockM, p.heads_q, p.batch);
    launch_kernel<attn_bwd_dq_sm90_kernel<Q, kBanded>>(grid, Q::kNThreads, Q::kSmemBytes, stream, p,
                                                       maps_for(Q::kBlockM, Q::kBlockN));
  }
}

}  // namespace flash_kernels
