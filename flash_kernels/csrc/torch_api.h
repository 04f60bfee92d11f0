// The libtorch facilities ops.cpp uses, behind one small interface, in two builds:
//
//   FLASH_KERNELS_STABLE_ABI defined (FLASH_KERNELS_TORCH_ABI=stable): only torch's stable C++ headers
//     (torch/csrc/stable, torch/headeronly) and the aoti_torch_* / torch_* C shim. The object then has no
//     undefined libtorch/c10/ATen C++ symbol, and one build loads on the targeted torch and every later one.
//     TORCH_TARGET_VERSION must be set (setup.py passes it); with it, torch's own non-stable headers
//     (ATen, c10, torch/library.h) #error when included, so a stray include cannot slip through.
//   otherwise (FLASH_KERNELS_TORCH_ABI=version): ATen/c10, as before; the wheel is bound to one torch minor.
//
// ops.cpp is written once against this interface; only the op registration at its end differs per mode.
// See STABLE_ABI.md for the facility-by-facility mapping and why the stable target is torch 2.10.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "launch_check.h"

#ifdef FLASH_KERNELS_STABLE_ABI
#ifndef TORCH_TARGET_VERSION
#error "FLASH_KERNELS_STABLE_ABI needs -DTORCH_TARGET_VERSION=<oldest torch ABI>, e.g. 0x020a000000000000 (2.10)"
#endif
// Declares the CUDA part of the C shim (aoti_torch_get_current_cuda_stream); torch's CUDA libraries define it.
#ifndef USE_CUDA
#define USE_CUDA
#endif
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/version.h>
#include <torch/headeronly/core/DeviceType.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/HeaderOnlyArrayRef.h>
#include <torch/headeronly/util/shim_utils.h>
// torch::stable::empty(size, dtype, layout, device), Tensor::mutable_data_ptr<T>() / const_data_ptr<T>() and
// the std::vector<int64_t> return of compiled_head_dims() (schema int[]) exist from stable ABI 2.10 on.
#if TORCH_FEATURE_VERSION < TORCH_VERSION_2_10_0
#error "flash_kernels' stable-ABI build needs TORCH_TARGET_VERSION >= 2.10 (see STABLE_ABI.md)"
#endif
#else
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>
#endif

namespace flash_kernels {
namespace tapi {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream s;
  ((s << args), ...);
  return s.str();
}

inline std::string dims_text(const std::vector<int64_t>& dims) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < dims.size(); ++i) s << (i ? ", " : "") << dims[i];
  s << ']';
  return s.str();
}

inline int64_t numel_of(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

#ifdef FLASH_KERNELS_STABLE_ABI

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kInt = ScalarType::Int;

// TORCH_CHECK's counterpart: the message alone (STD_TORCH_CHECK would prefix function, file and line), as
// a std::runtime_error, which torch's dispatcher passes on and Python raises as RuntimeError.
#define FK_CHECK(cond, ...)                                                     \
  do {                                                                          \
    if (!(cond)) throw std::runtime_error(::flash_kernels::tapi::cat(__VA_ARGS__)); \
  } while (0)

inline int device_index(const Tensor& t) { return t.get_device_index(); }

// c10::Device's text ("cuda:0", "cpu") for the device types a call can carry here.
inline std::string device_text(const Tensor& t) {
  const torch::stable::Device d = t.device();
  std::string name;
  switch (d.type()) {
    case torch::headeronly::DeviceType::CPU: name = "cpu"; break;
    case torch::headeronly::DeviceType::CUDA: name = "cuda"; break;
    case torch::headeronly::DeviceType::Meta: name = "meta"; break;
    default: name = cat("device_type_", static_cast<int>(d.type())); break;
  }
  return d.has_index() ? cat(name, ':', d.index()) : name;
}

inline std::vector<int64_t> shape(const Tensor& t) { return t.sizes().vec(); }

// Read-only inputs take const_data_ptr (no copy-on-write materialisation), outputs mutable_data_ptr.
inline const void* in_ptr(const Tensor& t) { return t.const_data_ptr(); }
inline void* out_ptr(const Tensor& t) { return t.mutable_data_ptr(); }
template <typename T>
const T* in_ptr(const Tensor& t) { return t.const_data_ptr<T>(); }  // checks the dtype
template <typename T>
T* out_ptr(const Tensor& t) { return t.mutable_data_ptr<T>(); }

// The C shim's code of the dtypes the ops allocate.
inline int32_t shim_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return aoti_torch_dtype_float16();
    case ScalarType::BFloat16: return aoti_torch_dtype_bfloat16();
    case ScalarType::Float: return aoti_torch_dtype_float32();
    case ScalarType::Int: return aoti_torch_dtype_int32();
    default: FK_CHECK(false, "flash_kernels: no allocation of dtype ", t, " is expected here");
  }
  return 0;  // unreachable: FK_CHECK threw
}

inline int64_t element_bytes(ScalarType t) { return t == ScalarType::Half || t == ScalarType::BFloat16 ? 2 : 4; }

// aoti_torch_empty_strided failed. The shim turned torch's exception into an error code (after logging its
// message: "Exception in aoti_torch: CUDA out of memory. Tried to allocate ..."), so its type is lost. A CUDA
// allocation of a valid size on a healthy context fails only for lack of memory (the device's, or the limit
// torch's allocator was given): that is reported as DeviceOutOfMemory, which Python raises as
// torch.OutOfMemoryError; a context that CUDA reports broken gives a plain error naming the call.
// Runs under the caller's DeviceGuard (the allocation's device is the current one).
[[noreturn]] inline __attribute__((noinline, cold)) void allocation_failed(const std::vector<int64_t>& dims,
                                                                          ScalarType dtype, int device) {
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t health = cudaMemGetInfo(&free_bytes, &total_bytes);
  const std::string what = cat("allocating a ", dims_text(dims), " ", dtype, " tensor (",
                               numel_of(dims) * element_bytes(dtype), " bytes) on cuda:", device,
                               " through torch's caching allocator (aoti_torch_empty_strided) failed");
  if (health != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(cat("flash_kernels: ", what, "; CUDA reports ", cudaGetErrorName(health), " (",
                                 cudaGetErrorString(health), ")"));
  }
  throw DeviceOutOfMemory(cat(what, "; the device has ", free_bytes >> 20, " MiB free of ", total_bytes >> 20,
                              " MiB (torch's own message is in the log, after 'Exception in aoti_torch')"));
}

// A new contiguous tensor of `dims` and `dtype` on `like`'s device, straight from the C shim
// (aoti_torch_empty_strided). torch::stable::empty goes through the boxed dispatcher, a schema lookup per
// tensor, which made decode (bound by host work per call, three outputs) 17-27% slower than the
// version-bound build on the H200 (benchmarks/results/stable_abi_20261202).
inline Tensor empty(const std::vector<int64_t>& dims, ScalarType dtype, const Tensor& like) {
  std::vector<int64_t> strides(dims.size());
  int64_t step = 1;
  for (size_t i = dims.size(); i-- > 0;) {  // contiguous strides, as torch computes them (size 0 counts as 1)
    strides[i] = step;
    step *= dims[i] > 1 ? dims[i] : 1;
  }
  int32_t device_type = 0, device_index = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(like.get(), &device_index));
  AtenTensorHandle handle = nullptr;
  if (aoti_torch_empty_strided(static_cast<int64_t>(dims.size()), dims.data(), strides.data(), shim_dtype(dtype),
                               device_type, device_index, &handle) != AOTI_TORCH_SUCCESS ||
      handle == nullptr) {
    allocation_failed(dims, dtype, device_index);
  }
  return Tensor(handle);
}
inline Tensor fill_(Tensor& t, double value) { return torch::stable::fill_(t, value); }
inline Tensor unsqueeze(const Tensor& t, int64_t dim) { return torch::stable::unsqueeze(t, dim); }
inline Tensor squeeze(const Tensor& t, int64_t dim) { return torch::stable::squeeze(t, dim); }

// c10::cuda::getCurrentCUDAStream(device).stream(): the C shim returns the same cudaStream_t.
inline cudaStream_t current_stream(int device) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return static_cast<cudaStream_t>(stream);
}

// c10::cuda::CUDAGuard's counterpart: sets the current device of the current accelerator (CUDA here) and
// restores the previous one on destruction. (An alias, not a wrapper: torch::stable types have hidden
// visibility, and a default-visibility class holding one draws a -Wattributes warning.)
using DeviceGuard = torch::stable::accelerator::DeviceGuard;

#else  // version-bound build: ATen/c10

using Tensor = at::Tensor;
using ScalarType = at::ScalarType;
constexpr ScalarType kHalf = at::kHalf;
constexpr ScalarType kBFloat16 = at::kBFloat16;
constexpr ScalarType kFloat = at::kFloat;
constexpr ScalarType kInt = at::kInt;

#define FK_CHECK(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)

inline int device_index(const Tensor& t) { return t.device().index(); }
inline std::string device_text(const Tensor& t) { return c10::str(t.device()); }
inline std::vector<int64_t> shape(const Tensor& t) { return t.sizes().vec(); }

inline const void* in_ptr(const Tensor& t) { return t.const_data_ptr(); }
inline void* out_ptr(const Tensor& t) { return t.mutable_data_ptr(); }
template <typename T>
const T* in_ptr(const Tensor& t) { return t.const_data_ptr<T>(); }
template <typename T>
T* out_ptr(const Tensor& t) { return t.mutable_data_ptr<T>(); }

inline int64_t element_bytes(ScalarType t) { return t == at::kHalf || t == at::kBFloat16 ? 2 : 4; }

// at::empty raises c10::OutOfMemoryError itself, which Python receives as torch.OutOfMemoryError.
inline Tensor empty(const std::vector<int64_t>& dims, ScalarType dtype, const Tensor& like) {
  return at::empty(dims, like.options().dtype(dtype));
}
inline Tensor fill_(Tensor& t, double value) { return t.fill_(value); }
inline Tensor unsqueeze(const Tensor& t, int64_t dim) { return t.unsqueeze(dim); }
inline Tensor squeeze(const Tensor& t, int64_t dim) { return t.squeeze(dim); }

inline cudaStream_t current_stream(int device) { return c10::cuda::getCurrentCUDAStream(device).stream(); }

using DeviceGuard = c10::cuda::CUDAGuard;  // constructed from a device index

#endif  // FLASH_KERNELS_STABLE_ABI

}  // namespace tapi
}  // namespace flash_kernels
