// Thin wrappers over the sm_80 instructions the kernels are built from (inline PTX, no CUTLASS):
//   cp.async       global -> shared, 16 bytes per thread, bypassing registers and L1
//   ldmatrix       shared -> registers in the exact fragment layout mma.sync expects
//   mma.sync       m16n8k16, fp16/bf16 inputs, fp32 accumulators
// plus the shared-memory swizzle and the fp32 -> 16-bit packing used around them.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4, t = lane % 4:
//   A 16x16 (row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8  (k x n)    : b0 = (k = 2t..2t+1, n = g), b1 = (k = 2t+8.., n = g)
//   C 16x8  (fp32)     : c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace flash_kernels {

// ---- shared memory layout ---------------------------------------------------------------------
// A tile row of kCols 16-bit elements is kCols/8 chunks of 16 bytes. ldmatrix reads one chunk from each
// of 8 consecutive rows, so those 8 chunks must fall in different 4-bank groups:
// - kCols 64 or 128 (rows a multiple of 128 bytes apart): chunk c of row r is stored at chunk position
//   c ^ (r % 8) (XOR swizzle, no padding). Without it all 8 land in the same 4 banks.
// - other head dims (32, 96, 160, 192, 256): each row is padded by one chunk, so row r starts an odd
//   number of chunks after row r-1 (5, 13, 21, 25, 33) and 8 consecutive rows cover all 32 banks. The
//   swizzled copy loop needs each thread to keep one chunk column with a row step that is a multiple of 8:
//   192 (24 chunks per row) divides no power-of-two block, and 256 (32 chunks) gives 128 threads a row
//   step of 4, so both take the padded layout (3-4% more shared memory).
// cp.async writes of 8 consecutive chunks are conflict-free in the swizzled layout; in the padded one a
// group that crosses a row end can meet one 2-way conflict (the skipped pad chunk).
template <int kCols>
struct SmemTile {
  static_assert(kCols % 16 == 0, "rows must be whole 16-column mma k steps");
  static constexpr bool kSwizzled = kCols == 64 || kCols == 128;
  static constexpr int kStride = kSwizzled ? kCols : kCols + 8;  // elements between row starts
  static __device__ __forceinline__ int offset(int row, int col) {
    if constexpr (kSwizzled) {
      return row * kCols + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
    } else {
      return row * kStride + col;
    }
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async ----------------------------------------------------------------------------------
// valid == false copies 0 source bytes and zero-fills the 16 destination bytes, so tiles that run
// past the end of a sequence read as zeros (finite: 0 * P stays 0, unlike garbage that may be NaN).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPendingAllowed>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPendingAllowed));
}

// Copy rows [0, kRows) of a (rows x kCols) tile into shared memory (SmemTile layout). Row r comes from
// row_src(r), a pointer to its first element, or nullptr for a row that must not be read (past a sequence
// end, an unmapped page): such rows, and columns at or past valid_cols, are zero-filled, never read.
// valid_cols is the head dim of the call, a multiple of 8 (whole 16-byte chunks) and <= kCols: a head dim d
// runs on the kernel compiled for the next larger kCols, and the zero columns add nothing to Q K^T, P V,
// dS Q, ... `mapped` is any mapped global address: the instruction needs one even when it copies 0 bytes.
// All kThreads threads of the block take part.
template <int kRows, int kCols, int kThreads, typename T, typename RowSrc>
__device__ __forceinline__ void load_rows_async(T* smem, const RowSrc& row_src, const T* mapped, int valid_cols,
                                                int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  if constexpr (SmemTile<kCols>::kSwizzled) {
    // Thread tid always copies the same chunk column of rows tid / kChunksPerRow + i * kRowStep;
    // kRowStep is a multiple of 8, so the swizzled column is the same for every i and each copy's shared
    // address is one register plus a compile-time offset.
    static_assert(kThreads % kChunksPerRow == 0, "each thread must keep one chunk column");
    constexpr int kRowStep = kThreads / kChunksPerRow;
    static_assert(kRowStep % 8 == 0 && kRows % kRowStep == 0, "row step must keep the swizzle phase");
    const int row = tid / kChunksPerRow;
    const int col = (tid % kChunksPerRow) * 8;
    T* dst = smem + SmemTile<kCols>::offset(row, col);
    const bool col_valid = col < valid_cols;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const T* src = row_src(row + i * kRowStep);
      const bool valid = col_valid && src != nullptr;
      cp_async_16(dst + i * kRowStep * kCols, valid ? src + col : mapped, valid);
    }
  } else {
    // Padded rows: chunk counts such as 12 per row need not divide the thread count.
    constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
      const int c = tid + i * kThreads;
      if (kChunks % kThreads != 0 && c >= kChunks) break;
      const int row = c / kChunksPerRow;
      const int col = (c % kChunksPerRow) * 8;
      const T* src = row_src(row);
      const bool valid = col < valid_cols && src != nullptr;
      cp_async_16(smem + SmemTile<kCols>::offset(row, col), valid ? src + col : mapped, valid);
    }
  }
}

// The dense case: rows row_stride elements apart from gmem; rows at or past valid_rows are zero-filled.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int valid_rows,
                                                int valid_cols, int tid) {
  load_rows_async<kRows, kCols, kThreads>(
      smem, [&](int r) -> const T* { return r < valid_rows ? gmem + r * row_stride : nullptr; }, gmem, valid_cols,
      tid);
}

// ---- ldmatrix ----------------------------------------------------------------------------------
// Four 8x8 matrices; lane l supplies the row address of matrix l / 8, and r[j] receives matrix j's
// fragment (lane holds row l/4, columns 2(l%4)..+1). .trans delivers the transpose instead.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_byte_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_byte_addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_byte_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_byte_addr));
}

// Which mma operand a FragLoader produces from a row-major swizzled tile:
//   kA       : A fragment, 16 rows x 16 cols at (row0, col0).
//   kBRows   : B = X^T with X stored (n, k): two n-tiles, rows n0..n0+15, k columns k0..k0+15;
//              r[0..1] serve n-tile n0, r[2..3] n-tile n0+8.
//   kBRowsT  : B stored (k, n): rows k0..k0+15, n columns n0..n0+15 (transposing load);
//              r[0..1] serve n-tile n0, r[2..3] n-tile n0+8.
enum class Frag { kA, kBRows, kBRowsT };

// ldmatrix addresses for one operand of one tile. Lane l supplies the address of row row_lane(l) and
// 16-byte chunk chunk0 + chunk_lane(l), where chunk0 = col0 / 8 is even.
// Swizzled layout: because row0 is a multiple of 8, the XOR uses only row_lane & 7, and
// (chunk0 + c) ^ x splits into a part that depends on chunk0 % 8 (4 cases) and chunk0 & ~7 (a plain
// offset). So four per-lane base addresses serve every (row0, col0) with a compile-time offset, instead
// of the compiler keeping one register per fragment. Padded layout: one base address.
template <int kCols, Frag kFrag>
struct FragLoader {
  using Layout = SmemTile<kCols>;
  static constexpr int kBases = Layout::kSwizzled ? 4 : 1;
  uint32_t base[kBases];

  // row_origin: a multiple of 8 added to every row0 (e.g. this warp's first row).
  template <typename T>
  __device__ __forceinline__ FragLoader(const T* tile, int row_origin, int lane) {
    static_assert(sizeof(T) == 2, "16-bit elements");
    int row_lane, chunk_lane;
    if (kFrag == Frag::kA) {
      row_lane = lane & 15;
      chunk_lane = lane >> 4;
    } else if (kFrag == Frag::kBRows) {
      row_lane = (lane & 7) + ((lane >> 4) << 3);
      chunk_lane = (lane >> 3) & 1;
    } else {
      row_lane = (lane & 7) + (((lane >> 3) & 1) << 3);
      chunk_lane = lane >> 4;
    }
    const uint32_t row_addr = smem_addr(tile) + 2u * (row_origin + row_lane) * Layout::kStride;
    if constexpr (Layout::kSwizzled) {
      const int x = row_lane & 7;
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        base[v] = row_addr + 16u * (((2 * v) ^ (x & 6)) | (chunk_lane ^ (x & 1)));
      }
    } else {
      base[0] = row_addr + 16u * chunk_lane;
    }
  }

  // row0 % 8 == 0, col0 % 16 == 0; both compile-time in the unrolled loops. byte_offset moves to another
  // tile of the same shape (the other operand of a pair, or another pipeline stage), so one loader
  // serves all of them.
  __device__ __forceinline__ void load(uint32_t (&r)[4], int row0, int col0, uint32_t byte_offset = 0) const {
    uint32_t addr;
    if constexpr (Layout::kSwizzled) {
      addr = base[(col0 >> 4) & 3] + byte_offset + 2u * (row0 * kCols + (col0 & ~63));
    } else {
      addr = base[0] + byte_offset + 2u * (row0 * Layout::kStride + col0);
    }
    if (kFrag == Frag::kBRowsT) {
      ldmatrix_x4_trans(r, addr);
    } else {
      ldmatrix_x4(r, addr);
    }
  }
};

// ---- mma.sync ----------------------------------------------------------------------------------
template <typename T>
struct Mma16816;

template <>
struct Mma16816<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma16816<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- conversions -------------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// Two accumulator tiles (n-tiles 2j and 2j+1 of one 16-row strip) -> the A fragment of a 16x16 tile.
template <typename T>
__device__ __forceinline__ void acc_to_a_frag(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// Reductions over the 4 lanes of a quad (they hold the same accumulator rows).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One online-softmax step for a 16-row strip of S accumulator tiles (r = 0: row g, r = 1: row g + 8 of
// each tile): S becomes exp2(S * scale_log2 - new max); the running sum and O are rescaled by
// exp2(old max - new max) first. row_sum holds this thread's partial sums; the quad reduction happens once,
// after the last key block.
template <int kNTiles, int kDTiles>
__device__ __forceinline__ void online_softmax_step(float (&s)[kNTiles][4], float (&row_max)[2], float (&row_sum)[2],
                                                    float (&o_acc)[kDTiles][4], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = row_max[r];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    mx = quad_max(mx);
    // A row that has seen only masked keys keeps max -inf; use 0 so exp2 gives 0, not NaN.
    const float mx_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
    const float alpha = fast_exp2(row_max[r] * scale_log2 - mx_scaled);
    row_max[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float e = fast_exp2(fmaf(s[nt][2 * r + c], scale_log2, -mx_scaled));
        s[nt][2 * r + c] = e;
        sum += e;
      }
    }
    row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      o_acc[dt][2 * r] *= alpha;
      o_acc[dt][2 * r + 1] *= alpha;
    }
  }
}

}  // namespace flash_kernels
