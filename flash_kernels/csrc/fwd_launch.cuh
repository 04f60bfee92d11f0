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

// Head dims 160, 192, 256: one 16-row strip per warp (the two-strip shape would need O 2 x kHeadDim/2
// fp32 registers per thread: 160 to 256 before S, far past the 255 cap), 4 warps x 16 rows, 64 keys per
// step. Registers: O kHeadDim/2 (80 / 96 / 128) + S 32 fp32. A 64-row block keeps shared memory at
// (64 + 2 x 64) rows of 168 / 200 / 264 elements (padded, see SmemTile) = 63 / 75 / 99 KB, so even at
// 256 two blocks (8 warps) share an SM on sm_80 (164 KB) and sm_90 (228 KB), and
// one block's barrier waits are covered by the other's math. (flash-attention 2 picks 64 x 64 tiles with
// 4 warps for head dim 256 on sm_8x for the same register reason.)
// ptxas (sm_80 / sm_90, dense kernel): 160: 230 / 228 registers, no spills; 192: 250 / 253, no spills;
// 256: 255, 72 bytes of spill stores (varlen kernel: 104-112), outside the inner loop's mma.
// Measured (H200, bf16, 16k tokens, seqlen 4k / 8k, tools/cuda_bench.py), TFLOP/s non-causal | causal:
// 160: 245-247 | 228-240 (1.01-1.09x SDPA-flash); 192: 246 | 211-220 (0.75-0.77x); 256: 221-223 |
// 186-193 (0.65-0.69x). 192 and 256 are the next candidates for a tile search (e.g. 128-row blocks of
// 8 warps, or 32 keys per step to drop the 256 spills); not measured yet.
template <typename T>
struct FwdConfig<T, 160> {
  using Traits = FwdTraits<T, 160, 64, 64, 4>;
};
template <typename T>
struct FwdConfig<T, 192> {
  using Traits = FwdTraits<T, 192, 64, 64, 4>;
};
template <typename T>
struct FwdConfig<T, 256> {
  using Traits = FwdTraits<T, 256, 64, 64, 4>;
};

template <typename T, int kHeadDim, bool kBanded>
void run_fwd(const AttnParams& p, cudaStream_t stream) {
  using Traits = typename FwdConfig<T, kHeadDim>::Traits;
  const dim3 grid((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, p.heads_q, p.batch);
  constexpr int threads = Traits::kNThreads, smem = Traits::kSmemBytes;
  // Dense, varlen and paged varlen calls share one instantiation file (one nvcc front-end pass for all).
  if (t_prepare_only) {
    launch_kernel<attn_fwd_kernel<Traits, kBanded, false>>(grid, threads, smem, stream, p);
    launch_kernel<attn_fwd_kernel<Traits, kBanded, true>>(grid, threads, smem, stream, p);
    launch_kernel<attn_fwd_kernel<Traits, kBanded, true, true>>(grid, threads, smem, stream, p);
  } else if (p.cu_seqlens_q == nullptr) {
    launch_kernel<attn_fwd_kernel<Traits, kBanded, false>>(grid, threads, smem, stream, p);
  } else if (p.block_table == nullptr) {
    launch_kernel<attn_fwd_kernel<Traits, kBanded, true>>(grid, threads, smem, stream, p);
  } else {
    launch_kernel<attn_fwd_kernel<Traits, kBanded, true, true>>(grid, threads, smem, stream, p);
  }
}

}  // namespace flash_kernels
