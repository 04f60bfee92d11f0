// Host-side error checks for the CUDA runtime calls of the launch code, and the one-time preparation of a
// kernel per device. Instantiation files do not include torch headers (they compile several times faster
// without them), so errors are thrown as std::runtime_error, which torch's op dispatcher hands to Python as a
// RuntimeError. A call that failed for lack of device memory throws DeviceOutOfMemory, whose message starts
// with kOutOfMemoryMarker: flash_kernels/out_of_memory.py raises it as torch.OutOfMemoryError (the stable
// ABI cannot carry c10's exception types across, so the marker is the contract between the two sides).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace flash_kernels {

inline constexpr const char kOutOfMemoryMarker[] = "flash_kernels: out of GPU memory: ";

struct DeviceOutOfMemory : std::runtime_error {
  explicit DeviceOutOfMemory(const std::string& what) : std::runtime_error(kOutOfMemoryMarker + what) {}
};

// Out of line: the error path stays out of every launcher's hot code.
[[noreturn]] inline __attribute__((noinline, cold)) void throw_cuda_error(cudaError_t err, const char* call,
                                                                          const char* where) {
  // The runtime keeps the failure as the thread's "last error" until someone reads it; left there it would
  // make torch's next kernel-launch check (cudaGetLastError) raise this error against an unrelated torch op.
  // Errors that corrupt the context (sticky ones) stay whatever this does.
  (void)cudaGetLastError();
  const std::string text = std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ") in " + call +
                           " at " + where;
  // cudaErrorMemoryAllocation: device memory ran out, also where the driver needed some itself (loading a
  // kernel's code on first use under lazy module loading, a launch's resources).
  if (err == cudaErrorMemoryAllocation) throw DeviceOutOfMemory(text);
  throw std::runtime_error("flash_kernels CUDA error: " + text);
}

#define FK_STRINGIFY_(x) #x
#define FK_STRINGIFY(x) FK_STRINGIFY_(x)
#define FK_CUDA_CHECK(expr)                                                                    \
  do {                                                                                         \
    const cudaError_t fk_err_ = (expr);                                                        \
    if (fk_err_ != cudaSuccess) {                                                              \
      ::flash_kernels::throw_cuda_error(fk_err_, #expr, __FILE__ ":" FK_STRINGIFY(__LINE__)); \
    }                                                                                          \
  } while (0)

// The device the runtime will launch on (the caller's DeviceGuard set it).
inline int current_device() {
  int device = 0;
  FK_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// Once per (kernel, device): loads the kernel (under lazy module loading its code reaches the device on first
// use) and opts it in to `smem` bytes of dynamic shared memory where that exceeds the default 48 KB. The
// driver work that can fail for lack of memory then happens in one checked call instead of inside every
// launch; a failed preparation is not remembered, so the next call tries again (after memory was freed).
// Devices 0-63 are remembered; a process seeing more prepares the others on every call.
template <auto Kernel>
void prepare_kernel(int smem) {
  static std::atomic<uint64_t> prepared{0};
  const int device = current_device();
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (prepared.load(std::memory_order_acquire) & bit)) return;
  cudaFuncAttributes attrs;
  FK_CUDA_CHECK(cudaFuncGetAttributes(&attrs, Kernel));
  if (smem > 48 * 1024) {
    FK_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  prepared.fetch_or(bit, std::memory_order_acq_rel);
}

// True while prepare_kernels (ops.cpp) walks the launchers on this thread: launch_kernel then prepares each
// kernel it would launch and launches nothing, and the launchers skip the host work that needs real tensors
// (the Hopper kernels' tensor maps).
inline thread_local bool t_prepare_only = false;

struct PrepareOnlyScope {
  PrepareOnlyScope() { t_prepare_only = true; }
  ~PrepareOnlyScope() { t_prepare_only = false; }
  PrepareOnlyScope(const PrepareOnlyScope&) = delete;
  PrepareOnlyScope& operator=(const PrepareOnlyScope&) = delete;
};

// Launches Kernel, prepared once per device, on `stream`. cudaLaunchKernel returns the launch's own error (a
// bad configuration, or no memory for its resources), where <<<...>>> followed by cudaGetLastError would also
// report an unrelated error left pending by an earlier runtime call of this thread. `args` are the kernel's
// parameters, by value and of exactly its parameter types. The kernel goes in as `const void*`, the runtime's
// C entry point: CUDA 12.4's nvcc cannot deduce the `const T*` of the template overload from a function pointer.
template <auto Kernel, typename... Args>
void launch_kernel(dim3 grid, dim3 block, int smem, cudaStream_t stream, Args... args) {
  prepare_kernel<Kernel>(smem);
  if (t_prepare_only) return;
  void* params[] = {static_cast<void*>(&args)...};
  const void* kernel = reinterpret_cast<const void*>(Kernel);
  FK_CUDA_CHECK(cudaLaunchKernel(kernel, grid, block, params, static_cast<size_t>(smem), stream));
}

}  // namespace flash_kernels
