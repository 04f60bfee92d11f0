// KV-cache attention launch: tile shapes per head dim (with the reasons), the split-KV plan, and the
// launches of attn_kvcache_kernel and kvcache_combine_kernel. Included only by the generated instantiation
// files (csrc/instantiations/kvcache_*.cu).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "kvcache_kernel.cuh"
#include "launch_check.h"
#include "split_model.h"

namespace flash_kernels {

// Two shapes per head dim, picked on the host by the packed row count seqlen_q * (heads_q / heads_kv):
// - decode (<= 16 rows: one token of a GQA group of up to 16 q heads, or a few tokens of smaller groups):
//   one 16-row strip, the 4 warps split each key block four ways (kWarpsN = 4), so a 16-row tile still
//   has 4 warps issuing loads and math. 3 stages keep 2 key blocks in flight per block.
// - tall (> 16 rows: chunked prefill, speculative decoding): 4 warps x 16 rows = 64 rows sharing each key
//   block, as the forward kernel's one-strip shape.
// Key blocks are 32 KB of K+V per stage at head dims 64 and 128, so a decode block holds 64 KB in flight:
// on the H200 (228 KB of shared memory per SM) two decode blocks fit per SM at head dim 64/128
// (98 KB / 100 KB each), 128 KB in flight per SM, comfortably above the ~35 KB that the SM's share of HBM
// bandwidth times DRAM latency (~4.4 TB/s / 132 SMs x ~1 us) needs. Head dim 256 doubles the bytes per key:
// 64 keys x 2 stages (144 KB) is the deepest ring that still fits sm_80's 163 KB, one block per SM.
template <typename T, int kHeadDim>
struct KvcacheConfig;

template <typename T>
struct KvcacheConfig<T, 64> {
  using Decode = KvcacheTraits<T, 64, 1, 4, 128, 3>;  // 32 keys per warp per block
  using Tall = KvcacheTraits<T, 64, 4, 1, 64, 3>;     // Q 8 KB + 3 x 16 KB
};
template <typename T>
struct KvcacheConfig<T, 128> {
  using Decode = KvcacheTraits<T, 128, 1, 4, 64, 3>;  // 16 keys per warp per block
  using Tall = KvcacheTraits<T, 128, 4, 1, 64, 2>;    // Q 16 KB + 2 x 32 KB = 80 KB: two blocks per SM on sm_80 too
};
template <typename T>
struct KvcacheConfig<T, 256> {
  using Decode = KvcacheTraits<T, 256, 1, 4, 64, 2>;
  using Tall = KvcacheTraits<T, 256, 4, 1, 32, 2>;    // O is 128 fp32 registers per thread: keep S small
};

// The device's reachable read bandwidth (split_model.h), from its memory clock and bus width.
inline double device_read_bytes_per_us(int device, int num_sms) {
  int khz = 0, bits = 0;
  FK_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device));
  FK_CUDA_CHECK(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device));
  return read_bytes_per_us(khz, bits, num_sms);
}

// Per-device state of one kernel: the occupancy query is a driver call, made once per device (after
// prepare_kernel) so the per-call path is an array read. A failed query is not remembered.
struct KernelDeviceState {
  static constexpr int kMaxDevices = 64;
  std::atomic<int> blocks_per_sm[kMaxDevices] = {};  // 0: not prepared yet

  template <auto Kernel>
  int prepare(int threads, int smem) {
    const int device = current_device();
    if (device >= kMaxDevices) throw std::runtime_error("flash_kernels: more than 64 CUDA devices");
    int n = blocks_per_sm[device].load(std::memory_order_relaxed);
    if (n == 0) {
      prepare_kernel<Kernel>(smem);
      FK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, threads, smem));
      if (n < 1) throw std::runtime_error("flash_kernels: the KV-cache kernel does not fit on this GPU");
      blocks_per_sm[device].store(n, std::memory_order_relaxed);
    }
    return n;
  }
};

template <typename T>
void run_kvcache_combine(const AttnParams& p, cudaStream_t stream);

template <typename Traits>
int kvcache_m_blocks(const AttnParams& p) {
  return (p.seqlen_q * p.head_group + Traits::kBlockM - 1) / Traits::kBlockM;
}

template <typename Traits>
KernelDeviceState& kvcache_state() {
  static KernelDeviceState state;
  return state;
}

// The split count run_kvcache will be given (requested > 0: honoured up to one key block per split).
template <typename T, int kHeadDim, bool kTall>
int plan_kvcache(const AttnParams& p, int num_sms, int requested) {
  using Config = KvcacheConfig<T, kHeadDim>;
  using Traits = std::conditional_t<kTall, typename Config::Tall, typename Config::Decode>;
  const int per_sm =
      kvcache_state<Traits>().template prepare<attn_kvcache_kernel<Traits>>(Traits::kNThreads, Traits::kSmemBytes);
  const int64_t units = static_cast<int64_t>(p.batch) * p.heads_kv * kvcache_m_blocks<Traits>(p);
  const int key_blocks = (p.cache_capacity + Traits::kBlockN - 1) / Traits::kBlockN;
  const int tile_bytes = 2 * Traits::kBlockN * kHeadDim * static_cast<int>(sizeof(T));
  const int device = current_device();
  // Planned once per shape: a decode loop repeats one shape, so the last answer is kept per thread.
  struct Plan {
    int64_t units;
    int key_blocks, per_sm, num_sms, requested, device, splits;
  };
  thread_local Plan last{-1, 0, 0, 0, 0, -1, 0};
  if (last.units != units || last.key_blocks != key_blocks || last.per_sm != per_sm || last.num_sms != num_sms ||
      last.requested != requested || last.device != device) {
    last = {units, key_blocks, per_sm, num_sms, requested, device,
            plan_splits(units, key_blocks, tile_bytes, per_sm, num_sms, device_read_bytes_per_us(device, num_sms),
                        requested)};
  }
  return last.splits;
}

template <typename T, int kHeadDim, bool kTall>
void run_kvcache(const AttnParams& p, cudaStream_t stream) {
  using Config = KvcacheConfig<T, kHeadDim>;
  using Traits = std::conditional_t<kTall, typename Config::Tall, typename Config::Decode>;
  const int64_t x = static_cast<int64_t>(kvcache_m_blocks<Traits>(p)) * p.num_splits;
  if (x > INT32_MAX) throw std::runtime_error("flash_kernels: KV-cache grid too large (seqlen_q x splits)");
  const dim3 grid(static_cast<unsigned>(x), p.heads_kv, p.batch);
  launch_kernel<attn_kvcache_kernel<Traits>>(grid, Traits::kNThreads, Traits::kSmemBytes, stream, p);
  if (p.num_splits > 1 || t_prepare_only) run_kvcache_combine<T>(p, stream);
}

// Compute capability major of the current device, queried once per device.
inline int current_device_major() {
  static std::atomic<int> majors[KernelDeviceState::kMaxDevices] = {};
  const int device = current_device();
  if (device >= KernelDeviceState::kMaxDevices) throw std::runtime_error("flash_kernels: more than 64 CUDA devices");
  int major = majors[device].load(std::memory_order_relaxed);
  if (major == 0) {
    FK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    majors[device].store(major, std::memory_order_relaxed);
  }
  return major;
}

template <typename T>
void run_kvcache_combine(const AttnParams& p, cudaStream_t stream) {
  const int64_t threads = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q * (p.head_dim / 4);
  const int64_t blocks = (threads + 127) / 128;
  if (blocks > INT32_MAX) throw std::runtime_error("flash_kernels: KV-cache combine grid too large");
  // On sm_90 the combine is a programmatic dependent launch: it is scheduled while the split kernel drains
  // (that kernel signals griddepcontrol.launch_dependents) instead of after it, hiding the launch gap; it
  // waits for the partials itself. Graph capture records the dependency as a programmatic edge.
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(128);
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = current_device_major() >= 9 ? 1 : 0;
  prepare_kernel<kvcache_combine_kernel<T>>(0);
  if (t_prepare_only) return;
  FK_CUDA_CHECK(cudaLaunchKernelEx(&config, kvcache_combine_kernel<T>, p));
}
// One definition of each, in instantiations/kvcache_combine.cu (the head-dim files only call it).
extern template void run_kvcache_combine<__half>(const AttnParams&, cudaStream_t);
extern template void run_kvcache_combine<__nv_bfloat16>(const AttnParams&, cudaStream_t);

}  // namespace flash_kernels
