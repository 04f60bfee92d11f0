// Where the key/value rows of one kv head live: dense rows at a fixed stride, or pages of a KV cache through
// a block table (see AttnParams), one row at a time: the varlen forward's paged variant, where the copy is a
// small part of a compute-bound block. The KV-cache kernel, bound by its copies, resolves pages once per
// 16-row group instead (KvBlockLoader in kvcache_kernel.cuh).
#pragma once
#include <cstdint>

namespace flash_kernels {

// Row source for load_rows_async: the address of key position `pos`, or nullptr for positions outside
// [kbeg, kend) and for page ids outside [0, num_pages), which the loaders then zero-fill instead of reading.
template <typename T>
struct CacheRows {
  const T* base;        // dense: the sequence's first row of this kv head; paged: the cache + kv head offset
  int64_t row_stride;   // between positions (dense) or rows of a page (paged)
  int64_t page_stride;  // paged only
  const int* pages;     // the sequence's block-table row; null when dense
  int page_size, page_shift, num_pages;
  int kbeg, kend;

  __device__ __forceinline__ const T* operator()(int pos) const {
    if (pos < kbeg || pos >= kend) return nullptr;
    if (pages == nullptr) return base + pos * row_stride;
    const int slot = page_shift >= 0 ? pos >> page_shift : pos / page_size;
    const int page = __ldg(pages + slot);
    if (static_cast<unsigned>(page) >= static_cast<unsigned>(num_pages)) return nullptr;
    return base + page * page_stride + (pos - slot * page_size) * row_stride;
  }
};

}  // namespace flash_kernels
