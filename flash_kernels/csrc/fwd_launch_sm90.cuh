// Forward launch for Hopper (attn_fwd_sm90_kernel). Included only by the generated instantiation files
// (csrc/instantiations/fwd_sm90_*.cu); ops.cpp picks these launchers on cc 9.0 devices when the
// extension was built with sm_90a code (FLASH_KERNELS_SM90A) and the head dim is 64 or 128.
//
// Tile choice (head dims 64 and 128): 128 query rows as two warpgroups of 64 (wgmma's M is 64 per
// warpgroup) and 128 keys per step (S = 64 fp32 registers per thread, the widest N that leaves room for O:
// 64 more at head dim 128). Two warpgroups rather than one so that one's softmax overlaps the other's
// matrix work. Shared memory: Q 32 KB + 2 stages x (K + V) 2 x 64 KB = 160 KB at head dim 128 (80 KB at
// 64): one block per SM, which __launch_bounds__(256, 1) tells the register allocator.
#pragma once
#include <cuda_runtime.h>

#include "fwd_kernel_sm90.cuh"
#include "launch_check.h"

namespace flash_kernels {

template <typename T, int kHeadDim, bool kBanded>
void run_fwd_sm90(const AttnParams& p, cudaStream_t stream) {
  using Traits = FwdSm90Traits<T, kHeadDim>;
  auto kernel = p.cu_seqlens_q != nullptr ? attn_fwd_sm90_kernel<Traits, kBanded, true>
                                          : attn_fwd_sm90_kernel<Traits, kBanded, false>;
  constexpr int smem = Traits::kSmemBytes;
  FK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, p.heads_q, p.batch);
  kernel<<<grid, Traits::kNThreads, smem, stream>>>(p);
  FK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flash_kernels
