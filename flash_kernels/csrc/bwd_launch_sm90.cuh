// Backward launch for Hopper: the general delta and dQ launches (bwd_launch.cuh, compiled in the general
// instantiation files and only declared here) around the Hopper dK/dV kernel (bwd_kernel_sm90.cuh).
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
void launch_bwd_dq(const AttnParams& p, cudaStream_t stream);

template <typename T, int kHeadDim, bool kBanded>
void run_bwd_sm90(const AttnParams& p, cudaStream_t stream) {
  using Traits = BwdSm90Traits<T, kHeadDim>;
  launch_bwd_delta<T, kHeadDim>(p, stream);
  {
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int batch = varlen ? 1 : p.batch;
    const int rows_q = varlen ? p.total_q : p.seqlen_q;
    const int rows_k = varlen ? p.total_k : p.seqlen_k;
    Sm90BwdTensorMaps maps;
    maps.q = make_tensor_map<T>(p.q, p.head_dim, rows_q, p.heads_q, batch, p.q_row_stride, p.q_head_stride,
                                p.q_batch_stride, Traits::kBlockM);
    maps.dout = make_tensor_map<T>(p.dout, p.head_dim, rows_q, p.heads_q, batch, p.do_row_stride, p.do_head_stride,
                                   p.do_batch_stride, Traits::kBlockM);
    maps.k = make_tensor_map<T>(p.k, p.head_dim, rows_k, p.heads_kv, batch, p.k_row_stride, p.k_head_stride,
                                p.k_batch_stride, Traits::kBlockN);
    maps.v = make_tensor_map<T>(p.v, p.head_dim, rows_k, p.heads_kv, batch, p.v_row_stride, p.v_head_stride,
                                p.v_batch_stride, Traits::kBlockN);
    auto kernel = attn_bwd_dkdv_sm90_kernel<Traits, kBanded>;
    constexpr int smem = Traits::kSmemBytes;
    FK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, p.heads_kv, p.batch);
    kernel<<<grid, Traits::kNThreads, smem, stream>>>(p, maps);
    FK_CUDA_CHECK(cudaGetLastError());
  }
  launch_bwd_dq<T, kHeadDim, kBanded>(p, stream);
}

}  // namespace flash_kernels
