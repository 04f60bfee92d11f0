// dQ of the single-pass Hopper backward (head dims up to 128): each dK/dV block adds its share of dQ for a
// tile of 64 queries to a float32 workspace, and a last kernel scales and converts it to dq.
//
// Determinism: float32 addition is not associative, so the sum over key blocks must be taken in the same
// order every run. Each (q head, 64-query tile) has a counter; a key block adds to the tile only when the
// counter equals its rank and then increments it. The order is by descending key block: under a causal or
// sliding-window mask the higher key block reaches a tile in fewer steps (its query range starts later),
// and the grid launches the highest key block first, so a block only ever waits for blocks launched before
// it (no deadlock however many blocks are resident) and, in the steady state, for one that is already ahead.
// Without a mask every key block reaches tile m at the same step; each then trails the previous one by
// about one step, paid once per wave of resident blocks.
//
// Workspace layout (host: ops.cpp): per q head, dq_accum_rows rows of kHeadDim floats, then the int
// counters of every head. Sequence b's rows start at dq_accum_row0: the rows of the sequences before it
// plus one tile of slack per sequence, so that each of its tiles is 64 contiguous rows that no other
// sequence shares. Inside a tile, the two math warpgroups' column halves follow one another, each in the
// stash_acc layout of its m64n(kHeadDim/2) accumulator: the tile goes to global memory as one bulk
// reduction of the shared-memory buffer, and dq_convert_kernel undoes the layout.
#pragma once
#include <cstdint>

#include "attn_mask.cuh"
#include "attn_params.h"
#include "wgmma_primitives.cuh"

namespace flash_kernels {

__device__ __forceinline__ int64_t dq_accum_row0(const AttnParams& p, int b, int q_offset) {
  const int64_t rows_before = p.cu_seqlens_q != nullptr ? q_offset : int64_t{b} * p.seqlen_q;
  return rows_before + int64_t{kDqTileRows} * b;
}

// The tile of queries [m0, m0 + 64) of sequence b (offset q_offset), q head h, and its counter.
template <int kHeadDim>
__device__ __forceinline__ float* dq_accum_tile(const AttnParams& p, int b, int q_offset, int h, int m0) {
  return p.dq_accum + (h * p.dq_accum_rows + dq_accum_row0(p, b, q_offset) + m0) * kHeadDim;
}
__device__ __forceinline__ int* dq_tile_counter(const AttnParams& p, int b, int q_offset, int h, int m0) {
  return p.dq_semaphore + h * p.dq_semaphores_per_head + (dq_accum_row0(p, b, q_offset) + m0) / kDqTileRows;
}

// How many key blocks add to query block m_block before key block n_block does: those above it that visit
// the query block. The visitors of a query block are consecutive key blocks (query_blocks' first and last
// do not decrease with the key block), so the last one is found by bisection over exactly the ranges the
// dK/dV kernel walks; an off-by-one here would leave a counter short of a rank and hang the kernel.
template <bool kBanded>
__device__ __forceinline__ int dq_add_rank(const AttnParams& p, int m_block, int n_block, int block_m, int block_n) {
  const int n_blocks = (p.seqlen_k + block_n - 1) / block_n;
  if (!kBanded) return n_blocks - 1 - n_block;
  int lo = n_block, hi = n_blocks - 1;  // lo visits m_block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    const BlockRange r = query_blocks<kBanded>(p, mid * block_n, block_n, block_m);
    if (r.first <= m_block && m_block < r.last) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo - n_block;
}

__device__ __forceinline__ void wait_counter_equals(const int* counter, int value) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != value);
}
__device__ __forceinline__ void counter_release_increment(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}
// Orders this thread's bulk (async-proxy) global accesses with its generic ones: the counter's acquire
// before the next reduction, the finished reduction before the counter's release.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// dst[i] += src[i] for `bytes` / 4 floats, read from shared memory by the copy engine and added in L2.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src_smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src_smem), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// The reduction has read its source (the buffer may be refilled) / has finished writing.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_done() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// dq = softmax_scale * dq_accum for one tile of 64 queries of one q head (grid: query tiles, q heads, batch),
// one float4 slot a thread per pass: slot j of thread `th` of a half's stash holds rows r, r + 8 (r = 16 warp
// + g) at columns 8q + 2t, +1 of that half (stash_acc, and the accumulator layout in wgmma_primitives.cuh).
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256) dq_convert_kernel(const AttnParams params) {
  AttnParams p = params;
  constexpr int kHalfCols = kHeadDim / 2;
  constexpr int kSlotsPerHalf = 128 * kHalfCols / 8;
  const int m0 = blockIdx.x * kDqTileRows;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  int q_off, k_off;
  select_sequence(p, b, q_off, k_off);
  if (m0 >= p.seqlen_q) return;
  const float4* tile = reinterpret_cast<const float4*>(dq_accum_tile<kHeadDim>(p, b, q_off, h, m0));
  T* dq = static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride + (q_off + m0) * p.dq_row_stride;
  for (int s = threadIdx.x; s < 2 * kSlotsPerHalf; s += blockDim.x) {
    const int half = s / kSlotsPerHalf, slot = s % kSlotsPerHalf;
    const int q = slot / 128, th = slot % 128;
    const int row = 16 * (th / 32) + (th % 32) / 4;
    const int col = half * kHalfCols + 8 * q + 2 * (th % 4);
    if (col >= p.head_dim) continue;
    const float4 v = tile[s];
    if (m0 + row < p.seqlen_q) {
      *reinterpret_cast<uint32_t*>(dq + row * p.dq_row_stride + col) =
          pack2<T>(v.x * p.softmax_scale, v.y * p.softmax_scale);
    }
    if (m0 + row + 8 < p.seqlen_q) {
      *reinterpret_cast<uint32_t*>(dq + (row + 8) * p.dq_row_stride + col) =
          pack2<T>(v.z * p.softmax_scale, v.w * p.softmax_scale);
    }
  }
}

}  // namespace flash_kernels
