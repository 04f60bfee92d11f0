// Backward attention, device code only (launch: bwd_launch.cuh). Three kernels, no atomics, so the
// result is bit-for-bit deterministic:
//   1. attn_bwd_delta_kernel: delta = rowsum(dO * O) per query row (fp32).
//   2. attn_bwd_dkdv_kernel : per block of keys of one kv head, walk the queries of every q head of its
//      group: S^T = K Q^T, P^T = exp2(S^T*scale*log2e - lse*log2e), dP^T = V dO^T,
//      dS^T = P^T (dP^T - delta); dV += P^T dO; dK += dS^T Q. Summing the group's heads in registers is
//      what makes MQA/GQA need no atomics.
//   3. attn_bwd_dq_kernel   : per block of queries, walk the keys: recompute P and dS, dQ += dS K.
// The price of (3) is recomputing QK^T and dO V^T once more (7 matmuls instead of 5).
#pragma once
#include <cmath>

#include "attn_mask.cuh"
#include "attn_params.h"
#include "kernel_traits.h"
#include "mma_primitives.cuh"

namespace flash_kernels {

// lse arrives in natural log (flash_attn convention); the kernels work in exp2.
constexpr float kLog2e = 1.4426950408889634f;

// One warp per query row; lanes stride over the head dim two elements at a time.
template <typename T, int kHeadDim>
__global__ void attn_bwd_delta_kernel(const AttnParams p) {
  const int warps_per_block = blockDim.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q;
  if (row >= rows) return;
  // delta is laid out (batch, heads_q, seqlen_q), like lse.
  const int i = row % p.seqlen_q;
  const int h = (row / p.seqlen_q) % p.heads_q;
  const int b = row / (static_cast<int64_t>(p.seqlen_q) * p.heads_q);
  const T* o = static_cast<const T*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride + i * p.o_row_stride;
  const T* d = static_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride + i * p.do_row_stride;
  float acc = 0.f;
#pragma unroll
  for (int c = lane * 2; c < kHeadDim; c += 64) {
    if (c >= p.head_dim) break;  // head_dim is a multiple of 8, so c + 1 < head_dim too
    acc += to_float(o[c]) * to_float(d[c]) + to_float(o[c + 1]) * to_float(d[c + 1]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
  if (lane == 0) p.delta[row] = acc;
}

// Which gradients one launch of the dK/dV kernel produces. Both (one pass) unless the head dim is so
// large that dK and dV accumulators do not fit in registers together; then the launch code runs a dV
// pass and a dK pass (the dV pass skips dP^T = V dO^T; both recompute S^T: 5 matmuls instead of 4).
enum KVGrads : int { kGradDV = 1, kGradDK = 2, kGradBoth = 3 };

template <typename Traits, bool kBanded, int kGrads>
__global__ void __launch_bounds__(Traits::kNThreads) attn_bwd_dkdv_kernel(const AttnParams params) {
  AttnParams p = params;  // select_sequence narrows this copy to the block's sequence
  constexpr bool kDV = (kGrads & kGradDV) != 0;
  constexpr bool kDK = (kGrads & kGradDK) != 0;
  using T = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int BN = Traits::kBlockN;
  constexpr int BM = Traits::kBlockM;
  constexpr int NT = Traits::kNThreads;
  constexpr int QTILES = Traits::kQTiles;
  constexpr int DTILES = Traits::kDTiles;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + Traits::kSmemKV;
  // Stage s of Q is sQ + s * kSmemQ (likewise dO): pointer arithmetic, not a pointer array, which a
  // run-time stage index would push to local memory.
  T* sQ = sV + Traits::kSmemKV;
  T* sdO = sQ + 2 * Traits::kSmemQ;
  float* sLse = reinterpret_cast<float*>(sdO + 2 * Traits::kSmemQ);  // [2][BM], already times log2(e)
  float* sDelta = sLse + 2 * BM;                                      // [2][BM]

  const int n_block = blockIdx.x;
  const int hk = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int n0 = n_block * BN;
  const int key_row0 = warp * 16;  // this warp's 16 keys within the block

  int q_off, k_off;
  select_sequence(p, b, q_off, k_off);
  if (n0 >= p.seqlen_k) return;  // varlen: the grid covers the longest sequence

  const T* gK = static_cast<const T*>(p.k) + b * p.k_batch_stride + hk * p.k_head_stride +
                (k_off + n0) * p.k_row_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride +
                (k_off + n0) * p.v_row_stride;

  const BlockRange queries = query_blocks<kBanded>(p, n0, BN, BM);
  const int m_block_min = queries.first, m_blocks = queries.last - queries.first;
  const int steps = m_blocks * p.head_group;  // (q head of the group, query block) pairs

  // Issue the copies for step `s` into stage `stage` (Q and dO tiles by cp.async; lse and delta by plain
  // loads, which the barrier at the top of the step publishes).
  auto issue_step = [&](int s, int stage) {
    const int h = hk * p.head_group + s / m_blocks;
    const int m0 = (m_block_min + s % m_blocks) * BM;
    const T* gQ = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride +
                  (q_off + m0) * p.q_row_stride;
    const T* gdO = static_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride +
                   (q_off + m0) * p.do_row_stride;
    load_tile_async<BM, D, NT>(sQ + stage * Traits::kSmemQ, gQ, p.q_row_stride, p.seqlen_q - m0, p.head_dim, tid);
    load_tile_async<BM, D, NT>(sdO + stage * Traits::kSmemQ, gdO, p.do_row_stride, p.seqlen_q - m0, p.head_dim,
                               tid);
    if (tid < BM) {
      const int64_t row = b * p.lse_batch_stride + h * p.lse_head_stride + q_off + m0 + tid;
      const bool valid = m0 + tid < p.seqlen_q;
      // lse = +inf makes P = 0 for rows past the end (and for rows that saw no key in the forward).
      sLse[stage * BM + tid] = valid ? p.lse[row] * kLog2e : INFINITY;
      sDelta[stage * BM + tid] = valid ? p.delta[row] : 0.f;
    }
  };

  float dk[DTILES][4];
  float dv[DTILES][4];
#pragma unroll
  for (int dt = 0; dt < DTILES; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;

  if (steps > 0) {
    load_tile_async<BN, D, NT>(sK, gK, p.k_row_stride, p.seqlen_k - n0, p.head_dim, tid);
    if constexpr (kDK) load_tile_async<BN, D, NT>(sV, gV, p.v_row_stride, p.seqlen_k - n0, p.head_dim, tid);
    issue_step(0, 0);
    cp_async_commit();
  }

  // V sits right after K and dO right after Q's two stages, so one loader per operand shape serves
  // both tiles of a pair (byte offsets below).
  const FragLoader<D, Frag::kA> frag_kv(sK, key_row0, lane);
  const FragLoader<D, Frag::kBRows> frag_qdo(sQ, 0, lane);
  const FragLoader<D, Frag::kBRowsT> frag_qdo_t(sQ, 0, lane);
  constexpr uint32_t kVBytes = Traits::kSmemKV * sizeof(T);
  constexpr uint32_t kDOBytes = 2 * Traits::kSmemQ * sizeof(T);

  for (int s = 0; s < steps; ++s) {
    const int stage = s & 1;
    const int m0 = (m_block_min + s % m_blocks) * BM;
    cp_async_wait<0>();
    __syncthreads();  // this step's tiles landed; every warp finished step s-1, whose stage is reused next
    if (s + 1 < steps) {
      issue_step(s + 1, stage ^ 1);
      cp_async_commit();
    }
    const uint32_t stage_bytes = stage * Traits::kSmemQ * sizeof(T);
    const float* lse_s = sLse + stage * BM;
    const float* delta_s = sDelta + stage * BM;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x BM queries.
    float st[QTILES][4];
    float dpt[QTILES][4];
#pragma unroll
    for (int qt = 0; qt < QTILES; ++qt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[qt][e] = dpt[qt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ak[4], av[4];
      frag_kv.load(ak, 0, kk * 16);
      if constexpr (kDK) frag_kv.load(av, 0, kk * 16, kVBytes);
#pragma unroll
      for (int qp = 0; qp < QTILES / 2; ++qp) {
        uint32_t bq[4];
        frag_qdo.load(bq, qp * 16, kk * 16, stage_bytes);
        Mma16816<T>::run(st[2 * qp], ak, bq[0], bq[1]);
        Mma16816<T>::run(st[2 * qp + 1], ak, bq[2], bq[3]);
        if constexpr (kDK) {
          uint32_t bo[4];
          frag_qdo.load(bo, qp * 16, kk * 16, stage_bytes + kDOBytes);
          Mma16816<T>::run(dpt[2 * qp], av, bo[0], bo[1]);
          Mma16816<T>::run(dpt[2 * qp + 1], av, bo[2], bo[3]);
        }
      }
    }

    // P^T and dS^T in place. Element e of tile qt: key row g + (e/2)*8, query column qt*8 + 2t + e%2.
    const bool full = block_fully_visible<kBanded>(p, m0, BM, n0, BN);
#pragma unroll
    for (int qt = 0; qt < QTILES; ++qt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qcol = qt * 8 + 2 * t + (e & 1);
        const int key = n0 + key_row0 + g + (e >> 1) * 8;
        float pv = fast_exp2(fmaf(st[qt][e], p.scale_log2, -lse_s[qcol]));
        if (!full && !key_visible<kBanded>(p, m0 + qcol, key)) pv = 0.f;
        st[qt][e] = pv;
        if constexpr (kDK) dpt[qt][e] = pv * (dpt[qt][e] - delta_s[qcol]);
      }
    }

    // dV += P^T dO and dK += dS^T Q (k dimension = the BM queries).
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t ap[4], ads[4];
      if constexpr (kDV) acc_to_a_frag<T>(ap, st[2 * kk], st[2 * kk + 1]);
      if constexpr (kDK) acc_to_a_frag<T>(ads, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < DTILES / 2; ++dp) {
        if constexpr (kDV) {
          uint32_t bo[4];
          frag_qdo_t.load(bo, kk * 16, dp * 16, stage_bytes + kDOBytes);
          Mma16816<T>::run(dv[2 * dp], ap, bo[0], bo[1]);
          Mma16816<T>::run(dv[2 * dp + 1], ap, bo[2], bo[3]);
        }
        if constexpr (kDK) {
          uint32_t bq[4];
          frag_qdo_t.load(bq, kk * 16, dp * 16, stage_bytes);
          Mma16816<T>::run(dk[2 * dp], ads, bq[0], bq[1]);
          Mma16816<T>::run(dk[2 * dp + 1], ads, bq[2], bq[3]);
        }
      }
    }
  }

  // Store (zeros for keys no query sees, so dK/dV are always fully written).
  T* gdK = static_cast<T*>(p.dk) + b * p.dk_batch_stride + hk * p.dk_head_stride + k_off * p.dk_row_stride;
  T* gdV = static_cast<T*>(p.dv) + b * p.dv_batch_stride + hk * p.dv_head_stride + k_off * p.dv_row_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = n0 + key_row0 + g + r * 8;
    if (key < p.seqlen_k) {
#pragma unroll
      for (int dt = 0; dt < DTILES; ++dt) {
        if (dt * 8 >= p.head_dim) break;  // columns past the call's head dim are padding
        const int col = dt * 8 + 2 * t;
        if constexpr (kDK) {
          *reinterpret_cast<uint32_t*>(gdK + key * p.dk_row_stride + col) =
              pack2<T>(dk[dt][2 * r] * p.softmax_scale, dk[dt][2 * r + 1] * p.softmax_scale);
        }
        if constexpr (kDV) {
          *reinterpret_cast<uint32_t*>(gdV + key * p.dv_row_stride + col) = pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
        }
      }
    }
  }
}

template <typename Traits, bool kBanded>
__global__ void __launch_bounds__(Traits::kNThreads) attn_bwd_dq_kernel(const AttnParams params) {
  AttnParams p = params;  // select_sequence narrows this copy to the block's sequence
  using T = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int BM = Traits::kBlockM;
  constexpr int BN = Traits::kBlockN;
  constexpr int NT = Traits::kNThreads;
  constexpr int NTILES = Traits::kNTiles;
  constexpr int DTILES = Traits::kDTiles;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + Traits::kSmemQ;
  // Stage s: K at sK + s * kSmemKV, V at sV + s * kSmemKV (see the dK/dV kernel on why not arrays).
  T* sK = sdO + Traits::kSmemQ;
  T* sV = sK + 2 * Traits::kSmemKV;

  const int m_block = blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / p.head_group;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int m0 = m_block * BM;
  const int q_row0 = warp * 16;

  int q_off, k_off;
  select_sequence(p, b, q_off, k_off);
  if (m0 >= p.seqlen_q) return;  // varlen: the grid covers the longest sequence

  const T* gQ = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride +
                (q_off + m0) * p.q_row_stride;
  const T* gdO = static_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride +
                 (q_off + m0) * p.do_row_stride;
  const T* gK = static_cast<const T*>(p.k) + b * p.k_batch_stride + hk * p.k_head_stride + k_off * p.k_row_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride + k_off * p.v_row_stride;

  const BlockRange keys = key_blocks<kBanded>(p, m0, BM, BN);
  const int n_block_min = keys.first, n_block_max = keys.last;

  // This thread's two rows: lse (times log2 e) and delta stay in registers for the whole block.
  float lse_r[2], delta_r[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = m0 + q_row0 + g + r * 8;
    const int64_t row = b * p.lse_batch_stride + h * p.lse_head_stride + q_off + i;
    lse_r[r] = i < p.seqlen_q ? p.lse[row] * kLog2e : INFINITY;
    delta_r[r] = i < p.seqlen_q ? p.delta[row] : 0.f;
  }

  float dq[DTILES][4];
#pragma unroll
  for (int dt = 0; dt < DTILES; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[dt][e] = 0.f;

  auto issue_kv = [&](int n_block, int stage) {
    const int n0 = n_block * BN;
    load_tile_async<BN, D, NT>(sK + stage * Traits::kSmemKV, gK + n0 * p.k_row_stride, p.k_row_stride,
                               p.seqlen_k - n0, p.head_dim, tid);
    load_tile_async<BN, D, NT>(sV + stage * Traits::kSmemKV, gV + n0 * p.v_row_stride, p.v_row_stride,
                               p.seqlen_k - n0, p.head_dim, tid);
  };

  if (n_block_min < n_block_max) {
    load_tile_async<BM, D, NT>(sQ, gQ, p.q_row_stride, p.seqlen_q - m0, p.head_dim, tid);
    load_tile_async<BM, D, NT>(sdO, gdO, p.do_row_stride, p.seqlen_q - m0, p.head_dim, tid);
    issue_kv(n_block_min, 0);
    cp_async_commit();
  }

  // dO sits right after Q, V's stages after K's: one loader per operand shape (byte offsets below).
  const FragLoader<D, Frag::kA> frag_qdo(sQ, q_row0, lane);
  const FragLoader<D, Frag::kBRows> frag_kv(sK, 0, lane);
  const FragLoader<D, Frag::kBRowsT> frag_k_t(sK, 0, lane);
  constexpr uint32_t kDOBytes = Traits::kSmemQ * sizeof(T);
  constexpr uint32_t kVBytes = 2 * Traits::kSmemKV * sizeof(T);

  for (int n_block = n_block_min; n_block < n_block_max; ++n_block) {
    const int stage = (n_block - n_block_min) & 1;
    const int n0 = n_block * BN;
    cp_async_wait<0>();
    __syncthreads();  // this block's K/V landed; every warp finished the previous one, whose stage is reused next
    if (n_block + 1 < n_block_max) {
      issue_kv(n_block + 1, stage ^ 1);
      cp_async_commit();
    }
    const uint32_t stage_bytes = stage * Traits::kSmemKV * sizeof(T);

    float s[NTILES][4];
    float dp[NTILES][4];
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t aq[4], ao[4];
      frag_qdo.load(aq, 0, kk * 16);
      frag_qdo.load(ao, 0, kk * 16, kDOBytes);
#pragma unroll
      for (int np = 0; np < NTILES / 2; ++np) {
        uint32_t bk[4], bv[4];
        frag_kv.load(bk, np * 16, kk * 16, stage_bytes);
        frag_kv.load(bv, np * 16, kk * 16, stage_bytes + kVBytes);
        Mma16816<T>::run(s[2 * np], aq, bk[0], bk[1]);
        Mma16816<T>::run(s[2 * np + 1], aq, bk[2], bk[3]);
        Mma16816<T>::run(dp[2 * np], ao, bv[0], bv[1]);
        Mma16816<T>::run(dp[2 * np + 1], ao, bv[2], bv[3]);
      }
    }

    const bool full = block_fully_visible<kBanded>(p, m0, BM, n0, BN);
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int query = m0 + q_row0 + g + r * 8;
        const int key = n0 + nt * 8 + 2 * t + (e & 1);
        float pv = fast_exp2(fmaf(s[nt][e], p.scale_log2, -lse_r[r]));
        if (!full && !key_visible<kBanded>(p, query, key)) pv = 0.f;
        dp[nt][e] = pv * (dp[nt][e] - delta_r[r]);
      }
    }

    // dQ += dS K (k dimension = the BN keys; K stored (key, d) is B as (k, n): transposing load).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t ads[4];
      acc_to_a_frag<T>(ads, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dpair = 0; dpair < DTILES / 2; ++dpair) {
        uint32_t bk[4];
        frag_k_t.load(bk, kk * 16, dpair * 16, stage_bytes);
        Mma16816<T>::run(dq[2 * dpair], ads, bk[0], bk[1]);
        Mma16816<T>::run(dq[2 * dpair + 1], ads, bk[2], bk[3]);
      }
    }
  }

  T* gdQ = static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride + (q_off + m0) * p.dq_row_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q_row0 + g + r * 8;
    if (m0 + row < p.seqlen_q) {
#pragma unroll
      for (int dt = 0; dt < DTILES; ++dt) {
        if (dt * 8 >= p.head_dim) break;  // columns past the call's head dim are padding
        *reinterpret_cast<uint32_t*>(gdQ + row * p.dq_row_stride + dt * 8 + 2 * t) =
            pack2<T>(dq[dt][2 * r] * p.softmax_scale, dq[dt][2 * r + 1] * p.softmax_scale);
      }
    }
  }
}

}  // namespace flash_kernels
