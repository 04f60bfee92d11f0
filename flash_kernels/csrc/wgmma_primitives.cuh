// Hopper (sm_90a) building blocks of the kernels in fwd_kernel_sm90.cuh and bwd_kernel_sm90.cuh (inline PTX,
// no CUTLASS):
//   wgmma.mma_async   warpgroup (4 warps) matrix multiply, B (and optionally A) read by the tensor cores
//                     straight from shared memory through a 64-bit matrix descriptor
//   the 128-byte-swizzled shared-memory layout those descriptors describe, which TMA copies write
//   mbarriers, TMA, register reallocation, named barriers, and what the kernels build from them
//
// Shared-memory layout (PTX ISA, "Shared Memory Matrix Layout", 128B swizzle): a tile of R rows x C columns
// of 16-bit elements is stored as C/64 column blocks ("atoms") of R rows x 128 bytes, one after the other;
// inside an atom, 16-byte chunk c of row r sits at chunk position c ^ (r % 8). The hardware applies the
// XOR to address bits, so every atom starts on a 1024-byte boundary. One layout serves all three operands:
//   Q (A of S = Q K^T) and K (B of S) are "K-major": the reduction dim (head dim) is contiguous;
//   V (B of O = P V) is "N-major": the output dim (head dim) is contiguous, hence transpose-B = 1.
// Accumulator layout of m64nNk16 (fp32): warp w of the warpgroup holds rows 16w..16w+15; element
// d[4j + e] is row 16w + g + 8 * (e / 2), column 8j + 2t + (e % 2), with g = lane / 4, t = lane % 4: the
// mma.sync m16n8 C layout repeated over N/8 tiles, so the online softmax of the sm_80 kernel carries over.
// The register A operand of m64nNk16 is the mma.sync m16n8k16 A fragment (acc_to_a_frag).
//
// The operand lists of the wgmma wrappers are spelled out: inline asm needs one operand per register.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#include "mma_primitives.cuh"

namespace flash_kernels {

constexpr int kAtomCols = 64;     // 16-bit elements in one 128-byte swizzle atom row
constexpr int kAtomBytes = 1024;  // 8 rows x 128 bytes: the swizzle period and the descriptors' row-group step

// Matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading and stride byte offsets
// (all >> 4), swizzle mode in bits 62-63 (1 = 128B). The stride offset is the step between 8-row groups
// (1024 bytes here, rows being 128 bytes). The leading offset is ignored for K-major swizzled operands;
// for the N-major V it is the step between 8-row groups along the reduction dim too, since the PV wgmma
// is issued per 64-column atom (N = 64): both readings of the field for N-major operands then agree.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_byte_addr) {
  constexpr uint64_t kGroup = kAtomBytes >> 4;
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) | (kGroup << 16) | (kGroup << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPendingAllowed>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPendingAllowed) : "memory");
}
// Pins accumulator registers at this point of the program: the compiler may not move their reads or
// writes across it, so no code touches an accumulator while a wgmma that writes it is in flight.
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// ---- mbarrier, bulk tensor copy (TMA), register reallocation, named barriers --------------------
// An mbarrier is 8 bytes of shared memory that counts arrivals (and, for TMA, bytes) per phase; a
// waiter names the phase by its parity.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the copy engine (async proxy) before any copy uses them.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival that also announces `bytes` of copies the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Copy one box of a 4-D tensor map into shared memory; completion is counted on `bar` in bytes.
// The box lands in the layout the map's swizzle mode says (128B here: one swizzle atom per 64 columns).
__device__ __forceinline__ void tma_load_4d(uint32_t smem_dst, const void* tensor_map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_dst),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Register reallocation between warpgroups (sm_90a): the copy warpgroup gives registers back, the math
// warpgroups take them. Needs the kernel's register cap from __launch_bounds__(threads, 1).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Named barriers (ids 1..15; 0 is __syncthreads): sync waits until `threads` threads arrived, arrive
// counts this thread without waiting.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <typename T>
struct Wgmma;

// ss_m64nNk16: d (64 x N, fp32) (+)= A (64 x 16, shared) * B (16 x N, shared); accumulate = 0 overwrites d.
//   A and B are K-major unless kTransA / kTransB: then M-major / N-major (the output dim contiguous), e.g. V
//   as B, or a transposed score tile another warpgroup stored (store_frags_sw128) as A.
//   N: the forward's key block (80, 112, 128), the backward's query block (64), or half a dQ tile (32, 64).
// rs_m64n64k16_nmajor_b: d (64 x 64) += A (64 x 16, registers) * B (16 x 64, N-major, shared).
// The wrappers for both 16-bit types differ only in the type name in the instruction.
#define FK_WGMMA_WRAPPERS(CTYPE, PTX) \
template <> \
struct Wgmma<CTYPE> { \
  template <int N, int kTransA = 0, int kTransB = 0> \
  static __device__ __forceinline__ void ss_m64nNk16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, \
                                                     int accumulate) { \
    if constexpr (N == 32) { \
      asm volatile( \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
          "wgmma.mma_async.sync.aligned.m64n32k16.f32." PTX "." PTX " " \
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
          "%16, %17, p, 1, 1, %19, %20;\n}\n" \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
          : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB)); \
    } else if constexpr (N == 64) { \
      asm volatile( \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
          "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " \
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
          "%32, %33, p, 1, 1, %35, %36;\n}\n" \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
          : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB)); \
    } else if constexpr (N == 80) { \
      asm volatile( \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n" \
          "wgmma.mma_async.sync.aligned.m64n80k16.f32." PTX "." PTX " " \
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, " \
          "%40, %41, p, 1, 1, %43, %44;\n}\n" \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]) \
          : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB)); \
    } else if constexpr (N == 112) { \
      asm volatile( \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %58, 0;\n" \
          "wgmma.mma_async.sync.aligned.m64n112k16.f32." PTX "." PTX " " \
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, " \
          "%56, %57, p, 1, 1, %59, %60;\n}\n" \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]) \
          : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB)); \
    } else if constexpr (N == 128) { \
      asm volatile( \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
          "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " " \
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
          "%64, %65, p, 1, 1, %67, %68;\n}\n" \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
          : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB)); \
    } else { \
      static_assert(N == 0, "no wrapper for this N: add it to the list the wrappers were generated from"); \
    } \
  } \
  static __device__ __forceinline__ void rs_m64n64k16_nmajor_b(float (&d)[32], const uint32_t (&a)[4], \
                                                               uint64_t desc_b) { \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1)); \
  } \
};

FK_WGMMA_WRAPPERS(__half, "f16")
FK_WGMMA_WRAPPERS(__nv_bfloat16, "bf16")
#undef FK_WGMMA_WRAPPERS

// ---- what every Hopper kernel here does with these ----------------------------------------------
// Shared memory base rounded up to the 1024-byte period of the 128B swizzle (each kernel's kSmemBytes
// reserves kAtomBytes of slack for it).
__device__ __forceinline__ uint32_t swizzle_aligned_base(const void* smem) {
  return (smem_addr(smem) + kAtomBytes - 1) & ~uint32_t(kAtomBytes - 1);
}

// A kRows x (kAtoms * 64) tile from a tensor map over (head dim, rows, heads, batch) with a 64 x kRows box:
// one TMA copy per 64-column atom, each kRows * 128 bytes after the last, all counted on `bar`.
template <int kAtoms, int kRows>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap* map, int row, int head, int batch,
                                              uint32_t bar) {
#pragma unroll
  for (int a = 0; a < kAtoms; ++a) tma_load_4d(dst + a * kRows * 128, map, a * kAtomCols, row, head, batch, bar);
}

// A ring of kStages buffers the copy thread fills for the math warps, on two mbarriers per stage: "full"
// (the copy thread's arrival with the TMA byte count) and "empty" (one arrival per math warp). Step i uses
// stage i % kStages for the (i / kStages)-th time, which completes phase i / kStages of both barriers:
// hence the parities below. Methods take the step, not the stage.
template <int kStages>
struct StageRing {
  static constexpr int kBytes = 16 * kStages;  // full of each stage, then empty of each stage
  uint32_t bars;
  __device__ __forceinline__ uint32_t full(int i) const { return bars + 8 * (i % kStages); }
  __device__ __forceinline__ uint32_t empty(int i) const { return bars + 8 * (kStages + i % kStages); }
  __device__ __forceinline__ void init(int math_warps) const {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), math_warps);
    }
  }
  // Copy thread, before refilling the stage for step i: wait until step i - kStages was released.
  __device__ __forceinline__ void acquire(int i) const {
    if (i >= kStages) mbar_wait(empty(i), ((i / kStages) & 1) ^ 1);
  }
  // Copy thread: the TMA copies of `bytes` that follow, for step i, complete full(i).
  __device__ __forceinline__ void expect(int i, uint32_t bytes) const { mbar_arrive_expect_tx(full(i), bytes); }
  __device__ __forceinline__ void wait_full(int i) const { mbar_wait(full(i), (i / kStages) & 1); }
  // Math warp, once every wgmma reading step i's stage has been waited for.
  __device__ __forceinline__ void release(int i, int lane) const {
    if (lane == 0) mbar_arrive(empty(i));
  }
};

// Row g + 8r (r = 0, 1: the two rows a thread holds) of a wgmma accumulator of kAtoms 64-column atoms,
// times scale, to `dst` as 16-bit elements, up to head_dim: columns past it are padding. The first
// skip_atoms atoms are left out (another warpgroup stores those columns).
template <typename T, int kAtoms>
__device__ __forceinline__ void store_acc_row(T* dst, const float (&acc)[kAtoms][32], int r, float scale,
                                              int head_dim, int skip_atoms = 0) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int a = 0; a < kAtoms; ++a)
    if (a >= skip_atoms)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = a * kAtomCols + j * 8;
      if (col >= head_dim) return;
      *reinterpret_cast<uint32_t*>(dst + col + 2 * t) =
          pack2<T>(acc[a][4 * j + 2 * r] * scale, acc[a][4 * j + 2 * r + 1] * scale);
    }
}

// Two math warpgroups take turns issuing their wgmma (named barriers 1 and 2), so one's softmax or
// elementwise work overlaps the other's matrix work. Warpgroup 0 goes first (start); the last turn of
// warpgroup 1 is not passed on, as warpgroup 0 will not wait for another.
struct WarpgroupTurns {
  static constexpr int kThreads = 256;  // both warpgroups
  static constexpr int kBarriersUsed = 3;  // 0 (__syncthreads), 1, 2: named barriers from 3 on are free
  int wg;                               // 0 or 1
  __device__ __forceinline__ void start() const {
    if (wg == 1) named_bar_arrive(1, kThreads);
  }
  __device__ __forceinline__ void take() const { named_bar_sync(1 + wg, kThreads); }
  __device__ __forceinline__ void pass(bool last) const {
    if (!(last && wg == 1)) named_bar_arrive(2 - wg, kThreads);
  }
};

template <int kAtoms>
__device__ __forceinline__ void fence_operands(float (&r)[kAtoms][32]) {
#pragma unroll
  for (int a = 0; a < kAtoms; ++a) fence_operands(r[a]);
}

// d (64 x N) = A B^T over the head dim: A is rows [a_row0, a_row0 + 64) of the kARows-row atom tile at
// a_addr, B the N-row atom tile at b_addr (both K-major: the head dim is contiguous). One commit group
// is left to the caller.
template <typename T, int kHeadDim, int kARows, int N>
__device__ __forceinline__ void wgmma_rows_x_rows(float (&d)[N / 2], uint32_t a_addr, int a_row0, uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const uint32_t a_off = (kk / 4) * kARows * 128 + a_row0 * 128 + (kk % 4) * 32;
    const uint32_t b_off = (kk / 4) * N * 128 + (kk % 4) * 32;
    Wgmma<T>::template ss_m64nNk16<N>(d, smem_desc_sw128(a_addr + a_off), smem_desc_sw128(b_addr + b_off), kk > 0);
  }
}

// acc (64 x kHeadDim, one [32] per 64-column atom) += F B: F (64 x K) in registers as K/16 A fragments,
// B the K-row atom tile at b_addr read N-major (its head dim is the output's columns).
template <typename T, int kAtoms, int K>
__device__ __forceinline__ void wgmma_frags_x_rows(float (&acc)[kAtoms][32], const uint32_t (&f)[K / 16][4],
                                                   uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int a = 0; a < kAtoms; ++a) {
      Wgmma<T>::rs_m64n64k16_nmajor_b(acc[a], f[kk], smem_desc_sw128(b_addr + a * K * 128 + kk * 16 * 128));
    }
}

// acc += A B like wgmma_frags_x_rows, with A (64 x K, K <= 64) read from the one-atom K-major tile at a_addr
// (written by another warpgroup with store_frags_sw128).
template <typename T, int kAtoms, int K>
__device__ __forceinline__ void wgmma_tile_x_rows(float (&acc)[kAtoms][32], uint32_t a_addr, uint32_t b_addr) {
  static_assert(K <= kAtomCols, "A is one swizzle atom");
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int a = 0; a < kAtoms; ++a) {
      Wgmma<T>::template ss_m64nNk16<64, 0, 1>(acc[a], smem_desc_sw128(a_addr + kk * 32),
                                               smem_desc_sw128(b_addr + a * K * 128 + kk * 16 * 128), 1);
    }
}

// Makes this thread's plain shared-memory stores visible to later wgmma reads (the async proxy) of
// other threads; a barrier between the two still orders them.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The warpgroup's 64 x K 16-bit fragments (acc_to_frags) into a K-major 128B-swizzled tile of 64 rows at
// `tile` (K <= 64: one atom), the layout the wgmma descriptors above read. Fragment f[kk][i] holds
// columns 16kk + 8(i / 2) + 2t, +1 of row 16 warp + g + 8(i % 2); a warp's 32 stores of one (kk, i) hit 32
// distinct banks (the chunk XOR row % 8 spreads the 8 rows g).
template <int K>
__device__ __forceinline__ void store_frags_sw128(const uint32_t (&f)[K / 16][4], uint32_t tile) {
  static_assert(K <= kAtomCols, "one atom");
  const int warp = (threadIdx.x % 128) / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = 16 * warp + g + 8 * (i & 1);
      const int chunk = 2 * kk + (i >> 1);
      const uint32_t addr = tile + row * 128 + ((chunk ^ g) << 4) + 4 * t;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(f[kk][i]) : "memory");
    }
}

// A 64 x N fp32 accumulator (N / 2 values a thread) through shared memory: thread j of the warpgroup writes
// its values to float4 slots j, j + 128, ... and thread j of a reader gets them back in the same
// accumulator layout, so no layout conversion and no bank conflicts. Used to hand dP^T from one math
// warpgroup to the other, and for the dQ tiles the backward adds to global memory (dq_accum.cuh).
template <int kValues>
__device__ __forceinline__ void stash_acc(const float (&acc)[kValues], float* buf) {
  float4* const b = reinterpret_cast<float4*>(buf) + threadIdx.x % 128;
#pragma unroll
  for (int q = 0; q < kValues / 4; ++q) {
    b[q * 128] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
  }
}
template <int kValues>
__device__ __forceinline__ void unstash_acc(float (&acc)[kValues], const float* buf) {
  const float4* const b = reinterpret_cast<const float4*>(buf) + threadIdx.x % 128;
#pragma unroll
  for (int q = 0; q < kValues / 4; ++q) {
    const float4 v = b[q * 128];
    acc[4 * q] = v.x;
    acc[4 * q + 1] = v.y;
    acc[4 * q + 2] = v.z;
    acc[4 * q + 3] = v.w;
  }
}

// The 16-bit A fragments of a 64 x K fp32 accumulator (acc_to_a_frag per 16-column slice).
template <typename T, int K>
__device__ __forceinline__ void acc_to_frags(const float (&acc)[K / 2], uint32_t (&f)[K / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) f[kk][i] = pack2<T>(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
}

}  // namespace flash_kernels
