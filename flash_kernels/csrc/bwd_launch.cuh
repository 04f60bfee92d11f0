// Backward launch: tile shapes per head dim, then delta -> dK/dV -> dQ on one stream.
// Included only by the generated instantiation files (csrc/instantiations/bwd_*.cu).
#pragma once
#include <cuda_runtime.h>

#include "bwd_kernel.cuh"
#include "launch_check.h"

namespace flash_kernels {

template <typename T, int kHeadDim>
struct BwdConfig;

// dK/dV: 4 warps x 16 keys = 64 keys per block. Registers: dK + dV accumulators are 2 x 16 tiles x 4 =
// 128 fp32, so the query slice stays at 32 (S^T and dP^T: 2 x 4 tiles x 4 = 32 fp32); ptxas: 242
// registers, no spills. At 128 threads that allows 2 blocks per SM, so one block's barrier stalls are
// covered by the other: measured (H200, bf16, 8k) causal 181 TFLOP/s against 173 for 8 warps x 16 keys
// (non-causal equal, 212).
// Shared memory: K, V 16 KB each + 2 stages x (Q, dO) 8 KB each = 64 KB.
// dQ: 4 warps x 16 queries, 64 keys per step (dQ 64 + S 32 + dP 32 fp32 registers; 212 registers);
// shared memory: Q, dO 16 KB each + 2 stages x (K, V) 16 KB each = 96 KB.
template <typename T>
struct BwdConfig<T, 128> {
  using KV = BwdKVTraits<T, 128, 64, 32, 4>;
  using Q = BwdQTraits<T, 128, 64, 64, 4>;
};

// Head dim 64: the same 4-warp dK/dV block as head dim 128 (2 blocks per SM), with half the accumulator
// registers spent on a 64-query slice (fewer barriers per key); 170 registers, no spills. Measured
// backward 217 / 166 TFLOP/s (non-causal / causal) against 216 / 161 for 8 warps x 16 keys.
// dK/dV shared memory: K, V 8 KB each + 2 x (Q, dO) 8 KB each = 48 KB. dQ: 8 + 8 + 2 x (8 + 8) = 48 KB.
template <typename T>
struct BwdConfig<T, 64> {
  using KV = BwdKVTraits<T, 64, 64, 64, 4>;
  using Q = BwdQTraits<T, 64, 64, 64, 4>;
};

// Head dims 96 and 32: the 4-warp shapes of head dims 128 and 64 (padded shared-memory rows).
// 96: dK + dV 96 fp32 registers, 32-query slice. 32: 64-query slice.
template <typename T>
struct BwdConfig<T, 96> {
  using KV = BwdKVTraits<T, 96, 64, 32, 4>;
  using Q = BwdQTraits<T, 96, 64, 64, 4>;
};
template <typename T>
struct BwdConfig<T, 32> {
  using KV = BwdKVTraits<T, 32, 64, 64, 4>;
  using Q = BwdQTraits<T, 32, 64, 64, 4>;
};

template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  // Above 48 KB a block must opt in to the larger dynamic shared-memory carve-out.
  if (bytes > 48 * 1024) {
    FK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  }
}

template <typename T, int kHeadDim, bool kBanded>
void run_bwd(const AttnParams& p, cudaStream_t stream) {
  using KV = typename BwdConfig<T, kHeadDim>::KV;
  using Q = typename BwdConfig<T, kHeadDim>::Q;

  {
    // 8 rows (warps) per block: the kernel is a memory-bound row reduction; small blocks fill the GPU.
    constexpr int kWarps = 8;
    const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q;
    const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
    attn_bwd_delta_kernel<T, kHeadDim><<<blocks, kWarps * 32, 0, stream>>>(p);
    FK_CUDA_CHECK(cudaGetLastError());
  }
  {
    auto kernel = attn_bwd_dkdv_kernel<KV, kBanded>;
    allow_smem(kernel, KV::kSmemBytes);
    const dim3 grid((p.seqlen_k + KV::kBlockN - 1) / KV::kBlockN, p.heads_kv, p.batch);
    kernel<<<grid, KV::kNThreads, KV::kSmemBytes, stream>>>(p);
    FK_CUDA_CHECK(cudaGetLastError());
  }
  {
    auto kernel = attn_bwd_dq_kernel<Q, kBanded>;
    allow_smem(kernel, Q::kSmemBytes);
    const dim3 grid((p.seqlen_q + Q::kBlockM - 1) / Q::kBlockM, p.heads_q, p.batch);
    kernel<<<grid, Q::kNThreads, Q::kSmemBytes, stream>>>(p);
    FK_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace flash_kernels
