// Tile shapes of the kernels, with the constraints the device code relies on checked at compile time.
// Which shapes are used for which head dim (and why) is decided in fwd_launch.cuh / bwd_launch.cuh.
#pragma once
#include "mma_primitives.cuh"

namespace flash_kernels {

// Forward: a block owns kBlockM query rows and walks the keys kBlockN at a time.
// Each warp owns kBlockM / kNWarps rows = kMTiles strips of 16 (the mma M size).
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kNWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;
  static constexpr int kNTiles = kBlockN / 8;   // 8-column accumulator tiles of S
  static constexpr int kDTiles = kHeadDim / 8;  // 8-column accumulator tiles of O

  static_assert(kBlockM % (kNWarps * 16) == 0, "each warp needs whole 16-row strips");
  static_assert(kBlockN % 16 == 0, "P feeds mma as 16-wide k slices");
  static_assert(kHeadDim % 16 == 0, "ldmatrix pairs cover 16 columns of the head dim at a time");

  // Element counts of the shared-memory tiles (SmemTile rows may be padded).
  static constexpr int kSmemQ = kBlockM * SmemTile<kHeadDim>::kStride;
  static constexpr int kSmemKV = kBlockN * SmemTile<kHeadDim>::kStride;
  static constexpr int kSmemBytes = (kSmemQ + 2 * kSmemKV) * sizeof(Element);
};

// Backward dK/dV: a block owns kBlockN keys of one kv head (16 per warp) and walks the queries of every
// q head in its group kBlockM at a time, double-buffering Q and dO.
template <typename Element_, int kHeadDim_, int kBlockN_, int kBlockM_, int kNWarps_>
struct BwdKVTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kQTiles = kBlockM / 8;   // 8-column tiles of S^T (columns are queries)
  static constexpr int kDTiles = kHeadDim / 8;

  static_assert(kBlockN == kNWarps * 16, "each warp owns one 16-key strip");
  static_assert(kBlockM % 16 == 0 && kBlockM <= kNThreads, "query slice must be whole mma k steps; one thread per row for lse");
  static_assert(kHeadDim % 16 == 0, "ldmatrix pairs cover 16 columns of the head dim at a time");

  static constexpr int kSmemKV = kBlockN * SmemTile<kHeadDim>::kStride;
  static constexpr int kSmemQ = kBlockM * SmemTile<kHeadDim>::kStride;
  // K, V, then two stages of (Q, dO), then two stages of (lse*log2e, delta) floats.
  static constexpr int kSmemBytes = (2 * kSmemKV + 4 * kSmemQ) * sizeof(Element) + 4 * kBlockM * sizeof(float);
};

// Backward dQ: a block owns kBlockM queries of one q head (16 per warp) and walks the keys kBlockN at a
// time, double-buffering K and V.
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_>
struct BwdQTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kHeadDim / 8;

  static_assert(kBlockM == kNWarps * 16, "each warp owns one 16-query strip");
  static_assert(kBlockN % 16 == 0, "dS feeds mma as 16-wide k slices");
  static_assert(kHeadDim % 16 == 0, "ldmatrix pairs cover 16 columns of the head dim at a time");

  static constexpr int kSmemQ = kBlockM * SmemTile<kHeadDim>::kStride;
  static constexpr int kSmemKV = kBlockN * SmemTile<kHeadDim>::kStride;
  // Q, dO, then two stages of (K, V).
  static constexpr int kSmemBytes = (2 * kSmemQ + 4 * kSmemKV) * sizeof(Element);
};

}  // namespace flash_kernels

namespace flash_kernels {

// KV-cache attention (kvcache_kernel.cuh). A block owns kBlockM = 16 * kWarpsM packed rows (the q heads of
// one kv head x the queries) and walks its share of the keys kBlockN at a time through a kStages-deep
// cp.async ring. The block's 4 warps are laid out kWarpsM x kWarpsN: warp (wm, wn) owns rows
// 16 wm .. 16 wm + 15 and keys wn * kKeysPerWarp .. of every key block; with kWarpsN > 1 the warps hold
// separate softmax states that the epilogue merges (split-K inside the block).
template <typename Element_, int kHeadDim_, int kWarpsM_, int kWarpsN_, int kBlockN_, int kStages_>
struct KvcacheTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kNWarps = kWarpsM * kWarpsN;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kBlockM = 16 * kWarpsM;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kKeysPerWarp = kBlockN / kWarpsN;
  static constexpr int kNTiles = kKeysPerWarp / 8;  // 8-column accumulator tiles of S per warp
  static constexpr int kDTiles = kHeadDim / 8;

  static_assert(kNWarps == 4, "the loaders and the epilogue are written for 128 threads");
  static_assert(kKeysPerWarp % 16 == 0, "P feeds mma as 16-wide k slices, so each warp needs whole 16-key steps");
  static_assert(kBlockN % 16 == 0, "a 16-key group must not straddle a page (pages are multiples of 16)");
  static_assert(kHeadDim % 16 == 0, "ldmatrix pairs cover 16 columns of the head dim at a time");
  static_assert(kStages >= 2, "one stage computes while the next one loads");

  static constexpr int kSmemQ = kBlockM * SmemTile<kHeadDim>::kStride;
  static constexpr int kSmemKV = kBlockN * SmemTile<kHeadDim>::kStride;
  // Paged caches, one-strip (decode) shape only: the resolved page addresses of the ring's key blocks,
  // [kStages][kBlockN / 16] pairs of int64 (K, V element offsets), written a block ahead by a few threads so
  // the other threads' copy loop reads one broadcast entry per 16-row group instead of a block-table entry
  // plus two 64-bit products. The tall shapes keep per-thread lookups: there these bytes would cost a block
  // per SM (hdim 64 tall fits exactly 4 per SM on the H200).
  static constexpr bool kPageTable = kWarpsM == 1;
  static constexpr int kSmemTableOffset = (kSmemQ + 2 * kStages * kSmemKV) * static_cast<int>(sizeof(Element));
  static constexpr int kSmemTableBytes = kPageTable ? kStages * (kBlockN / 16) * 16 : 0;
  static constexpr int kSmemMainBytes = kSmemTableOffset + kSmemTableBytes;
  // Epilogue, reusing the same memory once the ring is drained: each warp's O (float32; rows padded by 8 floats
  // so the float2 stores of a quad's 8 rows fall in distinct banks) and its per-row max and sum.
  static constexpr int kORowStride = kHeadDim + 8;
  static constexpr int kSmemEpilogueBytes = kWarpsN * kBlockM * (kORowStride + 2) * 4;
  static constexpr int kSmemBytes = kSmemMainBytes > kSmemEpilogueBytes ? kSmemMainBytes : kSmemEpilogueBytes;
};

}  // namespace flash_kernels
