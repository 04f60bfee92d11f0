// The split-KV count of the KV-cache kernel: a model of its time on a GPU described by a few numbers. Plain
// C++ (no CUDA) so that tools/tests/test_split_model.py compiles it on a host without a GPU and checks the
// choices the measurements below call for.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flash_kernels {

// The split count, from a model of the kernel's time (microseconds) on this GPU. Every block streams its
// key blocks at the smaller of its share of the GPU's reachable read bandwidth and kBlockBytesPerUs, the most
// one block streams on its own; blocks beyond one wave run in further waves; each block pays a fixed start
// (the ring's first fill) and a split run pays the combine launch. The plan uses the cache capacity (lengths
// are device data and are not read back); each block divides its sequence's real length evenly between the
// splits.
// Measured (bf16, head dim 128, 32/8 heads, one new token; benchmarks/results/serving_path_20261205 and
// decode_h200_20261201): cuDNN and the best split count read the cache at 0.88-0.90 of the HBM peak that the
// memory clock and bus width give, on the H100 (3.35 TB/s peak) and the H200 (4.9 TB/s) alike. One decode
// block streams 22-24 GB/s on its own, bound by its own issue and latency. So on the H100 one block per SM
// (16 splits at b=1: 128 blocks x 23 GB/s) already reaches the reachable bandwidth and 32 splits (two blocks
// per SM) were 5-8% slower, while the H200's higher bandwidth needs two blocks per SM. A constant bandwidth
// (the H200's, as before) picked 32 splits on both.
struct SplitModel {
  static constexpr double kReachableShare = 0.88;
  static constexpr double kFallbackBytesPerUsPerSm = 4.4e6 / 132;  // the H200's, where the GPU reports no clock
  static constexpr double kBlockBytesPerUs = 23e3;
  static constexpr double kBlockStartUs = 1.5;
  static constexpr double kCombineUs = 2.5;
  static constexpr int kMaxSplits = 128;
  // A larger count must win by this much: where two counts tie in the model, the one with fewer blocks per SM
  // measured faster (less contention for the same bandwidth, less partial traffic).
  static constexpr double kWinBy = 0.97;
};

inline int plan_splits(int64_t units, int key_blocks, int tile_bytes, int blocks_per_sm, int num_sms,
                       double read_bytes_per_us, int requested) {
  const int max_splits = std::max(1, std::min(SplitModel::kMaxSplits, key_blocks));
  if (requested > 0) return std::min(requested, max_splits);
  const double slots = static_cast<double>(std::max(1, blocks_per_sm)) * num_sms;
  int best = 1;
  double best_us = 0;
  for (int s = 1; s <= max_splits; ++s) {
    const double blocks = static_cast<double>(units) * s;
    const double waves = std::ceil(blocks / slots);
    const double rate = std::min(read_bytes_per_us / std::min(blocks, slots), SplitModel::kBlockBytesPerUs);
    const double tiles = std::ceil(static_cast<double>(key_blocks) / s);
    const double us = waves * (tiles * tile_bytes / rate + SplitModel::kBlockStartUs) +
                      (s > 1 ? SplitModel::kCombineUs : 0.0);
    if (s == 1 || us < SplitModel::kWinBy * best_us) best = s, best_us = us;
  }
  return best;
}

// Reachable read bandwidth in bytes per microsecond from the memory clock (kHz) and bus width (bits) the
// device reports: HBM transfers twice per clock over the whole bus. A device that reports neither gets the
// H200's per-SM figure.
inline double read_bytes_per_us(int memory_khz, int bus_bits, int num_sms) {
  if (memory_khz <= 0 || bus_bits <= 0) return SplitModel::kFallbackBytesPerUsPerSm * num_sms;
  return SplitModel::kReachableShare * 2.0 * (memory_khz * 1e-3) * (bus_bits / 8.0);
}

}  // namespace flash_kernels
