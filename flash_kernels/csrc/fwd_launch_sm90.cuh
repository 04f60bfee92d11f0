// Forward launch for Hopper (attn_fwd_sm90_kernel): builds the tensor maps the copy engine reads through
// and launches. Included only by the generated instantiation files (csrc/instantiations/fwd_sm90_*.cu);
// ops.cpp picks these launchers on cc 9.0 devices when the extension was built with 9.0a code
// (FLASH_KERNELS_SM90A). Tile shapes and their reasons: FwdSm90Traits (fwd_kernel_sm90.cuh).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "fwd_kernel_sm90.cuh"
#include "launch_check.h"

namespace flash_kernels {

using TensorMapEncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                       const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled lives in the driver library; asking the runtime for it keeps the module free of
// a link-time dependency on libcuda (as torch's own extensions are).
inline TensorMapEncodeFn tensor_map_encoder() {
  static const TensorMapEncodeFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    FK_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found));
#else
    FK_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &found));
#endif
    if (found != cudaDriverEntryPointSuccess || ptr == nullptr) {
      throw std::runtime_error("flash_kernels: the CUDA driver has no cuTensorMapEncodeTiled (needs a CUDA 12 driver)");
    }
    return reinterpret_cast<TensorMapEncodeFn>(ptr);
  }();
  return fn;
}

// A (batch, rows, heads, head_dim) tensor with element strides as a 4-D map (head_dim innermost); rows >= 1
// (ops.cpp launches nothing for an empty k). Size-1 dims may carry any stride in torch; the map needs
// multiples of 16 bytes, and the coordinate there is always 0, so such a dim gets the byte size of
// everything inside it. Columns past head_dim and rows past `rows` read as zeros.
template <typename T>
CUtensorMap make_tensor_map(const void* ptr, int head_dim, int rows, int heads, int batch, int64_t row_stride,
                            int64_t head_stride, int64_t batch_stride, int box_rows) {
  const uint64_t row_bytes = rows > 1 ? row_stride * sizeof(T) : (head_dim * sizeof(T) + 15) / 16 * 16;
  const uint64_t head_bytes = heads > 1 ? head_stride * sizeof(T) : row_bytes * rows;
  const uint64_t batch_bytes = batch > 1 ? batch_stride * sizeof(T) : head_bytes * heads;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {row_bytes, head_bytes, batch_bytes};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(kAtomCols), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(&map, type, 4, const_cast<void*>(ptr), dims, strides, box, element_strides,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw std::runtime_error("flash_kernels: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(r) +
                             ") for a tensor of " + std::to_string(batch) + " x " + std::to_string(rows) + " x " +
                             std::to_string(heads) + " x " + std::to_string(head_dim) + ", strides (rows, heads, batch) " +
                             std::to_string(row_stride) + ", " + std::to_string(head_stride) + ", " +
                             std::to_string(batch_stride) + " elements");
  }
  return map;
}

template <typename T, int kHeadDim, bool kBanded>
void run_fwd_sm90(const AttnParams& p, cudaStream_t stream) {
  using Traits = FwdSm90Traits<T, kHeadDim>;
  const bool varlen = p.cu_seqlens_q != nullptr;
  // Varlen tensors are one packed sequence of total rows; each block finds its own through cu_seqlens.
  const int batch = varlen ? 1 : p.batch;
  const int rows_q = varlen ? p.total_q : p.seqlen_q;
  const int rows_k = varlen ? p.total_k : p.seqlen_k;
  const dim3 grid((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, p.heads_q, p.batch);
  constexpr int threads = Traits::kNThreads, smem = Traits::kSmemBytes;
  Sm90TensorMaps maps{};
  if (t_prepare_only) {  // both variants, no tensors to describe
    launch_kernel<attn_fwd_sm90_kernel<Traits, kBanded, true>>(grid, threads, smem, stream, p, maps);
    launch_kernel<attn_fwd_sm90_kernel<Traits, kBanded, false>>(grid, threads, smem, stream, p, maps);
    return;
  }
  maps.q = make_tensor_map<T>(p.q, p.head_dim, rows_q, p.heads_q, batch, p.q_row_stride, p.q_head_stride,
                              p.q_batch_stride, Traits::kBlockM);
  maps.k = make_tensor_map<T>(p.k, p.head_dim, rows_k, p.heads_kv, batch, p.k_row_stride, p.k_head_stride,
                              p.k_batch_stride, Traits::kBlockN);
  maps.v = make_tensor_map<T>(p.v, p.head_dim, rows_k, p.heads_kv, batch, p.v_row_stride, p.v_head_stride,
                              p.v_batch_stride, Traits::kBlockN);
  if (varlen) {
    launch_kernel<attn_fwd_sm90_kernel<Traits, kBanded, true>>(grid, threads, smem, stream, p, maps);
  } else {
    launch_kernel<attn_fwd_sm90_kernel<Traits, kBanded, false>>(grid, threads, smem, stream, p, maps);
  }
}

}  // namespace flash_kernels
