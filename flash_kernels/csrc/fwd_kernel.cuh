// Forward attention, device code only (launch: fwd_launch.cuh).
//
// One block = kBlockM query rows of one (batch, q head). Keys are visited kBlockN at a time from the last
// visible block to the first (the partially masked blocks near the diagonal come first, while the
// running max is still forming). Per key block:
//   S = Q K^T (mma, fp32)  ->  mask  ->  online softmax in registers (exp2)  ->  O += P V (mma)
// K and V have one shared buffer each; V's copy overlaps QK^T and the next K's copy overlaps PV.
#pragma once
#include <cfloat>
#include <cmath>

#include "attn_mask.cuh"
#include "attn_params.h"
#include "kernel_traits.h"
#include "kv_rows.cuh"
#include "mma_primitives.cuh"

namespace flash_kernels {

// kVarlen is a template flag here (not a run-time test as in the backward): the per-sequence lengths and
// row offsets cost this kernel, which sits at the 255-register cap, two or three more live registers and
// measured 3-4% (H200, bf16, head dim 128, A/B on one machine). The backward showed no such loss.
// kPaged (varlen only): k and v are paged caches (AttnParams::block_table); sequence b's keys are positions
// [0, cu_seqlens_k[b + 1] - cu_seqlens_k[b]) of its block table, clamped to the table's capacity.
template <typename Traits, bool kBanded, bool kVarlen, bool kPaged = false>
__global__ void __launch_bounds__(Traits::kNThreads) attn_fwd_kernel(const AttnParams params) {
  static_assert(kVarlen || !kPaged, "paged K/V comes with varlen sequences (flash_attn's varlen API)");
  AttnParams p = params;  // select_sequence narrows this copy to the block's sequence (varlen)
  using T = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int BM = Traits::kBlockM;
  constexpr int BN = Traits::kBlockN;
  constexpr int NT = Traits::kNThreads;
  constexpr int MT = Traits::kMTiles;
  constexpr int NTILES = Traits::kNTiles;
  constexpr int DTILES = Traits::kDTiles;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + Traits::kSmemQ;
  T* sV = sK + Traits::kSmemKV;

  const int m_block = blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / p.head_group;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // accumulator row within a 16-row strip (and +8)
  const int t = lane % 4;  // accumulator column pair within an 8-column tile
  const int m0 = m_block * BM;
  const int warp_row0 = warp * Traits::kRowsPerWarp;  // first row of this warp within the block

  int q_off = 0, k_off = 0;
  if constexpr (kVarlen) {
    select_sequence(p, b, q_off, k_off);
    if constexpr (kPaged) {
      // Keys are found through the block table, not at rows cu_seqlens_k[b] of a packed tensor.
      k_off = 0;
      p.seqlen_k = min(max(p.seqlen_k, 0), p.cache_capacity);
      p.diag_offset = p.seqlen_k - p.seqlen_q;
    }
    if (m0 >= p.seqlen_q) return;  // the grid covers the longest sequence
  }

  const T* gQ = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride +
                (q_off + m0) * p.q_row_stride;
  const T* gK = static_cast<const T*>(p.k) + b * p.k_batch_stride + hk * p.k_head_stride + k_off * p.k_row_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride + k_off * p.v_row_stride;
  // Key block n0's rows of K or V: a tile of gK / gV, or (paged) pages of the sequence's block table.
  auto load_keys = [&](T* dst, const T* g, int64_t row_stride, int64_t page_stride, int n0) {
    if constexpr (kPaged) {
      const CacheRows<T> rows{g, row_stride, page_stride, p.block_table + b * p.block_table_stride,
                              p.page_size, p.page_shift, p.num_pages, 0, p.seqlen_k};
      load_rows_async<BN, D, NT>(dst, [&](int r) { return rows(n0 + r); }, g, p.head_dim, tid);
    } else {
      load_tile_async<BN, D, NT>(dst, g + n0 * row_stride, row_stride, p.seqlen_k - n0, p.head_dim, tid);
    }
  };
  auto load_k = [&](int n0) { load_keys(sK, gK, p.k_row_stride, p.k_page_stride, n0); };
  auto load_v = [&](int n0) { load_keys(sV, gV, p.v_row_stride, p.v_page_stride, n0); };
  T* gO = static_cast<T*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride + (q_off + m0) * p.o_row_stride;
  float* gLse = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + q_off + m0;

  const BlockRange keys = key_blocks<kBanded>(p, m0, BM, BN);
  const int n_block_min = keys.first, n_block_max = keys.last;

  float o_acc[MT][DTILES][4];
  float row_max[MT][2];
  float row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < DTILES; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[mt][dt][e] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  if (n_block_min < n_block_max) {
    load_tile_async<BM, D, NT>(sQ, gQ, p.q_row_stride, p.seqlen_q - m0, p.head_dim, tid);
    load_k((n_block_max - 1) * BN);
    cp_async_commit();
  }

  const FragLoader<D, Frag::kA> frag_q(sQ, warp_row0, lane);
  const FragLoader<D, Frag::kBRows> frag_k(sK, 0, lane);
  const FragLoader<D, Frag::kBRowsT> frag_v(sV, 0, lane);

  for (int n_block = n_block_max - 1; n_block >= n_block_min; --n_block) {
    const int n0 = n_block * BN;
    cp_async_wait<0>();
    __syncthreads();  // K (and Q) landed; every warp finished the previous PV, so sV may be overwritten
    load_v(n0);
    cp_async_commit();

    // S = Q K^T for this warp's rows.
    float s[MT][NTILES][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) frag_q.load(a[mt], mt * 16, kk * 16);
#pragma unroll
      for (int np = 0; np < NTILES / 2; ++np) {
        uint32_t bf[4];
        frag_k.load(bf, np * 16, kk * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma16816<T>::run(s[mt][2 * np], a[mt], bf[0], bf[1]);
          Mma16816<T>::run(s[mt][2 * np + 1], a[mt], bf[2], bf[3]);
        }
      }
    }

    if (!block_fully_visible<kBanded>(p, m0, BM, n0, BN)) {
      // key_visible's test written as two per-thread values plus compile-time offsets per element
      // (keeps this rarely taken path from holding a register per element).
      const int col0 = n0 + 2 * t;
      const int rel0 = col0 - (m0 + warp_row0 + g) - p.diag_offset;
      const int cols_left = p.seqlen_k - col0;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int dc = nt * 8 + (e & 1);
            const int rel = rel0 + dc - (mt * 16 + (e >> 1) * 8);
            bool visible = dc < cols_left;
            if (kBanded) visible = visible && rel >= -p.window_left && rel <= p.window_right;
            if (!visible) s[mt][nt][e] = -INFINITY;
          }
    }

    // Online softmax: rescale what was accumulated under the old row max, then add this block.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) online_softmax_step(s[mt], row_max[mt], row_sum[mt], o_acc[mt], p.scale_log2);

    cp_async_wait<0>();
    __syncthreads();  // V landed; every warp finished reading sK, so the next K may be copied
    if (n_block > n_block_min) {
      load_k(n0 - BN);
      cp_async_commit();
    }

    // O += P V.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc_to_a_frag<T>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < DTILES / 2; ++dp) {
        uint32_t bf[4];
        frag_v.load(bf, kk * 16, dp * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma16816<T>::run(o_acc[mt][2 * dp], a[mt], bf[0], bf[1]);
          Mma16816<T>::run(o_acc[mt][2 * dp + 1], a[mt], bf[2], bf[3]);
        }
      }
    }
  }

  // Normalise and store. Rows that saw no key get O = 0 and lse = +inf (flash_attn's convention).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_sum(row_sum[mt][r]);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int row = warp_row0 + mt * 16 + g + r * 8;
      const bool in_range = m0 + row < p.seqlen_q;
      if (in_range) {
        T* o_row = gO + row * p.o_row_stride;
#pragma unroll
        for (int dt = 0; dt < DTILES; ++dt) {
          if (dt * 8 >= p.head_dim) break;  // columns past the call's head dim are padding
          const uint32_t packed = pack2<T>(o_acc[mt][dt][2 * r] * inv, o_acc[mt][dt][2 * r + 1] * inv);
          *reinterpret_cast<uint32_t*>(o_row + dt * 8 + 2 * t) = packed;
        }
        if (t == 0) {
          gLse[row] = sum > 0.f ? row_max[mt][r] * p.softmax_scale + logf(sum) : INFINITY;
        }
      }
    }
  }
}

}  // namespace flash_kernels
