// Forward attention for Hopper (sm_90a), device code only (launch: fwd_launch_sm90.cuh).
//
// Same algorithm and conventions as attn_fwd_kernel (fwd_kernel.cuh), on Hopper's own units:
//   - a copy warpgroup: one thread issues bulk tensor copies (TMA) of Q once and of K, V per key block
//     into a two-stage ring, counted on mbarriers ("full"); it waits for the math warpgroups to release a
//     stage ("empty") before refilling it. It holds 24 registers (setmaxnreg) and does nothing else.
//   - two math warpgroups of 64 query rows each, 240 registers: per key block
//       S = Q K^T   wgmma m64nNk16 (N = the key block), both operands read from shared memory by the tensor cores
//       mask, online softmax in registers (exp2), exactly as the sm_80 kernel
//       O += P V    wgmma m64n64k16 per 64-column atom of the head dim, P from registers
//     S of the next block is issued together with P V of the current one, so the softmax runs while the
//     tensor cores work; and the two warpgroups take turns issuing (two named barriers), so one's
//     softmax also overlaps the other's matrix work.
// No block-wide barrier after the start: the copy engine, not the math threads, moves K and V, and
// each warpgroup waits only for the stage it reads.
#pragma once
#include <cuda.h>

#include <cfloat>
#include <cmath>

#include "attn_mask.cuh"
#include "attn_params.h"
#include "wgmma_primitives.cuh"

namespace flash_kernels {

// 128 query rows: two math warpgroups of 64 (wgmma's M). Keys per step: the widest block whose two
// (K, V) stages fit next to Q in the 227 KB of shared memory a block may have (one block per SM), at most
// 128 (S takes kBlockN / 2 fp32 registers per thread, O kHeadDim / 2, within the 240 the math threads get):
//   head dim 64, 128: 128 keys (Q 16 / 32 KB + 2 x (K + V) 64 / 128 KB)
//   head dim 192: 112 keys (48 + 4 x 42 = 216 KB; registers: O 96 + S 56 + P 28)
//   head dim 256: 80 keys (64 + 4 x 40 = 224 KB; registers: O 128 + S 40 + P 20)
template <int kHeadDim>
constexpr int sm90_block_n() {
  return kHeadDim <= 128 ? 128 : kHeadDim <= 192 ? 112 : 80;
}

template <typename Element_, int kHeadDim_>
struct FwdSm90Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = sm90_block_n<kHeadDim>();
  static constexpr int kMathWarpgroups = kBlockM / 64;
  static constexpr int kNThreads = (kMathWarpgroups + 1) * 128;
  static constexpr int kStages = 2;
  static constexpr int kAtoms = kHeadDim / kAtomCols;
  static_assert(kHeadDim % kAtomCols == 0, "the head dim must be whole 64-column atoms");
  static constexpr int kTileQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kTileKVBytes = kBlockN * kHeadDim * 2;
  // Q, the stages of (K, V), then the mbarriers (Q full; K and V full and empty per stage); plus slack
  // to align the base to the 1024-byte swizzle period.
  static constexpr int kBarrierOffset = kTileQBytes + 2 * kStages * kTileKVBytes;
  static constexpr int kSmemBytes = kBarrierOffset + 8 * (1 + 4 * kStages) + kAtomBytes;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block may have");
  static_assert(kBlockN % 16 == 0, "P feeds wgmma as 16-key slices");
};

// Tensor maps of q, k, v as (head_dim, rows, heads, batch) with a 64 x kBlock box and 128B swizzle.
struct Sm90TensorMaps {
  CUtensorMap q, k, v;
};

template <typename Traits, bool kBanded, bool kVarlen>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    attn_fwd_sm90_kernel(const AttnParams params, const __grid_constant__ Sm90TensorMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  AttnParams p = params;
  using T = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int BM = Traits::kBlockM;
  constexpr int BN = Traits::kBlockN;
  constexpr int ATOMS = Traits::kAtoms;
  constexpr int NTILES = BN / 8;
  constexpr int STAGES = Traits::kStages;
  constexpr int kMathThreads = Traits::kMathWarpgroups * 128;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t q_addr = swizzle_aligned_base(smem_raw);
  const uint32_t kv_addr = q_addr + Traits::kTileQBytes;  // stage s: K at + 2s tiles, V at + 2s+1
  const uint32_t bar_full_q = q_addr + Traits::kBarrierOffset;
  // K and V have rings of their own, so K of a block can be refilled as soon as S = Q K^T is done with it,
  // while P V still reads the V beside it.
  const StageRing<STAGES> ring_k{bar_full_q + 8}, ring_v{bar_full_q + 8 + StageRing<STAGES>::kBytes};

  // Causal: the last query blocks see the most keys; start them first so the grid's tail is short ones.
  const int m_block = kBanded ? static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x) : blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / p.head_group;
  const int tid = threadIdx.x;
  const int m0 = m_block * BM;

  int q_off = 0, k_off = 0;
  if constexpr (kVarlen) {
    select_sequence(p, b, q_off, k_off);
    if (m0 >= p.seqlen_q) return;  // the whole block leaves before any barrier exists
  }
  // Tensor-map coordinates: varlen maps are over the packed rows with a batch of 1.
  const int q_row = q_off + m0;
  const int map_b = kVarlen ? 0 : b;

  const BlockRange keys = key_blocks<kBanded>(p, m0, BM, BN);
  const int n_block_min = keys.first, n_block_max = keys.last;
  const int n_steps = n_block_max - n_block_min;

  if (tid == 0) {
    mbar_init(bar_full_q, 1);
    ring_k.init(kMathThreads / 32);
    ring_v.init(kMathThreads / 32);
    mbar_init_fence();
  }
  __syncthreads();

  if (tid < 128) {
    // Copy warpgroup.
    setmaxnreg_dec<24>();
    if (tid == 0 && n_steps > 0) {
      mbar_arrive_expect_tx(bar_full_q, Traits::kTileQBytes);
      tma_load_tile<ATOMS, BM>(q_addr, &maps.q, q_row, h, map_b, bar_full_q);
      for (int i = 0; i < n_steps; ++i) {
        const int n0 = (n_block_max - 1 - i) * BN;
        for (int which = 0; which < 2; ++which) {  // K, then V
          const StageRing<STAGES>& ring = which ? ring_v : ring_k;
          ring.acquire(i);
          ring.expect(i, Traits::kTileKVBytes);
          tma_load_tile<ATOMS, BN>(kv_addr + (2 * (i % STAGES) + which) * Traits::kTileKVBytes,
                                   which ? &maps.v : &maps.k, k_off + n0, hk, map_b, ring.full(i));
        }
      }
    }
    return;
  }

  // Math warpgroups.
  setmaxnreg_inc<240>();
  const int wg = tid / 128 - 1;
  const int warp = (tid % 128) / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int row0 = wg * 64 + warp * 16;  // this warp's first row within the block
  static_assert(kMathThreads == WarpgroupTurns::kThreads, "two math warpgroups take turns");
  const WarpgroupTurns turns{wg};

  float o_acc[ATOMS][32];
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int a = 0; a < ATOMS; ++a)
#pragma unroll
    for (int i = 0; i < 32; ++i) o_acc[a][i] = 0.f;

  // Steps of one key block.
  auto issue_qk = [&](float (&sc)[NTILES * 4], int s) {
    const uint32_t k_addr = kv_addr + 2 * s * Traits::kTileKVBytes;
    fence_operands(sc);
    wgmma_fence();
    wgmma_rows_x_rows<T, D, BM, BN>(sc, q_addr, wg * 64, k_addr);
    wgmma_commit();
  };
  auto issue_pv = [&](const uint32_t (&pf)[BN / 16][4], int s) {
    const uint32_t v_addr = kv_addr + (2 * s + 1) * Traits::kTileKVBytes;
    fence_operands(o_acc);
    wgmma_fence();
    wgmma_frags_x_rows<T, ATOMS, BN>(o_acc, pf, v_addr);
    wgmma_commit();
  };
  auto mask = [&](float (&sc)[NTILES * 4], int n0) {
    if (block_fully_visible<kBanded>(p, m0, BM, n0, BN)) return;
    const int col0 = n0 + 2 * t;
    const int rel0 = col0 - (m0 + row0 + g) - p.diag_offset;
    const int cols_left = p.seqlen_k - col0;
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int dc = nt * 8 + (e & 1);
        const int rel = rel0 + dc - (e >> 1) * 8;
        bool visible = dc < cols_left;
        if (kBanded) visible = visible && rel >= -p.window_left && rel <= p.window_right;
        if (!visible) sc[nt * 4 + e] = -INFINITY;
      }
  };
  // Online softmax, as in attn_fwd_kernel (r = 0: row g, r = 1: row g + 8): S becomes exp2(S - max);
  // alpha[r] moves what was accumulated under the old max to the new one.
  auto softmax = [&](float (&sc)[NTILES * 4], float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt) mx = fmaxf(mx, fmaxf(sc[nt * 4 + 2 * r], sc[nt * 4 + 2 * r + 1]));
      mx = quad_max(mx);
      const float mx_scaled = mx == -INFINITY ? 0.f : mx * p.scale_log2;
      alpha[r] = fast_exp2(row_max[r] * p.scale_log2 - mx_scaled);
      row_max[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float e = fast_exp2(fmaf(sc[nt * 4 + 2 * r + c], p.scale_log2, -mx_scaled));
          sc[nt * 4 + 2 * r + c] = e;
          sum += e;
        }
      }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
  };
  auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int a = 0; a < ATOMS; ++a)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[a][4 * j + e] *= alpha[e >> 1];
  };

  if (n_steps > 0) {
    mbar_wait(bar_full_q, 0);
    turns.start();
    // S of block i is computed and its softmax done while P V of block i - 1 runs on the tensor cores
    // (measured on the H200, bf16, hd 128: 564-595 TFLOP/s against 524-541 with S and P V in sequence).
    uint32_t pf[BN / 16][4];
    {
      float sc[NTILES * 4];
      ring_k.wait_full(0);
      turns.take();
      issue_qk(sc, 0);
      turns.pass(false);
      wgmma_wait<0>();
      fence_operands(sc);
      ring_k.release(0, lane);
      mask(sc, (n_block_max - 1) * BN);
      float alpha[2];
      softmax(sc, alpha);  // O is still 0: nothing to rescale
      acc_to_frags<T, BN>(sc, pf);
    }
    for (int i = 1; i < n_steps; ++i) {
      const int s = i % STAGES, prev = (i - 1) % STAGES;
      float sc[NTILES * 4];
      ring_k.wait_full(i);
      ring_v.wait_full(i - 1);
      turns.take();
      issue_qk(sc, s);
      issue_pv(pf, prev);
      turns.pass(false);
      wgmma_wait<1>();  // S landed; P V may still run
      fence_operands(sc);
      ring_k.release(i, lane);
      mask(sc, (n_block_max - 1 - i) * BN);
      float alpha[2];
      softmax(sc, alpha);
      wgmma_wait<0>();
      fence_operands(o_acc);
      ring_v.release(i - 1, lane);
      rescale_o(alpha);
      acc_to_frags<T, BN>(sc, pf);
    }
    const int s_last = (n_steps - 1) % STAGES;
    ring_v.wait_full(n_steps - 1);
    turns.take();
    issue_pv(pf, s_last);
    turns.pass(true);
    wgmma_wait<0>();
    fence_operands(o_acc);
    ring_v.release(n_steps - 1, lane);
  }

  // Normalise and store (attn_fwd_kernel's conventions: O = 0 and lse = +inf for rows that saw no key).
  T* gO = static_cast<T*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride + (q_off + m0) * p.o_row_stride;
  float* gLse = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + q_off + m0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int row = row0 + g + r * 8;
    if (m0 + row < p.seqlen_q) {
      store_acc_row<T, ATOMS>(gO + row * p.o_row_stride, o_acc, r, inv, p.head_dim);
      if (t == 0) gLse[row] = sum > 0.f ? row_max[r] * p.softmax_scale + logf(sum) : INFINITY;
    }
  }
#else
  // Built without sm_90a code: the host dispatches here only on a cc 9.0 device with FLASH_KERNELS_SM90A set.
  __trap();
#endif
}

}  // namespace flash_kernels
