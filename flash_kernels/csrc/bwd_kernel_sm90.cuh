// Backward for Hopper (sm_90a), device code only (launch: bwd_launch_sm90.cuh): the dK/dV kernel below and
// the dQ kernel after it, the same math as attn_bwd_dkdv_kernel / attn_bwd_dq_kernel (bwd_kernel.cuh), laid
// out like the Hopper forward (fwd_kernel_sm90.cuh). dK/dV:
//   - a copy warpgroup: one thread copies K and V of the block once and, per step, Q and dO of one query
//     block (TMA) into a two-stage ring. 24 registers.
//   - two math warpgroups of 64 keys each, 240 registers; per step (64 queries of one q head):
//       S^T = K Q^T, dP^T = V dO^T     wgmma m64n64k16, operands from shared memory
//       P^T = exp2(S^T * scale log2 e - lse log2 e), masked;  dS^T = P^T (dP^T - delta)
//         (lse and delta of the step's queries: each math warpgroup's threads read one each from global
//         memory a step ahead and stage them in shared memory of their own, behind a named barrier)
//       dV += P^T dO, dK += dS^T Q      wgmma m64n64k16 per 64-column atom, P^T / dS^T from registers
//       dQ_tile = dS K                  both warpgroups' dS^T, stored to shared memory, times K; each
//                                       warpgroup takes half of dQ's columns
//     and the copy warpgroup's second warp adds the dQ tile to a float32 workspace in a fixed order
//     (dq_accum.cuh), so the scores are computed once (five products a step where a separate dQ kernel
//     would need seven) and the result stays deterministic.
// Above head dim 128 the dK and dV accumulators of 64 keys no longer fit in one warpgroup's registers
// together (256 fp32 per thread at 256), so both math warpgroups take the same 64 keys and each keeps the
// dK/dV columns of one head-dim half (BwdSm90Split), and they split a step by role (SplitBarriers):
// warpgroup 0 computes S^T, P^T and dS^T, warpgroup 1 dP^T, and the two hand them over through shared
// memory, so each product is issued once. There dQ comes from the dQ kernel below, which does the same with
// queries. A step walks every (q head of the kv head's group, query block) pair, so GQA sums its heads' dK
// and dV in registers.
#pragma once
#include <cuda.h>

#include <cmath>

#include "attn_mask.cuh"
#include "attn_params.h"
#include "dq_accum.cuh"
#include "wgmma_primitives.cuh"

namespace flash_kernels {

// How the two math warpgroups share a block's rows and the head dim's 64-column atoms. Up to head dim 128
// each takes 64 rows of its own and every atom. Above it both take the same 64 rows and each the
// accumulator atoms [acc_atom0, acc_atom0 + kAccAtoms): halves at 256; at 192 (3 atoms) two atoms each,
// overlapping in atom 1, which only warpgroup 0 stores (kept as work rather than a third accumulator shape).
template <int kHeadDim>
struct BwdSm90Split {
  static constexpr int kAtoms = kHeadDim / kAtomCols;
  static constexpr bool kSplit = kHeadDim > 128;
  static constexpr int kRowsPerBlock = kSplit ? 64 : 128;
  static constexpr int kAccAtoms = kSplit ? (kAtoms + 1) / 2 : kAtoms;
  static_assert(kHeadDim % kAtomCols == 0 && kAccAtoms <= 2, "an accumulator pair must fit in registers");
  __device__ __forceinline__ static int row0(int wg) { return kSplit ? 0 : wg * 64; }
  __device__ __forceinline__ static int acc_atom0(int wg) { return kSplit ? wg * (kAtoms - kAccAtoms) : 0; }
  // Leading accumulator atoms this warpgroup computes but the other one stores.
  __device__ __forceinline__ static int shared_atoms(int wg) { return kSplit && wg ? 2 * kAccAtoms - kAtoms : 0; }
};

// 128 keys (two math warpgroups of 64; 64 keys shared by both above head dim 128), 64 queries per step.
// Registers per math thread at head dim 128 (and, by the split, at 192 and 256): dK and dV 64 each, S^T and
// dP^T 32 each, their 16-bit copies 16 each, and (single pass) half a dQ tile, 32. Shared memory: K, V,
// 2 stages x (Q, dO), lse/delta 2 KB and, single pass, two buffers of dS^T (16 KB each) and the dQ tile in
// fp32 (32 KB): 194 KB at head dim 128 (32 + 32 + 64 + 2 + 64); at 256 (64 keys) 32 + 32 + 128, lse/delta
// 1 KB and the exchange (dP^T in fp32 16 KB, P^T and dS^T 8 KB each): 226 KB.
template <typename Element_, int kHeadDim_>
struct BwdSm90Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  using Split = BwdSm90Split<kHeadDim>;
  static constexpr bool kAccumDq = sm90_bwd_accumulates_dq(kHeadDim);
  static_assert(kAccumDq != Split::kSplit, "single pass exactly where the warpgroups do not split a step");
  static constexpr int kBlockN = Split::kRowsPerBlock;  // keys
  static constexpr int kBlockM = 64;                    // queries per step
  static constexpr int kMathWarpgroups = 2;
  static constexpr int kNThreads = (kMathWarpgroups + 1) * 128;
  static constexpr int kStages = 2;
  static constexpr int kAtoms = kHeadDim / kAtomCols;
  static constexpr int kTileKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kTileQBytes = kBlockM * kHeadDim * 2;
  // K, V, then per stage Q, dO; then per warpgroup that computes P^T two buffers of lse, delta (floats);
  // when split, the exchange (dP^T in fp32, then the 16-bit P^T and dS^T atoms), else two buffers of dS^T
  // (one atom of 64 keys x 64 queries per math warpgroup) and the dQ tile; then the mbarriers (K/V full;
  // per stage full and empty).
  static constexpr int kStatWarpgroups = Split::kSplit ? 1 : kMathWarpgroups;
  static constexpr int kRowStatsOffset = 2 * kTileKVBytes + 2 * kStages * kTileQBytes;
  static constexpr int kRowStatsFloats = 2 * kBlockM;  // lse, then delta, of one step
  static constexpr int kExchangeOffset = kRowStatsOffset + kStatWarpgroups * 2 * kRowStatsFloats * 4;
  static constexpr int kDsBufferBytes = kBlockN * kBlockM * 2;
  static constexpr int kDqTileOffset = kExchangeOffset + 2 * kDsBufferBytes;
  static_assert(kBlockM == kDqTileRows, "a step is one tile of the dQ workspace");
  static constexpr int kExchangeBytes =
      Split::kSplit ? kBlockN * kBlockM * (4 + 2 + 2) : 2 * kDsBufferBytes + kBlockM * kHeadDim * 4;
  static constexpr int kBarrierOffset = kExchangeOffset + kExchangeBytes;
  static constexpr int kSmemBytes = kBarrierOffset + 8 * (1 + 2 * kStages) + kAtomBytes;
  static_assert(kExchangeOffset % kAtomBytes == 0, "the exchanged atoms need the swizzle alignment");
  static_assert(kSmemBytes <= 227 * 1024, "over the shared memory of a Hopper SM");
};

// Above head dim 128 the two math warpgroups split a step's work by role instead of taking turns:
// warpgroup 0 computes S^T (S in the dQ kernel), P^T and dS^T, warpgroup 1 dP^T (dP), which it hands to
// warpgroup 0 in fp32 through shared memory; warpgroup 0 stores the 16-bit P^T and dS^T (dS) as K-major
// atoms that both warpgroups' wgmma read as their A operand. Each product of a step is then issued
// once (four 64x64xD-equivalents a step in dK/dV, three in dQ, instead of six and five). The named
// barriers of the hand-over (warpgroup 0's lse/delta barrier is WarpgroupTurns::kBarriersUsed):
struct SplitBarriers {
  static constexpr int kScoresReady = WarpgroupTurns::kBarriersUsed + 2;  // warpgroup 1's dP^T / dP stashed
  static constexpr int kOperandsReady = kScoresReady + 1;                  // warpgroup 0's P^T, dS^T / dS stored
};

// The named barriers of the single-pass kernel (no turns there; lse/delta use kBarriersUsed + wg):
struct AccumBarriers {
  static constexpr int kDsReady = WarpgroupTurns::kBarriersUsed + 2;  // both math warpgroups stored dS^T
  static constexpr int kDqFree = kDsReady + 1;   // the dQ writer warp has read the last tile: refill it
  static constexpr int kDqReady = kDsReady + 2;  // the math warpgroups stored this step's tile
  static constexpr int kThreads = 256 + 32;      // both math warpgroups and the writer warp
};

// A split step's product (S^T or dP^T in dK/dV, S or dP in dQ: 64 x 64 over the head dim) from the resident
// 64-row tile at a_addr and the step's tile at b_addr, once the step's stage is full; one commit group.
template <typename T, int kHeadDim, int kStages>
__device__ __forceinline__ void issue_split_scores(float (&d)[32], const StageRing<kStages>& ring, int i,
                                                   uint32_t a_addr, uint32_t b_addr) {
  ring.wait_full(i);
  fence_operands(d);
  wgmma_fence();
  wgmma_rows_x_rows<T, kHeadDim, 64, 64>(d, a_addr, 0, b_addr);
  wgmma_commit();
}

// The elementwise part of a step, on a 64 x 64 wgmma accumulator (element e of tile j: row g + (e/2)*8,
// column 8j + 2t + e%2 of the warp's 16 rows). dK/dV works on transposes (rows are keys, columns queries),
// dQ on rows of queries. P = exp2(S * scale log2 e - lse log2 e), 0 where masked, in place; lse (times
// log2 e) per query column (dK/dV, `key_row` = the thread's row g) or per row (dQ, `query_row` likewise).
template <bool kBanded>
__device__ __forceinline__ void probs_t_in_place(float (&st)[32], const AttnParams& p, const float* lse, int m0,
                                                 int key_row, bool full) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int qt = 0; qt < 8; ++qt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qcol = qt * 8 + 2 * t + (e & 1);
      float pv = fast_exp2(fmaf(st[qt * 4 + e], p.scale_log2, -lse[qcol]));
      if (!full && !key_visible<kBanded>(p, m0 + qcol, key_row + (e >> 1) * 8)) pv = 0.f;
      st[qt * 4 + e] = pv;
    }
}
// dS^T = P^T (dP^T - delta), in place in dpt.
__device__ __forceinline__ void grad_scores_t_in_place(float (&dpt)[32], const float (&pt)[32], const float* delta) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int qt = 0; qt < 8; ++qt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dpt[qt * 4 + e] = pt[qt * 4 + e] * (dpt[qt * 4 + e] - delta[qt * 8 + 2 * t + (e & 1)]);
}
template <bool kBanded>
__device__ __forceinline__ void probs_in_place(float (&s)[32], const AttnParams& p, const float (&lse2)[2],
                                               int query_row, int n0, bool full) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pv = fast_exp2(fmaf(s[nt * 4 + e], p.scale_log2, -lse2[e >> 1]));
      if (!full && !key_visible<kBanded>(p, query_row + (e >> 1) * 8, n0 + nt * 8 + 2 * t + (e & 1))) pv = 0.f;
      s[nt * 4 + e] = pv;
    }
}
// dS = P (dP - delta) as 16-bit A fragments (acc_to_frags' layout).
template <typename T>
__device__ __forceinline__ void grad_scores_frags(uint32_t (&dsf)[4][4], const float (&pm)[32], const float (&dp)[32],
                                                  const float (&delta)[2]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i2 = 0; i2 < 4; ++i2) {
      const int e0 = 8 * kk + 2 * i2;  // elements e0, e0 + 1 share a row: (e0 % 4) / 2
      const float d = delta[(e0 % 4) >> 1];
      dsf[kk][i2] = pack2<T>(pm[e0] * (dp[e0] - d), pm[e0 + 1] * (dp[e0 + 1] - d));
    }
}

// Tensor maps of q, k, v, dout (fwd_launch_sm90.cuh's make_tensor_map).
struct Sm90BwdTensorMaps {
  CUtensorMap q, k, v, dout;
};

template <typename Traits, bool kBanded>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    attn_bwd_dkdv_sm90_kernel(const AttnParams params, const __grid_constant__ Sm90BwdTensorMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  AttnParams p = params;
  using T = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int BM = Traits::kBlockM;
  constexpr int BN = Traits::kBlockN;
  constexpr int ATOMS = Traits::kAtoms;
  using Split = typename Traits::Split;
  constexpr int ACC = Split::kAccAtoms;
  constexpr int QTILES = BM / 8;
  constexpr int STAGES = Traits::kStages;
  constexpr int kMathThreads = Traits::kMathWarpgroups * 128;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t k_addr = swizzle_aligned_base(smem_raw);
  const uint32_t v_addr = k_addr + Traits::kTileKVBytes;
  // Step i: Q at q_addr(i), dO right after it.
  auto q_addr = [&](int i) { return v_addr + Traits::kTileKVBytes + 2 * (i % STAGES) * Traits::kTileQBytes; };
  const uint32_t bar_kv = k_addr + Traits::kBarrierOffset;
  const StageRing<STAGES> ring{bar_kv + 8};
  // Per math warpgroup, two buffers of lse/delta (see the math warpgroups below).
  float* const row_stats =
      reinterpret_cast<float*>(smem_raw + (k_addr - smem_addr(smem_raw)) + Traits::kRowStatsOffset);

  // Single pass: the highest key block first, the order in which they add to dQ (dq_accum.cuh).
  const int n_block = Traits::kAccumDq ? static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x) : blockIdx.x;
  const int hk = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int n0 = n_block * BN;
  const bool varlen = p.cu_seqlens_q != nullptr;

  int q_off, k_off;
  select_sequence(p, b, q_off, k_off);
  if (n0 >= p.seqlen_k) return;  // varlen: the grid covers the longest sequence
  const int map_b = varlen ? 0 : b;

  const BlockRange queries = query_blocks<kBanded>(p, n0, BN, BM);
  const int m_block_min = queries.first, m_blocks = queries.last - queries.first;
  const int steps = m_blocks * p.head_group;  // (q head of the group, query block) pairs

  if (tid == 0) {
    mbar_init(bar_kv, 1);
    ring.init(kMathThreads / 32);
    mbar_init_fence();
  }
  __syncthreads();

  if (tid < 128) {
    setmaxnreg_dec<24>();
    if constexpr (Traits::kAccumDq) {
      if (tid / 32 == 1 && steps > 0) {
        // The dQ writer: per step, once the math warpgroups stored the tile, wait for this key block's turn,
        // add the tile to the workspace, free the buffer when it has been read, and pass the turn on when
        // the addition is done.
        const int lane = tid % 32;
        const uint32_t tile_smem = k_addr + Traits::kDqTileOffset;
        named_bar_arrive(AccumBarriers::kDqFree, AccumBarriers::kThreads);
        for (int i = 0; i < steps; ++i) {
          const int h = hk * p.head_group + i / m_blocks;
          const int m_block = m_block_min + i % m_blocks;
          int* const counter = dq_tile_counter(p, b, q_off, h, m_block * BM);
          named_bar_sync(AccumBarriers::kDqReady, AccumBarriers::kThreads);
          if (lane == 0) {
            wait_counter_equals(counter, dq_add_rank<kBanded>(p, m_block, n_block, BM, BN));
            fence_async_global();
            bulk_reduce_add_f32(dq_accum_tile<D>(p, b, q_off, h, m_block * BM), tile_smem, BM * D * 4);
            bulk_wait_read();
          }
          __syncwarp();
          if (i + 1 < steps) named_bar_arrive(AccumBarriers::kDqFree, AccumBarriers::kThreads);
          if (lane == 0) {
            bulk_wait_done();
            fence_async_global();
            counter_release_increment(counter);
          }
          // The named barriers are .aligned: the whole warp must reach the next one together.
          __syncwarp();
        }
      }
    }
    if (tid != 0 || steps == 0) return;
    mbar_arrive_expect_tx(bar_kv, 2 * Traits::kTileKVBytes);
    tma_load_tile<ATOMS, BN>(k_addr, &maps.k, k_off + n0, hk, map_b, bar_kv);
    tma_load_tile<ATOMS, BN>(v_addr, &maps.v, k_off + n0, hk, map_b, bar_kv);
    for (int i = 0; i < steps; ++i) {
      const int h = hk * p.head_group + i / m_blocks;
      const int m0 = (m_block_min + i % m_blocks) * BM;
      ring.acquire(i);
      ring.expect(i, 2 * Traits::kTileQBytes);
      tma_load_tile<ATOMS, BM>(q_addr(i), &maps.q, q_off + m0, h, map_b, ring.full(i));
      tma_load_tile<ATOMS, BM>(q_addr(i) + Traits::kTileQBytes, &maps.dout, q_off + m0, h, map_b, ring.full(i));
    }
    return;
  }

  setmaxnreg_inc<240>();
  const int wg = tid / 128 - 1;
  const int warp = (tid % 128) / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int wg_row0 = Split::row0(wg);       // this warpgroup's first key within the block
  const int key_row0 = wg_row0 + warp * 16;  // this warp's
  // This warpgroup's accumulator columns: byte offset of its first atom in a BM-row tile.
  const uint32_t acc_tile_off = Split::acc_atom0(wg) * BM * 128;
  static_assert(kMathThreads == 256, "two math warpgroups");

  float dk[ACC][32];
  float dv[ACC][32];
#pragma unroll
  for (int a = 0; a < ACC; ++a)
#pragma unroll
    for (int i = 0; i < 32; ++i) dk[a][i] = dv[a][i] = 0.f;

  // lse (times log2 e) and delta of a step's BM queries: thread j of the warpgroup reads one (lse of query
  // j, or delta of query j - BM) a step ahead and stores it, at the step, into one of two buffers of its
  // warpgroup while the step's S^T and dP^T run on the tensor cores; the warpgroup's named barrier right
  // after orders those stores before every thread's reads of step i, and those reads before the stores of
  // step i + 2 into the same buffer. (Staged by the copy warp and handed over through the stage's
  // mbarrier instead, these plain stores are what compute-sanitizer's racecheck reports as races.)
  // lse = +inf (P = 0) and delta = 0 for rows past the sequence's end.
  static_assert(Traits::kRowStatsFloats == 128, "one value per thread of the warpgroup");
  const int stat_j = tid % 128;
  const bool stat_is_lse = stat_j < BM;
  const int stats_barrier = WarpgroupTurns::kBarriersUsed + wg;
  auto load_row_stat = [&](int i) {
    const int h = hk * p.head_group + i / m_blocks;
    const int r = (m_block_min + i % m_blocks) * BM + (stat_is_lse ? stat_j : stat_j - BM);
    if (r >= p.seqlen_q) return stat_is_lse ? INFINITY : 0.f;
    const int64_t row = b * p.lse_batch_stride + h * p.lse_head_stride + q_off + r;
    return stat_is_lse ? p.lse[row] * 1.4426950408889634f : p.delta[row];
  };
  float next_stat = 0.f;

  if constexpr (Split::kSplit) {
    float* const dpt_buf =
        reinterpret_cast<float*>(smem_raw + (k_addr - smem_addr(smem_raw)) + Traits::kExchangeOffset);
    const uint32_t pt_addr = k_addr + Traits::kExchangeOffset + BN * BM * 4;
    const uint32_t dst_addr = pt_addr + BN * BM * 2;
    // Every wgmma is issued outside the warpgroup branches, by both warpgroups with their own addresses:
    // ptxas serializes all wgmma of a kernel when it finds one in a path it cannot prove warpgroup-uniform,
    // or (with this loop's structure) one whose accumulator is read or written while another is in flight,
    // so each step waits for all its products (wait<0>) and the next step's S^T / dP^T, issued right after
    // this step's dV/dK update, keeps the tensor cores busy meanwhile.
    float sx[QTILES * 4];  // S^T, then P^T (warpgroup 0), or dP^T (warpgroup 1)
    const uint32_t scores_a = wg == 0 ? k_addr : v_addr;
    const uint32_t scores_b_off = wg == 0 ? 0 : Traits::kTileQBytes;
    auto issue_scores = [&](int i) { issue_split_scores<T, D>(sx, ring, i, scores_a, q_addr(i) + scores_b_off); };
    if (steps > 0) {
      if (wg == 0) next_stat = load_row_stat(0);
      mbar_wait(bar_kv, 0);
      fence_operands(dv);  // the zeros are written before any wgmma is in flight
      fence_operands(dk);
      issue_scores(0);
    }
    for (int i = 0; i < steps; ++i) {
      const int m0 = (m_block_min + i % m_blocks) * BM;
      const bool last = i == steps - 1;
      const uint32_t qa = q_addr(i), doa = q_addr(i) + Traits::kTileQBytes;
      // This step's S^T or dP^T, and the last step's dV/dK update, which read stage i - 1 and the exchanged
      // P^T / dS^T. Warpgroup 1 hands dP^T over only after this wait, so warpgroup 0, which waits for that
      // hand-over, overwrites P^T / dS^T after both warpgroups' updates read them.
      wgmma_wait<0>();
      fence_operands(sx);
      fence_operands(dv);
      fence_operands(dk);
      if (i > 0) ring.release(i - 1, lane);
      if (wg == 0) {
        float* const stats = row_stats + (i % 2) * Traits::kRowStatsFloats;
        stats[stat_j] = next_stat;
        named_bar_sync(stats_barrier, 128);
        const float* lse = stats;
        const float* delta = stats + BM;
        const bool full = block_fully_visible<kBanded>(p, m0, BM, n0, BN);
        probs_t_in_place<kBanded>(sx, p, lse, m0, n0 + key_row0 + g, full);
        float dpt[QTILES * 4];
        named_bar_sync(SplitBarriers::kScoresReady, 256);
        unstash_acc(dpt, dpt_buf);
        grad_scores_t_in_place(dpt, sx, delta);
        uint32_t f[BM / 16][4];
        acc_to_frags<T, BM>(sx, f);
        store_frags_sw128<BM>(f, pt_addr);
        acc_to_frags<T, BM>(dpt, f);
        store_frags_sw128<BM>(f, dst_addr);
        // The fence compiles to a memory barrier, which can wait for this thread's loads in flight: the next
        // step's lse/delta load is issued after it.
        fence_async_shared();
        if (!last) next_stat = load_row_stat(i + 1);
      } else {
        stash_acc(sx, dpt_buf);
        // A full barrier, not an arrival: warpgroup 1 has nothing else to do until the operands are ready,
        // and with an arrival racecheck reported the stash and warpgroup 0's reads as racing (dQ, 3 steps).
        named_bar_sync(SplitBarriers::kScoresReady, 256);
      }
      // Both warpgroups read P^T and dS^T from shared memory, warpgroup 0 its own stores included.
      named_bar_sync(SplitBarriers::kOperandsReady, 256);
      wgmma_fence();
      wgmma_tile_x_rows<T, ACC, BM>(dv, pt_addr, doa + acc_tile_off);
      wgmma_tile_x_rows<T, ACC, BM>(dk, dst_addr, qa + acc_tile_off);
      wgmma_commit();
      if (!last) issue_scores(i + 1);
    }
    wgmma_wait<0>();  // also where no step ran: ptxas then sees every path to the stores wait
    fence_operands(dv);
    fence_operands(dk);
    if (steps > 0) ring.release(steps - 1, lane);
  } else {
    // Single pass. Every wgmma is issued by both warpgroups at the same points (see the split loop). A step
    // waits for S^T and dP^T, then for the dV/dK update and this warpgroup's half of the dQ tile, which
    // needs the other warpgroup's dS^T too (hence the barrier between them). Issuing the next step's S^T
    // and dP^T before this step's hand-over to the writer warp made ptxas serialize every wgmma (spills at
    // head dim 128; C7515 at 64 without a mask), so a step issues its own.
    constexpr int kDqCols = D / 2;  // this warpgroup's columns of the dQ tile
    float* const dq_smem = reinterpret_cast<float*>(smem_raw + (k_addr - smem_addr(smem_raw)) +
                                                    Traits::kDqTileOffset) +
                           wg * (BM * kDqCols);
    // dS^T of step i: one 64-key atom per warpgroup, in one of two buffers, so that a warpgroup can store
    // step i + 1's while the other still reads step i's (it waited for step i - 1's reads before storing i).
    auto ds_addr = [&](int i) { return k_addr + Traits::kExchangeOffset + (i % 2) * Traits::kDsBufferBytes; };
    // K as the B operand of dQ = dS K: keys are the reduction dim, this warpgroup's columns the output's.
    const uint32_t k_cols_addr = k_addr + (wg * kDqCols / kAtomCols) * BN * 128 + (wg * kDqCols % kAtomCols) * 2;
    // S^T = K Q^T and dP^T = V dO^T of step i (this warpgroup's 64 keys x BM queries), two commit groups.
    float st[QTILES * 4], dpt[QTILES * 4];
    auto issue_scores = [&](int i) {
      ring.wait_full(i);
      fence_operands(st);
      fence_operands(dpt);
      wgmma_fence();
      wgmma_rows_x_rows<T, D, BN, BM>(st, k_addr, wg_row0, q_addr(i));
      wgmma_commit();
      wgmma_rows_x_rows<T, D, BN, BM>(dpt, v_addr, wg_row0, q_addr(i) + Traits::kTileQBytes);
      wgmma_commit();
    };
    if (steps > 0) {
      next_stat = load_row_stat(0);
      mbar_wait(bar_kv, 0);
      fence_operands(dv);  // the zeros are written before any wgmma is in flight
      fence_operands(dk);
    }
    for (int i = 0; i < steps; ++i) {
      const int m0 = (m_block_min + i % m_blocks) * BM;
      const bool last = i == steps - 1;
      const uint32_t qa = q_addr(i), doa = q_addr(i) + Traits::kTileQBytes;
      issue_scores(i);
      float* const stats = row_stats + (2 * wg + i % 2) * Traits::kRowStatsFloats;
      stats[stat_j] = next_stat;
      named_bar_sync(stats_barrier, 128);
      const float* lse = stats;
      const float* delta = stats + BM;

      // P^T while dP^T runs. Element e of tile qt: key row g + (e/2)*8, query column qt*8 + 2t + e%2.
      wgmma_wait<1>();
      fence_operands(st);
      const bool full = block_fully_visible<kBanded>(p, m0, BM, n0, BN);
      probs_t_in_place<kBanded>(st, p, lse, m0, n0 + key_row0 + g, full);
      wgmma_wait<0>();
      fence_operands(dpt);
      grad_scores_t_in_place(dpt, st, delta);

      // dV += P^T dO, dK += dS^T Q (k dimension = the BM queries); dS^T also to shared memory for dQ.
      uint32_t pf[BM / 16][4], dsf[BM / 16][4];
      acc_to_frags<T, BM>(st, pf);
      acc_to_frags<T, BM>(dpt, dsf);
      store_frags_sw128<BM>(dsf, ds_addr(i) + wg * (Traits::kDsBufferBytes / 2));
      fence_async_shared();
      // After the fence, which compiles to a memory barrier that would wait for the load; it has the rest
      // of the step to arrive, until the hand-over's fence.
      if (!last) next_stat = load_row_stat(i + 1);
      fence_operands(dv);
      fence_operands(dk);
      wgmma_fence();
      wgmma_frags_x_rows<T, ACC, BM>(dv, pf, doa);
      wgmma_frags_x_rows<T, ACC, BM>(dk, dsf, qa);
      wgmma_commit();

      // This warpgroup's columns of dQ_tile = dS K over the block's BN keys: A is dS^T read transposed
      // (queries are its rows), one atom of 64 keys per warpgroup; B is K read N-major.
      named_bar_sync(AccumBarriers::kDsReady, 256);
      float dq[kDqCols / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        const uint32_t a = ds_addr(i) + (kk / 4) * (Traits::kDsBufferBytes / 2) + (kk % 4) * 16 * 128;
        Wgmma<T>::template ss_m64nNk16<kDqCols, 1, 1>(dq, smem_desc_sw128(a),
                                                      smem_desc_sw128(k_cols_addr + kk * 16 * 128), kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dv);
      fence_operands(dk);
      fence_operands(dq);
      ring.release(i, lane);

      // Hand the tile to the writer warp once it has read the last one.
      named_bar_sync(AccumBarriers::kDqFree, AccumBarriers::kThreads);
      stash_acc(dq, dq_smem);
      fence_async_shared();
      named_bar_arrive(AccumBarriers::kDqReady, AccumBarriers::kThreads);
    }
  }

  // Store (zeros for keys no query sees, so dK/dV are always fully written).
  const int col0 = Split::acc_atom0(wg) * kAtomCols;
  T* gdK = static_cast<T*>(p.dk) + b * p.dk_batch_stride + hk * p.dk_head_stride + k_off * p.dk_row_stride + col0;
  T* gdV = static_cast<T*>(p.dv) + b * p.dv_batch_stride + hk * p.dv_head_stride + k_off * p.dv_row_stride + col0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = n0 + key_row0 + g + r * 8;
    if (key < p.seqlen_k) {
      store_acc_row<T, ACC>(gdK + key * p.dk_row_stride, dk, r, p.softmax_scale, p.head_dim - col0,
                            Split::shared_atoms(wg));
      store_acc_row<T, ACC>(gdV + key * p.dv_row_stride, dv, r, 1.f, p.head_dim - col0, Split::shared_atoms(wg));
    }
  }
#else
  __trap();  // see attn_fwd_sm90_kernel
#endif
}

// Backward dQ for Hopper above head dim 128 (up to it the dK/dV kernel adds dQ itself): per block of 64
// queries of one q head, shared by both math warpgroups (each keeps half of dQ's columns, as in the dK/dV
// kernel, and they split a step by role), walk the visible keys 64 at a time; K and V stream through a
// two-stage ring (TMA), Q and dO stay. Per step:
//   S = Q K^T, dP = dO V^T   wgmma m64n64k16 from shared memory
//   P = exp2(S * scale log2 e - lse log2 e), masked;  dS = P (dP - delta)
//   dQ += dS K               wgmma m64n64k16 per 64-column atom, dS from shared memory, K N-major
template <typename Element_, int kHeadDim_>
struct BwdQSm90Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  using Split = BwdSm90Split<kHeadDim>;
  static_assert(Split::kSplit, "below the split the dK/dV kernel computes dQ");
  static constexpr int kBlockM = Split::kRowsPerBlock;  // queries
  static constexpr int kBlockN = 64;                    // keys per step
  static constexpr int kMathWarpgroups = 2;
  static constexpr int kNThreads = (kMathWarpgroups + 1) * 128;
  static constexpr int kStages = 2;
  static constexpr int kAtoms = kHeadDim / kAtomCols;
  static constexpr int kTileQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kTileKVBytes = kBlockN * kHeadDim * 2;
  // Q, dO, then per stage K, V; the exchange (dP in fp32, then the 16-bit dS atom); then the mbarriers
  // (Q/dO full; per stage full and empty).
  static constexpr int kExchangeOffset = 2 * kTileQBytes + 2 * kStages * kTileKVBytes;
  static constexpr int kExchangeBytes = kBlockM * kBlockN * (4 + 2);
  static constexpr int kBarrierOffset = kExchangeOffset + kExchangeBytes;
  static constexpr int kSmemBytes = kBarrierOffset + 8 * (1 + 2 * kStages) + kAtomBytes;
  static_assert(kExchangeOffset % kAtomBytes == 0, "the exchanged atom needs the swizzle alignment");
  static_assert(kSmemBytes <= 227 * 1024, "over the shared memory of a Hopper SM");
};

template <typename Traits, bool kBanded>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    attn_bwd_dq_sm90_kernel(const AttnParams params, const __grid_constant__ Sm90BwdTensorMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  AttnParams p = params;
  using T = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int BM = Traits::kBlockM;
  constexpr int BN = Traits::kBlockN;
  constexpr int ATOMS = Traits::kAtoms;
  using Split = typename Traits::Split;
  constexpr int ACC = Split::kAccAtoms;
  constexpr int NTILES = BN / 8;
  constexpr int STAGES = Traits::kStages;
  constexpr int kMathThreads = Traits::kMathWarpgroups * 128;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t q_addr = swizzle_aligned_base(smem_raw);
  const uint32_t do_addr = q_addr + Traits::kTileQBytes;
  // Step i: K at k_addr(i), V right after it.
  auto k_addr = [&](int i) { return do_addr + Traits::kTileQBytes + 2 * (i % STAGES) * Traits::kTileKVBytes; };
  const uint32_t bar_q = q_addr + Traits::kBarrierOffset;
  const StageRing<STAGES> ring{bar_q + 8};

  // Causal: the last query blocks see the most keys; start them first so the grid's tail is short ones.
  const int m_block = kBanded ? static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x) : blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / p.head_group;
  const int tid = threadIdx.x;
  const int m0 = m_block * BM;
  const bool varlen = p.cu_seqlens_q != nullptr;

  int q_off, k_off;
  select_sequence(p, b, q_off, k_off);
  if (m0 >= p.seqlen_q) return;  // varlen: the grid covers the longest sequence
  const int map_b = varlen ? 0 : b;

  const BlockRange keys = key_blocks<kBanded>(p, m0, BM, BN);
  const int n_block_min = keys.first, n_block_max = keys.last;
  const int n_steps = n_block_max - n_block_min;

  if (tid == 0) {
    mbar_init(bar_q, 1);
    ring.init(kMathThreads / 32);
    mbar_init_fence();
  }
  __syncthreads();

  if (tid < 128) {
    setmaxnreg_dec<24>();
    if (tid == 0 && n_steps > 0) {
      mbar_arrive_expect_tx(bar_q, 2 * Traits::kTileQBytes);
      tma_load_tile<ATOMS, BM>(q_addr, &maps.q, q_off + m0, h, map_b, bar_q);
      tma_load_tile<ATOMS, BM>(do_addr, &maps.dout, q_off + m0, h, map_b, bar_q);
      for (int i = 0; i < n_steps; ++i) {
        const int n0 = (n_block_max - 1 - i) * BN;
        ring.acquire(i);
        ring.expect(i, 2 * Traits::kTileKVBytes);
        tma_load_tile<ATOMS, BN>(k_addr(i), &maps.k, k_off + n0, hk, map_b, ring.full(i));
        tma_load_tile<ATOMS, BN>(k_addr(i) + Traits::kTileKVBytes, &maps.v, k_off + n0, hk, map_b, ring.full(i));
      }
    }
    return;
  }

  setmaxnreg_inc<240>();
  const int wg = tid / 128 - 1;
  const int warp = (tid % 128) / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int wg_row0 = Split::row0(wg);  // this warpgroup's first query within the block
  const int row0 = wg_row0 + warp * 16;  // this warp's
  const uint32_t acc_tile_off = Split::acc_atom0(wg) * BN * 128;  // its dQ columns in a BN-row K tile
  static_assert(kMathThreads == 256, "two math warpgroups");

  // lse (times log2 e) and delta of this thread's two rows; +inf / 0 past the end, so P = 0 there.
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int q = m0 + row0 + g + 8 * r;
    const int64_t row = b * p.lse_batch_stride + h * p.lse_head_stride + q_off + q;
    lse2[r] = q < p.seqlen_q ? p.lse[row] * 1.4426950408889634f : INFINITY;
    delta[r] = q < p.seqlen_q ? p.delta[row] : 0.f;
  }

  float dq[ACC][32];
#pragma unroll
  for (int a = 0; a < ACC; ++a)
#pragma unroll
    for (int i = 0; i < 32; ++i) dq[a][i] = 0.f;

  {
    float* const dp_buf =
        reinterpret_cast<float*>(smem_raw + (q_addr - smem_addr(smem_raw)) + Traits::kExchangeOffset);
    const uint32_t ds_addr = q_addr + Traits::kExchangeOffset + BM * BN * 4;
    float sx[NTILES * 4];  // S, then P (warpgroup 0), or dP (warpgroup 1); the loop is the dK/dV kernel's
    const uint32_t scores_a = wg == 0 ? q_addr : do_addr;
    const uint32_t scores_b_off = wg == 0 ? 0 : Traits::kTileKVBytes;
    auto issue_scores = [&](int i) { issue_split_scores<T, D>(sx, ring, i, scores_a, k_addr(i) + scores_b_off); };
    if (n_steps > 0) {
      mbar_wait(bar_q, 0);
      fence_operands(dq);  // the zeros are written before any wgmma is in flight
      issue_scores(0);
    }
    for (int i = 0; i < n_steps; ++i) {
      const int n0 = (n_block_max - 1 - i) * BN;
      const bool last = i == n_steps - 1;
      const uint32_t ka = k_addr(i);
      wgmma_wait<0>();  // this step's S or dP, and the last step's dQ update (see the dK/dV kernel)
      fence_operands(sx);
      fence_operands(dq);
      if (i > 0) ring.release(i - 1, lane);
      if (wg == 0) {
        const bool full = block_fully_visible<kBanded>(p, m0, BM, n0, BN);
        probs_in_place<kBanded>(sx, p, lse2, m0 + row0 + g, n0, full);
        float dp[NTILES * 4];
        named_bar_sync(SplitBarriers::kScoresReady, 256);
        unstash_acc(dp, dp_buf);
        uint32_t dsf[BN / 16][4];
        grad_scores_frags<T>(dsf, sx, dp, delta);
        store_frags_sw128<BN>(dsf, ds_addr);
        fence_async_shared();
      } else {
        stash_acc(sx, dp_buf);
        // A full barrier, not an arrival: warpgroup 1 has nothing else to do until the operands are ready,
        // and with an arrival racecheck reported the stash and warpgroup 0's reads as racing (dQ, 3 steps).
        named_bar_sync(SplitBarriers::kScoresReady, 256);
      }
      named_bar_sync(SplitBarriers::kOperandsReady, 256);  // dS in shared memory, for both warpgroups
      wgmma_fence();
      wgmma_tile_x_rows<T, ACC, BN>(dq, ds_addr, ka + acc_tile_off);
      wgmma_commit();
      if (!last) issue_scores(i + 1);
    }
    wgmma_wait<0>();  // see the dK/dV kernel
    fence_operands(dq);
    if (n_steps > 0) ring.release(n_steps - 1, lane);
  }

  const int col0 = Split::acc_atom0(wg) * kAtomCols;
  T* gdQ = static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride + (q_off + m0) * p.dq_row_stride +
           col0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + r * 8;
    if (m0 + row < p.seqlen_q) {
      store_acc_row<T, ACC>(gdQ + row * p.dq_row_stride, dq, r, p.softmax_scale, p.head_dim - col0,
                            Split::shared_atoms(wg));
    }
  }
#else
  __trap();  // see attn_fwd_sm90_kernel
#endif
}

}  // namespace flash_kernels
