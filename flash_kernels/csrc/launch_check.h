// Host-side error check for CUDA runtime calls made by the launch code. Instantiation files do not include
// torch headers (they compile several times faster without them), so errors are thrown as
// std::runtime_error, which torch's op dispatcher hands to Python as a RuntimeError.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define FK_CUDA_CHECK(expr)                                                                              \
  do {                                                                                                   \
    const cudaError_t fk_err_ = (expr);                                                                  \
    if (fk_err_ != cudaSuccess) {                                                                        \
      throw std::runtime_error(std::string("flash_kernels CUDA error: ") + cudaGetErrorString(fk_err_) + \
                               " at " __FILE__ ":" + std::to_string(__LINE__) + " in " #expr);           \
    }                                                                                                    \
  } while (0)
