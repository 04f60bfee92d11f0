// Forward launch: picks the tile shape per head dim and launches attn_fwd_kernel.
// Included only by the generated instantiation files (csrc/instantiations/fwd_*.cu).
#pragma once
#include <cuda_runtime.h>

#include "fwd_kernel.cuh"
#include "launch_check.h"

namespace flash_kernels {

template <typename T, int kHeadDim>
struct FwdConfig;

// Head dim 128: 4 warps x 32 query rows (two 16-row mma strips per warp), 64 keys per step.
// Why two strips: every K/V fragment a warp reads from shared memory feeds two mma instead of one,
// halving ldmatrix traffic per FLOP. Measured on the H200 (bf16, seqlen 8k, non-causal / causal,
// tools/cuda_variant_bench.py, benchmarks/results/cuda_build.md): this shape 355 / 312 TFLOP/s against
// 259 / 235 for 8 warps x 16 rows, 286 / 257 for 8 x 16 rows with 128 keys, 315 / 282 for a 64-row
// block of 4 x 16. Registers: O 128 + S 64 fp32 per thread hit the 255 cap; ptxas reports a few
// dozen bytes of spill (sm_80/sm_90), which cost less than the lost reuse. 128 threads x 255 registers
// allow 2 blocks (8 warps) per SM. Shared memory: Q 32 KB + K 16 KB + V 16 KB = 64 KB (opt-in below).
template <typename T>
struct FwdConfig<T, 128> {
  using Traits = FwdTraits<T, 128, 128, 64, 4>;
};

// Head dim 64: the same two-strip shape; O is half the size, so ~230 registers and no spills.
// Measured (same benchmark): 298 / 275 TFLOP/s against 275 / 192 for 8 warps x 16 rows.
// 128 keys per step spilled ~450 bytes. Shared memory: Q 16 KB + K 8 KB + V 8 KB = 32 KB.
template <typename T>
struct FwdConfig<T, 64> {
  using Traits = FwdTraits<T, 64, 128, 64, 4>;
};

// Head dims 32 and 96 (padded shared-memory rows, see SmemTile): the two-strip shape of head dim 64/128.
// Head dim 96: O 96 + S 64 fp32 registers. Shared memory: (128 + 2 x 64) rows x 104 x 2 B = 52 KB.
// Head dim 32: small accumulators. Shared memory: 256 rows x 40 x 2 B = 20 KB.
template <typename T>
struct FwdConfig<T, 96> {
  using Traits = FwdTraits<T, 96, 128, 64, 4>;
};
template <typename T>
struct FwdConfig<T, 32> {
  using Traits = FwdTraits<T, 32, 128, 64, 4>;
};

template <typename T, int kHeadDim, bool kBanded>
void run_fwd(const AttnParams& p, cudaStream_t stream) {
  using Traits = typename FwdConfig<T, kHeadDim>::Traits;
  auto kernel = attn_fwd_kernel<Traits, kBanded>;
  constexpr int smem = Traits::kSmemBytes;
  // Above 48 KB a block must opt in to the larger dynamic shared-memory carve-out.
  if (smem > 48 * 1024) {
    FK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  const dim3 grid((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, p.heads_q, p.batch);
  kernel<<<grid, Traits::kNThreads, smem, stream>>>(p);
  FK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flash_kernels
