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
