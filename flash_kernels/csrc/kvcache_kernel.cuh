// KV-cache attention (flash_attn_with_kvcache's forward), device code only (launch: kvcache_launch.cuh).
//
// Decode reads each K/V byte once and does little arithmetic per byte, so the kernel is built around
// keeping HBM busy: the q heads of one kv head are packed into the rows of one tile (GQA: K and V are read
// once per group, not once per q head), keys stream through a multi-stage cp.async ring, and the key range
// of a (sequence, kv head) is split across blocks (split-KV) when there are too few of them to fill the GPU.
//
// Rows: packed row r of kv head hk is query r / head_group of q head hk * head_group + r % head_group.
// Keys are addressed by cache position: sequence b sees positions [kbeg, kend) = [cache_leftpad[b],
// cache_seqlens[b]), and query i aligns with position i + kend - seqlen_q (bottom-right, as flash_attn),
// so left padding is only a lower bound and key blocks stay aligned to positions (a 16-key group never
// straddles a page).
//
// Grid: x = m_block * num_splits + split, y = kv head, z = batch. With one split the block writes out and
// lse itself; with more, normalised float32 partials that kvcache_combine_kernel merges.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "attn_params.h"
#include "kernel_traits.h"
#include "mma_primitives.cuh"

namespace flash_kernels {

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Copies key blocks (K and V rows [n * kBlockN, (n + 1) * kBlockN) of one sequence and kv head) into ring
// stages. Each thread always copies the same 16-byte column of rows row0 + i * kRowStep (as load_rows_async)
// and 16 % kRowStep == 0, so its row i lies in 16-position group i / (16 / kRowStep) at a compile-time row
// offset: the group's address (and, paged, its block-table slot) is found once per group, not per row.
// A group never straddles a page: pages are multiples of 16 rows and key blocks start at multiples of 16.
// Only blocks that cross [kbeg, kend) test rows one by one (issue's two instantiations: the interior one
// has no per-row test at all, since decode's copy loop is short enough that its instruction count shows).
//
// Paged groups are resolved in two steps: lookup (the block-table read, issued a key block or more ahead so
// its latency hides) and entry (the group's K and V element offsets from the cache base, or -1 for an
// unmapped page or a position past kend). Decode shapes (Traits::kPageTable) keep the entries of the ring's
// key blocks in shared memory, computed by kGroups threads; the other threads only read them (at head dim
// 64 a key block is 8 groups per thread, and 8 table reads + 16 64-bit products per block per thread cost
// the paged copy loop more than twice the dense one's instructions).
template <typename Traits>
struct KvBlockLoader {
  using T = typename Traits::Element;
  static constexpr int D = Traits::kHeadDim;
  static constexpr int BN = Traits::kBlockN;
  static constexpr int kChunksPerRow = D / 8;
  static constexpr int kRowStep = Traits::kNThreads / kChunksPerRow;
  static constexpr int kGroups = BN / 16;
  static constexpr int kRowsPerGroup = 16 / kRowStep;
  static_assert(Traits::kNThreads % kChunksPerRow == 0, "each thread must keep one chunk column");
  static_assert(16 % kRowStep == 0, "a thread's rows must sit at fixed offsets inside 16-row groups");
  static_assert(!SmemTile<D>::kSwizzled || kRowStep % 8 == 0, "row step must keep the swizzle phase");
  static_assert(kGroups <= Traits::kNThreads, "one table writer per group");

  // A group's block-table entry: page id (-1: past kend) and the group's first row in that page.
  struct PageRef {
    int page, row;
  };
  // Per-thread lookups one key block ahead (shapes without the shared table).
  struct Pages {
    PageRef ref[kGroups];
  };

  const T* k_base;  // + kv head + this thread's (row0, column); dense: + the sequence's cache row
  const T* v_base;
  const T* k_mapped;  // the caches' first elements: the address an unread row hands to cp.async
  const T* v_mapped;
  int64_t k_row_stride, v_row_stride, k_page_stride, v_page_stride;
  const int* pages;  // the sequence's block-table row; null: dense
  int page_size, page_shift, num_pages;
  int kbeg, kend;
  int row0;
  int smem_off;      // SmemTile offset of (row0, column)
  bool col_valid;

  __device__ __forceinline__ PageRef lookup(int n, int g) const {
    const int pos = n * BN + 16 * g;
    PageRef r{-1, 0};
    if (pos < kend) {  // kend <= the table's capacity, so the slot is inside the row
      const int slot = page_shift >= 0 ? pos >> page_shift : pos / page_size;
      r.page = __ldg(pages + slot);
      r.row = pos - slot * page_size;
    }
    return r;
  }

  // (K offset, V offset) in elements; K offset -1: the group is not read (zero-filled).
  __device__ __forceinline__ longlong2 entry(PageRef r) const {
    if (static_cast<unsigned>(r.page) >= static_cast<unsigned>(num_pages)) return make_longlong2(-1, -1);
    return make_longlong2(r.page * k_page_stride + r.row * k_row_stride, r.page * v_page_stride + r.row * v_row_stride);
  }

  __device__ __forceinline__ void fetch(int n, Pages& pg) const {
    if (pages == nullptr) return;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) pg.ref[g] = lookup(n, g);
  }

  template <bool kChecked>
  __device__ __forceinline__ void copy_group(T* sK, T* sV, int g, const T* kg, const T* vg, bool group_valid,
                                             int pos_block) const {
#pragma unroll
    for (int j = 0; j < kRowsPerGroup; ++j) {
      const int i = g * kRowsPerGroup + j;
      bool valid = group_valid;
      if constexpr (kChecked) {
        const int pos = pos_block + row0 + i * kRowStep;
        valid = valid && pos >= kbeg && pos < kend;
      }
      const int dst = smem_off + i * kRowStep * SmemTile<D>::kStride;
      cp_async_16(sK + dst, valid ? kg + j * kRowStep * k_row_stride : k_mapped, valid);
      cp_async_16(sV + dst, valid ? vg + j * kRowStep * v_row_stride : v_mapped, valid);
    }
  }

  // entries(g): the group's longlong2 entry (paged only).
  template <bool kChecked, typename Entries>
  __device__ __forceinline__ void issue_impl(T* sK, T* sV, int n, Entries entries) const {
    const int pos_block = n * BN;
    if (pages != nullptr) {
      // All entries first: the shared-memory reads then overlap instead of each copy waiting for its own.
      longlong2 e[kGroups];
#pragma unroll
      for (int g = 0; g < kGroups; ++g) e[g] = entries(g);
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        copy_group<kChecked>(sK, sV, g, k_base + e[g].x, v_base + e[g].y, col_valid && e[g].x >= 0, pos_block);
      }
    } else {
      const T* kb = k_base + pos_block * k_row_stride;
      const T* vb = v_base + pos_block * v_row_stride;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        copy_group<kChecked>(sK, sV, g, kb + 16 * g * k_row_stride, vb + 16 * g * v_row_stride, col_valid,
                             pos_block);
      }
    }
  }

  template <typename Entries>
  __device__ __forceinline__ void issue(T* sK, T* sV, int n, Entries entries) const {
    const int pos_block = n * BN;
    if (pos_block >= kbeg && pos_block + BN <= kend) {
      issue_impl<false>(sK, sV, n, entries);
    } else {
      issue_impl<true>(sK, sV, n, entries);
    }
  }
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads) attn_kvcache_kernel(const AttnParams p) {
  using T = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int BM = Traits::kBlockM;
  constexpr int BN = Traits::kBlockN;
  constexpr int NT = Traits::kNThreads;
  constexpr int KPW = Traits::kKeysPerWarp;
  constexpr int NTILES = Traits::kNTiles;
  constexpr int DTILES = Traits::kDTiles;
  constexpr int STAGES = Traits::kStages;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + Traits::kSmemQ;                  // stage s at sK + s * kSmemKV
  T* sV = sK + STAGES * Traits::kSmemKV;        // likewise
  constexpr uint32_t kStageBytes = Traits::kSmemKV * sizeof(T);

  const int split = blockIdx.x % p.num_splits;
  const int m_block = blockIdx.x / p.num_splits;
  const int hk = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int wm = warp / Traits::kWarpsN;  // row strip of this warp
  const int wn = warp % Traits::kWarpsN;  // key slice of this warp
  const int g = lane / 4;
  const int t = lane % 4;
  const int group = p.head_group;
  const int rows_total = p.seqlen_q * group;
  const int m0 = m_block * BM;

  // The sequence's visible cache positions (device data, clamped so no bad value reads outside the cache).
  int kend = p.cache_seqlens != nullptr ? p.cache_seqlens[b] : p.cache_capacity;
  kend = min(max(kend, 0), p.cache_capacity);
  int kbeg = p.cache_leftpad != nullptr ? min(max(p.cache_leftpad[b], 0), kend) : 0;
  int cache_row = b;
  if (p.cache_batch_idx != nullptr) {
    cache_row = p.cache_batch_idx[b];
    if (static_cast<unsigned>(cache_row) >= static_cast<unsigned>(p.cache_batch)) cache_row = 0, kbeg = kend = 0;
  }
  const int diag = kend - p.seqlen_q;  // query i aligns with position i + diag

  // Key blocks of this row tile (the band of its first and last query), then this split's even share.
  const int i_lo = m0 / group;
  const int i_hi = (min(m0 + BM, rows_total) - 1) / group;
  const int64_t begin = max(static_cast<int64_t>(kbeg), static_cast<int64_t>(i_lo) + diag - p.window_left);
  const int64_t end = min(static_cast<int64_t>(kend), static_cast<int64_t>(i_hi) + diag + p.window_right + 1);
  int n_first = 0, n_count = 0;
  if (begin < end) {
    const int first = static_cast<int>(begin / BN);
    const int blocks = static_cast<int>((end + BN - 1) / BN) - first;
    n_first = first + static_cast<int>(static_cast<int64_t>(split) * blocks / p.num_splits);
    n_count = first + static_cast<int>(static_cast<int64_t>(split + 1) * blocks / p.num_splits) - n_first;
  }

  // The loader's base pointers already hold this thread's row and column.
  using Loader = KvBlockLoader<Traits>;
  const bool paged = p.block_table != nullptr;
  const int l_row0 = tid / Loader::kChunksPerRow;
  const int l_col = (tid % Loader::kChunksPerRow) * 8;
  const Loader loader{
      static_cast<const T*>(p.k) + hk * p.k_head_stride + (paged ? 0 : cache_row * p.k_batch_stride) +
          l_row0 * p.k_row_stride + l_col,
      static_cast<const T*>(p.v) + hk * p.v_head_stride + (paged ? 0 : cache_row * p.v_batch_stride) +
          l_row0 * p.v_row_stride + l_col,
      static_cast<const T*>(p.k), static_cast<const T*>(p.v),
      p.k_row_stride, p.v_row_stride, p.k_page_stride, p.v_page_stride,
      paged ? p.block_table + b * p.block_table_stride : nullptr,
      p.page_size, p.page_shift, p.num_pages, kbeg, kend, l_row0,
      SmemTile<D>::offset(l_row0, l_col), l_col < p.head_dim};
  constexpr int GROUPS = Loader::kGroups;
  // Shared page table (Traits::kPageTable): slot s holds the entries of the key block in ring stage s.
  longlong2* table = reinterpret_cast<longlong2*>(smem_raw + Traits::kSmemTableOffset);
  const bool table_writer = Traits::kPageTable && paged && tid < GROUPS;
  typename Loader::PageRef next_ref{-1, 0};  // table writer: its group of key block it + STAGES
  typename Loader::Pages pages{};            // no table: every group of the next key block to issue
  auto entries_at = [&](int slot) {
    return [&, slot](int gi) -> longlong2 {
      if constexpr (Traits::kPageTable) {
        return table[slot * GROUPS + gi];
      } else {
        return loader.entry(pages.ref[gi]);
      }
    };
  };

  if (n_count > 0) {
    const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + hk * group * p.q_head_stride;
    load_rows_async<BM, D, NT>(
        sQ,
        [&](int r) -> const T* {
          const int row = m0 + r;
          return row < rows_total ? q + (row / group) * p.q_row_stride + (row % group) * p.q_head_stride : nullptr;
        },
        q, p.head_dim, tid);
    if constexpr (Traits::kPageTable) {
      if (paged) {
        // The block-table reads of the prologue's key blocks and the first loop iteration's, all in flight
        // together: one table latency before the first copies instead of one per stage.
        if (table_writer) {
          typename Loader::PageRef refs[STAGES + 1];
#pragma unroll
          for (int s = 0; s <= STAGES; ++s) {
            refs[s] = s < n_count ? loader.lookup(n_first + s, tid) : typename Loader::PageRef{-1, 0};
          }
#pragma unroll
          for (int s = 0; s < STAGES; ++s) table[s * GROUPS + tid] = loader.entry(refs[s]);
          next_ref = refs[STAGES];
        }
        __syncthreads();  // the entries of stages 0 .. STAGES - 1 are visible
      }
    }
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < n_count) {
        if constexpr (!Traits::kPageTable) loader.fetch(n_first + s, pages);
        loader.issue(sK + s * Traits::kSmemKV, sV + s * Traits::kSmemKV, n_first + s, entries_at(s));
      }
      cp_async_commit();  // one group per stage even when empty, so wait<STAGES - 2> always means "tile landed"
    }
    if constexpr (!Traits::kPageTable) {
      if (STAGES - 1 < n_count) loader.fetch(n_first + STAGES - 1, pages);
    }
  }

  float o_acc[DTILES][4];
#pragma unroll
  for (int dt = 0; dt < DTILES; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[dt][e] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  // Queries of this thread's two accumulator rows, and the band of the warp's 16 rows (padding rows past
  // rows_total are never stored; their values only need to stay finite).
  const int warp_row0 = m0 + wm * 16;
  const int qi[2] = {(warp_row0 + g) / group, (warp_row0 + g + 8) / group};
  const int wq_lo = warp_row0 / group;
  const int wq_hi = (min(warp_row0 + 16, rows_total) - 1) / group;

  const FragLoader<D, Frag::kA> frag_q(sQ, wm * 16, lane);
  const FragLoader<D, Frag::kBRows> frag_k(sK, wn * KPW, lane);
  const FragLoader<D, Frag::kBRowsT> frag_v(sV, wn * KPW, lane);

  int stage = 0;
  for (int it = 0; it < n_count; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile `it` landed for every thread; every warp finished tile it - 1, whose stage is reused
    {
      const int ahead = it + STAGES - 1;
      if (ahead < n_count) {
        const int ring = (stage + STAGES - 1) % STAGES;
        loader.issue(sK + ring * Traits::kSmemKV, sV + ring * Traits::kSmemKV, n_first + ahead, entries_at(ring));
        if constexpr (!Traits::kPageTable) {
          if (ahead + 1 < n_count) loader.fetch(n_first + ahead + 1, pages);
        }
      }
      cp_async_commit();
      // Table slot `stage` (key block it, issued STAGES - 1 iterations ago, read by every thread before this
      // iteration's barrier) now takes key block it + STAGES, which the next iteration issues after its
      // barrier. The block-table read for the one after is issued here, a whole iteration before its use.
      if (table_writer && it + STAGES < n_count) {
        table[stage * GROUPS + tid] = loader.entry(next_ref);
        if (it + STAGES + 1 < n_count) next_ref = loader.lookup(n_first + it + STAGES + 1, tid);
      }
    }
    const uint32_t stage_off = stage * kStageBytes;
    const int k0 = (n_first + it) * BN + wn * KPW;  // first cache position of this warp's keys

    float s[NTILES][4];
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      frag_q.load(a, 0, kk * 16);
#pragma unroll
      for (int np = 0; np < NTILES / 2; ++np) {
        uint32_t bf[4];
        frag_k.load(bf, np * 16, kk * 16, stage_off);
        Mma16816<T>::run(s[2 * np], a, bf[0], bf[1]);
        Mma16816<T>::run(s[2 * np + 1], a, bf[2], bf[3]);
      }
    }

    if (p.softcap > 0.f) {
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = p.softcap * tanh_approx(s[nt][e] * p.softcap_scale);
    }

    // Per-element mask only where the warp's slice touches the sequence ends or the band's edges.
    const bool full = k0 >= kbeg && k0 + KPW <= kend && k0 + KPW - 1 - wq_lo - diag <= p.window_right &&
                      k0 - wq_hi - diag >= -p.window_left;
    if (!full) {
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pos = k0 + nt * 8 + 2 * t + (e & 1);
          const int rel = pos - qi[e >> 1] - diag;
          const bool visible = pos >= kbeg && pos < kend && rel >= -p.window_left && rel <= p.window_right;
          if (!visible) s[nt][e] = -INFINITY;
        }
    }

    online_softmax_step(s, row_max, row_sum, o_acc, p.scale_log2);

    // O += P V over this warp's keys.
#pragma unroll
    for (int kk = 0; kk < KPW / 16; ++kk) {
      uint32_t a[4];
      acc_to_a_frag<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < DTILES / 2; ++dp) {
        uint32_t bf[4];
        frag_v.load(bf, kk * 16, dp * 16, stage_off);
        Mma16816<T>::run(o_acc[2 * dp], a, bf[0], bf[1]);
        Mma16816<T>::run(o_acc[2 * dp + 1], a, bf[2], bf[3]);
      }
    }
    stage = stage + 1 == STAGES ? 0 : stage + 1;
  }

  // Split runs: let the combine kernel's launch start now (programmatic dependent launch, sm_90); it still
  // waits for this grid's memory before reading the partials (griddepcontrol.wait).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif

  // Epilogue: every warp parks its unnormalised O and per-row (max, sum) in shared memory (the ring is free
  // once drained), then all threads merge the kWarpsN key slices of each row and store 16-byte chunks.
  cp_async_wait<0>();
  __syncthreads();
  constexpr int OS = Traits::kORowStride;
  float* sO = reinterpret_cast<float*>(smem_raw);          // [kWarpsN][BM][OS]
  float* sStat = sO + Traits::kWarpsN * BM * OS;           // [kWarpsN][BM][2]: max, sum
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wm * 16 + g + 8 * r;
    const float sum = quad_sum(row_sum[r]);
    float* o_row = sO + (wn * BM + row) * OS;
#pragma unroll
    for (int dt = 0; dt < DTILES; ++dt) {
      *reinterpret_cast<float2*>(o_row + dt * 8 + 2 * t) = make_float2(o_acc[dt][2 * r], o_acc[dt][2 * r + 1]);
    }
    if (t == 0) {
      sStat[(wn * BM + row) * 2] = row_max[r];
      sStat[(wn * BM + row) * 2 + 1] = sum;
    }
  }
  __syncthreads();

  constexpr int kChunks = D / 8;  // 8 columns = one 16-byte chunk of out
  for (int c = tid; c < BM * kChunks; c += NT) {
    const int row = c / kChunks;
    const int col = (c % kChunks) * 8;
    const int grow = m0 + row;
    if (grow >= rows_total || col >= p.head_dim) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < Traits::kWarpsN; ++w) mx = fmaxf(mx, sStat[(w * BM + row) * 2]);
    const float mx_scaled = mx == -INFINITY ? 0.f : mx * p.scale_log2;
    float sum = 0.f;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < Traits::kWarpsN; ++w) {
      const float weight = fast_exp2(sStat[(w * BM + row) * 2] * p.scale_log2 - mx_scaled);
      sum += weight * sStat[(w * BM + row) * 2 + 1];
      const float4 lo = *reinterpret_cast<const float4*>(sO + (w * BM + row) * OS + col);
      const float4 hi = *reinterpret_cast<const float4*>(sO + (w * BM + row) * OS + col + 4);
      acc[0] += weight * lo.x, acc[1] += weight * lo.y, acc[2] += weight * lo.z, acc[3] += weight * lo.w;
      acc[4] += weight * hi.x, acc[5] += weight * hi.y, acc[6] += weight * hi.z, acc[7] += weight * hi.w;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] *= inv;
    const int i = grow / group;
    const int h = hk * group + grow % group;
    if (p.num_splits == 1) {
      // Rows that saw no key: O = 0 and lse = +inf (flash_attn's convention).
      T* o = static_cast<T*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride + col;
      uint4 packed;
      packed.x = pack2<T>(acc[0], acc[1]);
      packed.y = pack2<T>(acc[2], acc[3]);
      packed.z = pack2<T>(acc[4], acc[5]);
      packed.w = pack2<T>(acc[6], acc[7]);
      *reinterpret_cast<uint4*>(o) = packed;
      if (col == 0) {
        p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] =
            sum > 0.f ? mx * p.softmax_scale + logf(sum) : INFINITY;
      }
    } else {
      // A split that saw no key has lse -inf: weight 0 in the combine.
      const int64_t prow = ((static_cast<int64_t>(split) * p.batch + b) * p.heads_q + h) * p.seqlen_q + i;
      float* o = p.partial_o + prow * p.head_dim + col;
      *reinterpret_cast<float4*>(o) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(o + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (col == 0) p.partial_lse[prow] = sum > 0.f ? mx * p.softmax_scale + logf(sum) : -INFINITY;
    }
  }
}

// Merges the num_splits partials of each row: out = sum_s exp(lse_s - lse) O_s with
// lse = log sum_s exp(lse_s). One thread per 4 columns of a row (rows in (b, h, i) order, as written).
template <typename T>
__global__ void __launch_bounds__(128) kvcache_combine_kernel(const AttnParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the split kernel's partials are complete and visible
#endif
  const int chunks = p.head_dim / 4;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * chunks) return;
  const int64_t row = idx / chunks;
  const int col = static_cast<int>(idx % chunks) * 4;

  float mx = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) mx = fmaxf(mx, p.partial_lse[s * rows + row]);
  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (mx != -INFINITY) {
#pragma unroll 4
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = __expf(p.partial_lse[s * rows + row] - mx);
      const float4 o = *reinterpret_cast<const float4*>(p.partial_o + (s * rows + row) * p.head_dim + col);
      sum += w;
      acc.x += w * o.x, acc.y += w * o.y, acc.z += w * o.z, acc.w += w * o.w;
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  const int i = static_cast<int>(row % p.seqlen_q);
  const int h = static_cast<int>((row / p.seqlen_q) % p.heads_q);
  const int b = static_cast<int>(row / (static_cast<int64_t>(p.seqlen_q) * p.heads_q));
  T* o = static_cast<T*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride + col;
  uint2 packed;
  packed.x = pack2<T>(acc.x * inv, acc.y * inv);
  packed.y = pack2<T>(acc.z * inv, acc.w * inv);
  *reinterpret_cast<uint2*>(o) = packed;
  if (col == 0) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = sum > 0.f ? mx + logf(sum) : INFINITY;
}

}  // namespace flash_kernels
