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
// 128 fp32, so the query slice stays at 32 (S^T and dP^T: 2 x 4 tiles x 4 = 32 fp32); ptxas: 251 / 254
// registers (sm_80 / sm_90, with the varlen offsets), no spills. At 128 threads that allows 2 blocks per
// SM, so one block's barrier stalls are covered by the other: measured (H200, bf16, 8k) causal 181 TFLOP/s
// against 173 for 8 warps x 16 keys (non-causal equal, 212).
// Shared memory: K, V 16 KB each + 2 stages x (Q, dO) 8 KB each = 64 KB.
// dQ: 4 warps x 16 queries, 64 keys per step (dQ 64 + S 32 + dP 32 fp32 registers; 255 / 236
// registers, no spills);
// shared memory: Q, dO 16 KB each + 2 stages x (K, V) 16 KB each = 96 KB.
template <typename T>
struct BwdConfig<T, 128> {
  static constexpr bool kSplitDKDV = false;
  using KV = BwdKVTraits<T, 128, 64, 32, 4>;
  using Q = BwdQTraits<T, 128, 64, 64, 4>;
};

// Head dim 64: the same 4-warp dK/dV block as head dim 128 (2 blocks per SM), with half the accumulator
// registers spent on a 64-query slice (fewer barriers per key); 227 / 224 registers, no spills. Measured
// backward 217 / 166 TFLOP/s (non-causal / causal) against 216 / 161 for 8 warps x 16 keys.
// dK/dV shared memory: K, V 8 KB each + 2 x (Q, dO) 8 KB each = 48 KB. dQ: 8 + 8 + 2 x (8 + 8) = 48 KB.
template <typename T>
struct BwdConfig<T, 64> {
  static constexpr bool kSplitDKDV = false;
  using KV = BwdKVTraits<T, 64, 64, 64, 4>;
  using Q = BwdQTraits<T, 64, 64, 64, 4>;
};

// Head dims 96 and 32: the 4-warp shapes of head dims 128 and 64 (padded shared-memory rows).
// 96: dK + dV 96 fp32 registers, 32-query slice. 32: 64-query slice.
template <typename T>
struct BwdConfig<T, 96> {
  static constexpr bool kSplitDKDV = false;
  using KV = BwdKVTraits<T, 96, 64, 32, 4>;
  using Q = BwdQTraits<T, 96, 64, 64, 4>;
};
template <typename T>
struct BwdConfig<T, 32> {
  static constexpr bool kSplitDKDV = false;
  using KV = BwdKVTraits<T, 32, 64, 64, 4>;
  using Q = BwdQTraits<T, 32, 64, 64, 4>;
};

// Head dim 160: dK + dV are 160 fp32 registers per thread; a 16-query slice keeps S^T and dP^T at
// 2 x 2 tiles x 4 = 16, so one pass still fits under the 255 cap (ptxas sm_80 / sm_90: 253 / 249
// registers, no spills; dQ 180 / 168). Measured forward+backward (H200, bf16, 4k / 8k): 177 TFLOP/s
// non-causal, 158-163 causal (0.81-0.89x SDPA-flash).
// dK/dV shared memory (168-element padded rows): K, V 21 KB each + 2 x (Q, dO) 5.3 KB each = 63 KB.
// dQ: 4 warps x 16 queries, 32 keys per step (dQ 80 + S 16 + dP 16 fp32); 2 x 21 KB + 2 x 2 x 10.5 KB = 84 KB.
template <typename T>
struct BwdConfig<T, 160> {
  static constexpr bool kSplitDKDV = false;
  using KV = BwdKVTraits<T, 160, 64, 16, 4>;
  using Q = BwdQTraits<T, 160, 64, 32, 4>;
};

// Head dims 192 and 256: dK + dV alone would be 192 / 256 fp32 registers per thread, at or past the 255
// cap before any operand, so the dK/dV kernel runs twice (kSplitDKDV): a dV pass (dV kHeadDim/2 + S^T 16)
// and a dK pass (dK kHeadDim/2 + S^T 16 + dP^T 16), 32-query slices. The cost is one extra S^T = K Q^T
// matmul (8 matmuls per backward instead of 7) against spilling 100+ registers per thread in the inner
// loop. dQ: as head dim 160 (dQ 96 / 128 + S 16 + dP 16 fp32).
// ptxas (sm_80 / sm_90): dK pass 232 / 250 (192), 252 / 254 (256); dV pass 215 / 216, 248 / 253; no spills.
// dQ: 192 spills 80 bytes on sm_80 only, 256 56 bytes on sm_80 only (varlen support's extra registers).
// Measured forward+backward (H200, bf16, 4k / 8k), TFLOP/s non-causal | causal: 192: 169-170 | 148-152
// (0.58-0.65x SDPA-flash); 256: 135-136 | 119-123 (0.49-0.53x).
// Shared memory (padded rows of 200 / 264 elements): dK/dV 2 x 64 + 4 x 32 rows = 100 / 132 KB, dQ
// 2 x 64 + 4 x 32 rows, the same; both fit sm_80's 164 KB and sm_90's 228 KB per block.
template <typename T>
struct BwdConfig<T, 192> {
  static constexpr bool kSplitDKDV = true;
  using KV = BwdKVTraits<T, 192, 64, 32, 4>;
  using Q = BwdQTraits<T, 192, 64, 32, 4>;
};
template <typename T>
struct BwdConfig<T, 256> {
  static constexpr bool kSplitDKDV = true;
  using KV = BwdKVTraits<T, 256, 64, 32, 4>;
  using Q = BwdQTraits<T, 256, 64, 32, 4>;
};

// The three launches of the backward, each its own function so that the Hopper backward
// (bwd_launch_sm90.cuh) can pair its own dK/dV kernel with these delta and dQ launches.
template <typename T, int kHeadDim>
void launch_bwd_delta(const AttnParams& p, cudaStream_t stream) {
  // 8 rows (warps) per block: the kernel is a memory-bound row reduction; small blocks fill the GPU.
  constexpr int kWarps = 8;
  // Varlen: the packed rows as one sequence of total_q rows; delta's (heads_q, total_q) layout is then
  // exactly the dense (1, heads_q, total_q) one the kernel writes.
  AttnParams pd = p;
  if (p.cu_seqlens_q != nullptr) {
    pd.batch = 1;
    pd.seqlen_q = p.total_q;
  }
  const int64_t rows = static_cast<int64_t>(pd.batch) * pd.heads_q * pd.seqlen_q;
  const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  launch_kernel<attn_bwd_delta_kernel<T, kHeadDim>>(blocks, kWarps * 32, 0, stream, pd);
}

template <typename T, int kHeadDim, bool kBanded>
void launch_bwd_dkdv(const AttnParams& p, cudaStream_t stream) {
  using KV = typename BwdConfig<T, kHeadDim>::KV;
  const dim3 grid((p.seqlen_k + KV::kBlockN - 1) / KV::kBlockN, p.heads_kv, p.batch);
  if constexpr (BwdConfig<T, kHeadDim>::kSplitDKDV) {
    launch_kernel<attn_bwd_dkdv_kernel<KV, kBanded, kGradDV>>(grid, KV::kNThreads, KV::kSmemBytes, stream, p);
    launch_kernel<attn_bwd_dkdv_kernel<KV, kBanded, kGradDK>>(grid, KV::kNThreads, KV::kSmemBytes, stream, p);
  } else {
    launch_kernel<attn_bwd_dkdv_kernel<KV, kBanded, kGradBoth>>(grid, KV::kNThreads, KV::kSmemBytes, stream, p);
  }
}

template <typename T, int kHeadDim, bool kBanded>
void launch_bwd_dq(const AttnParams& p, cudaStream_t stream) {
  using Q = typename BwdConfig<T, kHeadDim>::Q;
  const dim3 grid((p.seqlen_q + Q::kBlockM - 1) / Q::kBlockM, p.heads_q, p.batch);
  launch_kernel<attn_bwd_dq_kernel<Q, kBanded>>(grid, Q::kNThreads, Q::kSmemBytes, stream, p);
}

template <typename T, int kHeadDim, bool kBanded>
void run_bwd(const AttnParams& p, cudaStream_t stream) {
  launch_bwd_delta<T, kHeadDim>(p, stream);
  launch_bwd_dkdv<T, kHeadDim, kBanded>(p, stream);
  launch_bwd_dq<T, kHeadDim, kBanded>(p, stream);
}

}  // namespace flash_kernels
