// Forward attention for Hopper (sm_90a), device code only (launch: fwd_launch_sm90.cuh).
//
// Same algorithm and conventions as attn_fwd_kernel (fwd_kernel.cuh), on warpgroup MMA (wgmma) instead of
// mma.sync: a block is two warpgroups, each owning 64 query rows; per key block of kBlockN
//   S = Q K^T   wgmma m64n128k16, both operands read from shared memory by the tensor cores (no ldmatrix)
//   mask, online softmax in registers (exp2), exactly as the sm_80 kernel
//   O += P V    wgmma m64n64k16 per 64-column atom of the head dim, P from registers, V from shared memory
// K and V are double-buffered: the copy of the next key block is issued at the top of an iteration and
// has the whole iteration to land. While one warpgroup is in its softmax, the other's wgmma keeps the
// tensor cores busy (the scheduler interleaves the two; nothing forces the order).
#pragma once
#include <cfloat>
#include <cmath>

#include "attn_mask.cuh"
#include "attn_params.h"
#include "wgmma_primitives.cuh"

namespace flash_kernels {

// A block of kBlockM = 128 query rows (two warpgroups of 64), kBlockN = 128 keys per step.
template <typename Element_, int kHeadDim_>
struct FwdSm90Traits {
  // Two (K, V) stages. Measured (H200, bf16, hd 128, 16k tokens): a third stage with S of the next
  // block computed while P V of this one runs gave the same 418-430 TFLOP/s as two (the block-wide
  // barrier per step, not the copies, is what the two warpgroups wait on).
  static constexpr int kStages = 2;
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 128;
  static constexpr int kWarpgroups = kBlockM / 64;
  static constexpr int kNThreads = kWarpgroups * 128;
  static constexpr int kAtoms = kHeadDim / kAtomCols;
  static_assert(kHeadDim % kAtomCols == 0, "the head dim must be whole 64-column atoms");
  static constexpr int kTileQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kTileKVBytes = kBlockN * kHeadDim * 2;
  // Q, then the stages of (K, V), plus slack to align the base to the 1024-byte swizzle period.
  static constexpr int kSmemBytes = kTileQBytes + 2 * kStages * kTileKVBytes + kAtomBytes;
};

template <typename Traits, bool kBanded, bool kVarlen>
__global__ void __launch_bounds__(Traits::kNThreads, 1) attn_fwd_sm90_kernel(const AttnParams params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  AttnParams p = params;
  using T = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int BM = Traits::kBlockM;
  constexpr int BN = Traits::kBlockN;
  constexpr int NT = Traits::kNThreads;
  constexpr int ATOMS = Traits::kAtoms;
  constexpr int NTILES = BN / 8;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t base_addr = (raw_addr + kAtomBytes - 1) & ~uint32_t(kAtomBytes - 1);
  unsigned char* base = smem_raw + (base_addr - raw_addr);
  T* sQ = reinterpret_cast<T*>(base);
  // Stage s: K at kv_addr(s), V right after it.
  auto stage_ptr = [&](int s, int which) {
    return reinterpret_cast<T*>(base + Traits::kTileQBytes + (2 * s + which) * Traits::kTileKVBytes);
  };
  const uint32_t q_addr = base_addr;
  const uint32_t kv_addr = base_addr + Traits::kTileQBytes;

  const int m_block = blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / p.head_group;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid % 128) / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int m0 = m_block * BM;
  const int row0 = wg * 64 + warp * 16;  // this warp's first row within the block

  int q_off = 0, k_off = 0;
  if constexpr (kVarlen) {
    select_sequence(p, b, q_off, k_off);
    if (m0 >= p.seqlen_q) return;
  }

  const T* gQ = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride +
                (q_off + m0) * p.q_row_stride;
  const T* gK = static_cast<const T*>(p.k) + b * p.k_batch_stride + hk * p.k_head_stride + k_off * p.k_row_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride + k_off * p.v_row_stride;
  T* gO = static_cast<T*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride + (q_off + m0) * p.o_row_stride;
  float* gLse = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + q_off + m0;

  int key_begin, key_end;
  key_range<kBanded>(p, m0, BM, key_begin, key_end);
  const int n_block_min = key_begin / BN;
  const int n_block_max = key_begin < key_end ? (key_end + BN - 1) / BN : n_block_min;

  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * BN;
    load_tile_atoms_async<BN, D, NT>(stage_ptr(stage, 0), gK + n0 * p.k_row_stride, p.k_row_stride, p.seqlen_k - n0,
                                     p.head_dim, tid);
    load_tile_atoms_async<BN, D, NT>(stage_ptr(stage, 1), gV + n0 * p.v_row_stride, p.v_row_stride, p.seqlen_k - n0,
                                     p.head_dim, tid);
  };

  float o_acc[ATOMS][32];
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int a = 0; a < ATOMS; ++a)
#pragma unroll
    for (int i = 0; i < 32; ++i) o_acc[a][i] = 0.f;

  if (n_block_min < n_block_max) {
    load_tile_atoms_async<BM, D, NT>(sQ, gQ, p.q_row_stride, p.seqlen_q - m0, p.head_dim, tid);
    load_kv(n_block_max - 1, 0);
    cp_async_commit();
  }

  // Steps of one key block.
  auto issue_qk = [&](float (&s)[NTILES * 4], int stage) {
    const uint32_t k_addr = kv_addr + 2 * stage * Traits::kTileKVBytes;
    fence_operands(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t a_off = (kk / 4) * BM * 128 + wg * 64 * 128 + (kk % 4) * 32;
      const uint32_t b_off = (kk / 4) * BN * 128 + (kk % 4) * 32;
      Wgmma<T>::ss_m64n128k16(s, smem_desc_sw128(q_addr + a_off), smem_desc_sw128(k_addr + b_off), kk > 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](const uint32_t (&pf)[BN / 16][4], int stage) {
    const uint32_t v_addr = kv_addr + (2 * stage + 1) * Traits::kTileKVBytes;
#pragma unroll
    for (int a = 0; a < ATOMS; ++a) fence_operands(o_acc[a]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
      for (int a = 0; a < ATOMS; ++a) {
        Wgmma<T>::rs_m64n64k16_nmajor_b(o_acc[a], pf[kk], smem_desc_sw128(v_addr + a * BN * 128 + kk * 16 * 128));
      }
    }
    wgmma_commit();
  };
  auto mask = [&](float (&s)[NTILES * 4], int n0) {
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
        if (!visible) s[nt * 4 + e] = -INFINITY;
      }
  };
  // Online softmax, as in attn_fwd_kernel (row r = 0: row g, r = 1: row g + 8): S becomes exp2(S - max),
  // alpha[r] is the factor that moves what was accumulated under the old max to the new one.
  auto softmax = [&](float (&s)[NTILES * 4], float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt) mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
      mx = quad_max(mx);
      const float mx_scaled = mx == -INFINITY ? 0.f : mx * p.scale_log2;
      alpha[r] = fast_exp2(row_max[r] * p.scale_log2 - mx_scaled);
      row_max[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float e = fast_exp2(fmaf(s[nt * 4 + 2 * r + c], p.scale_log2, -mx_scaled));
          s[nt * 4 + 2 * r + c] = e;
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
  auto to_p = [&](const float (&s)[NTILES * 4], uint32_t (&pf)[BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) pf[kk][i] = pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
  };

  {
    int stage = 0;
    for (int n_block = n_block_max - 1; n_block >= n_block_min; --n_block, stage ^= 1) {
      cp_async_wait<0>();
      fence_proxy_async_smem();
      __syncthreads();  // this stage landed; both warpgroups finished reading the other stage
      if (n_block > n_block_min) {
        load_kv(n_block - 1, stage ^ 1);
        cp_async_commit();
      }
      float s[NTILES * 4];
      issue_qk(s, stage);
      wgmma_wait<0>();
      fence_operands(s);
      mask(s, n_block * BN);
      float alpha[2];
      softmax(s, alpha);
      rescale_o(alpha);
      uint32_t pf[BN / 16][4];
      to_p(s, pf);
      issue_pv(pf, stage);
      wgmma_wait<0>();
#pragma unroll
      for (int a = 0; a < ATOMS; ++a) fence_operands(o_acc[a]);
    }
  }

  // Normalise and store (attn_fwd_kernel's conventions: O = 0 and lse = +inf for rows that saw no key).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int row = row0 + g + r * 8;
    if (m0 + row < p.seqlen_q) {
      T* o_row = gO + row * p.o_row_stride;
#pragma unroll
      for (int a = 0; a < ATOMS; ++a)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = a * kAtomCols + j * 8;
          if (col >= p.head_dim) break;  // columns past the call's head dim are padding
          *reinterpret_cast<uint32_t*>(o_row + col + 2 * t) =
              pack2<T>(o_acc[a][4 * j + 2 * r] * inv, o_acc[a][4 * j + 2 * r + 1] * inv);
        }
      if (t == 0) gLse[row] = sum > 0.f ? row_max[r] * p.softmax_scale + logf(sum) : INFINITY;
    }
  }
#else
  // Built without sm_90a code: the host dispatches here only on a cc 9.0 device with FLASH_KERNELS_SM90A set.
  __trap();
#endif
}

}  // namespace flash_kernels
