// Host side of the CUDA path: validates inputs at the boundary, fills AttnParams, picks the compiled
// launcher from the generated dispatch table, and registers the ops with torch's dispatcher:
//   torch.ops.flash_kernels_cuda.fwd / .bwd / .varlen_fwd / .varlen_bwd / .kvcache_fwd / .compiled_head_dims
// No pybind11: the ops are reached through the dispatcher, so the module needs only CPython's stable ABI
// (module_init.cpp), and one cp39-abi3 wheel serves every Python of a torch/CUDA combination.
// Torch is reached only through torch_api.h: ATen/c10 in the version-bound build, torch's stable C ABI
// (torch/csrc/stable, the aoti_torch_* shim) when FLASH_KERNELS_STABLE_ABI is set (STABLE_ABI.md); only the
// registration blocks at the end differ between the two.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <sstream>
#include <tuple>
#include <vector>

#include "attn_params.h"
#include "instantiations/dispatch_table.inc"
#include "launch_check.h"
#include "torch_api.h"

namespace flash_kernels {
namespace {

using tapi::device_index;
using tapi::device_text;
using tapi::dims_text;
using tapi::in_ptr;
using tapi::kBFloat16;
using tapi::kFloat;
using tapi::kHalf;
using tapi::kInt;
using tapi::out_ptr;
using tapi::shape;
using tapi::Tensor;

std::string compiled_dims_text() {
  std::ostringstream s;
  for (size_t i = 0; i < std::size(kCompiledHeadDims); ++i) s << (i ? ", " : "") << kCompiledHeadDims[i];
  return s.str();
}

std::vector<int64_t> compiled_head_dims() {
  return std::vector<int64_t>(std::begin(kCompiledHeadDims), std::end(kCompiledHeadDims));
}

std::vector<int64_t> kvcache_head_dims() {
  return std::vector<int64_t>(std::begin(kKvcacheHeadDims), std::end(kKvcacheHeadDims));
}

void check_tensor(const Tensor& t, const char* name, const Tensor& q) {
  FK_CHECK(t.is_cuda(), "flash_kernels_cuda: ", name, " must be a CUDA tensor, got device ", device_text(t));
  FK_CHECK(t.device() == q.device(), "flash_kernels_cuda: ", name, " is on ", device_text(t), " but q is on ",
           device_text(q));
  FK_CHECK(t.scalar_type() == q.scalar_type(), "flash_kernels_cuda: ", name, " has dtype ", t.scalar_type(),
           " but q has ", q.scalar_type(), "; all of q, k, v (and dout, out) must share one dtype");
  FK_CHECK(t.dim() == 4, "flash_kernels_cuda: ", name, " must be 4-D (batch, seqlen, heads, head_dim), got ",
           t.dim(), "-D");
  FK_CHECK(t.stride(3) == 1, "flash_kernels_cuda: ", name,
           " must have a contiguous last dim (stride 1); call .contiguous() first");
  // The kernels copy 16 bytes (8 elements) at a time.
  FK_CHECK(reinterpret_cast<uintptr_t>(in_ptr(t)) % 16 == 0, "flash_kernels_cuda: ", name,
           " must be 16-byte aligned");
  for (int d = 0; d < 3; ++d) {
    FK_CHECK(t.size(d) <= 1 || t.stride(d) % 8 == 0, "flash_kernels_cuda: ", name, " stride(", d, ") = ",
             t.stride(d), " must be a multiple of 8 elements (16 bytes); call .contiguous() first");
  }
}

// Zeros a contiguous tensor on the stream the kernels run on: a memset rather than a torch kernel, whose code
// the driver may have to load on first use (device memory again), and whose failure the stable ABI would
// report without its type.
void zero_fill(const Tensor& t, cudaStream_t stream) {
  const int64_t bytes = t.numel() * tapi::element_bytes(t.scalar_type());
  if (bytes > 0) FK_CUDA_CHECK(cudaMemsetAsync(out_ptr(t), 0, static_cast<size_t>(bytes), stream));
}

Tensor zeros(const std::vector<int64_t>& dims, tapi::ScalarType dtype, const Tensor& like, cudaStream_t stream) {
  Tensor t = tapi::empty(dims, dtype, like);
  zero_fill(t, stream);
  return t;
}

void check_shape(const Tensor& t, const char* name, const std::vector<int64_t>& want) {
  FK_CHECK(shape(t) == want, "flash_kernels_cuda: ", name, " must have shape ", dims_text(want), ", got ",
           dims_text(shape(t)));
}

// A head dim d runs on the kernel compiled for the smallest head dim >= d; the kernel zero-fills columns
// [d, compiled) in shared memory and stores none of them (AttnParams::head_dim), so no tensor is padded.
// d must be a multiple of 8: the kernels copy whole 16-byte chunks of a row.
const KernelEntry& find_kernel(const Tensor& q, bool banded) {
  FK_CHECK(q.scalar_type() == kHalf || q.scalar_type() == kBFloat16,
           "flash_kernels_cuda: dtype ", q.scalar_type(), " is not supported (float16 or bfloat16)");
  const DType dtype = q.scalar_type() == kHalf ? DType::kFloat16 : DType::kBFloat16;
  const int64_t hd = q.size(3);
  FK_CHECK(hd > 0 && hd % 8 == 0, "flash_kernels_cuda: head dim ", hd,
           " must be a positive multiple of 8 (rows are copied in 16-byte chunks); use the Triton backend");
  const KernelEntry* best = nullptr;
  for (const KernelEntry& e : kKernels) {
    if (e.dtype == dtype && e.banded == banded && e.head_dim >= hd && (!best || e.head_dim < best->head_dim)) {
      best = &e;
    }
  }
  FK_CHECK(best != nullptr, "flash_kernels_cuda: head dim ", hd, " is larger than every head dim compiled in "
           "the CUDA path (compiled: ", compiled_dims_text(), ")");
  return *best;
}

// Compute capability (major * 10 + minor) of q's device, queried once per process: every forward and
// backward call asks, and the answer cannot change. Through the runtime rather than ATen/cuda/CUDAContext.h,
// whose includes (cuBLAS, cuSPARSE headers) are not in every CUDA toolkit that can build this extension.
int device_capability(const Tensor& q) {
  static const std::vector<int> capabilities = [] {
    int count = 0;
    FK_CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<int> caps(count);
    for (int d = 0; d < count; ++d) {
      int major = 0, minor = 0;
      FK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d));
      FK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d));
      caps[d] = major * 10 + minor;
    }
    return caps;
  }();
  const int device = device_index(q);
  FK_CHECK(device >= 0 && device < static_cast<int>(capabilities.size()), "flash_kernels_cuda: ", device_text(q),
           " is not one of the ", capabilities.size(), " CUDA devices this process sees");
  return capabilities[device];
}

void check_device_arch(const Tensor& q) {
  const int cc = device_capability(q);
  FK_CHECK(cc >= 80, "flash_kernels_cuda: needs an sm_80 (Ampere) or newer GPU; ", device_text(q), " is sm_", cc);
}

// The Hopper kernels (wgmma, TMA) replace the general ones on cc 9.0 devices when the module was built with
// 9.0a code: the forward and the backward for every head dim up to 256 (the entry for the smallest
// compiled Hopper head dim >= the call's; its bwd is nullptr where there is none).
// FLASH_KERNELS_CUDA_SM90=0 turns them off (A/B timing, or to rule them out when hunting a bug); the
// variable is read on every call, so a process can compare both.
struct Launcher {
  LaunchFn fn;
  int sm90_head_dim;  // the Hopper kernel's compiled head dim; 0 for the general kernels
};
Launcher pick_launcher(const Tensor& q, const KernelEntry& general, bool backward) {
  const Launcher fallback{backward ? general.bwd : general.fwd, 0};
#ifdef FLASH_KERNELS_SM90A
  const char* off = std::getenv("FLASH_KERNELS_CUDA_SM90");
  if (off != nullptr && std::string(off) == "0") return fallback;
  if (device_capability(q) != 90) return fallback;  // sm_90a code runs on exactly cc 9.0
  const KernelEntry* best = nullptr;
  for (const KernelEntry& e : kSm90Kernels) {
    if (e.dtype == general.dtype && e.banded == general.banded && e.head_dim >= q.size(3) &&
        (!best || e.head_dim < best->head_dim)) {
      best = &e;
    }
  }
  if (best) {
    const LaunchFn fn = backward ? best->bwd : best->fwd;
    if (fn != nullptr) return {fn, best->head_dim};
  }
#else
  (void)q;
#endif
  return fallback;
}

bool sm90_compiled() {
#ifdef FLASH_KERNELS_SM90A
  return true;
#else
  return false;
#endif
}

// Fills shapes, the mask band and the forward tensors. causal => window_right = 0 (flash_attn);
// -1 means unbounded and becomes a bound no (query, key) pair reaches.
AttnParams make_params(const Tensor& q, const Tensor& k, const Tensor& v, double softmax_scale,
                       bool causal, int64_t window_left, int64_t window_right, bool& banded) {
  AttnParams p{};
  p.batch = q.size(0);
  p.seqlen_q = q.size(1);
  p.heads_q = q.size(2);
  p.seqlen_k = k.size(1);
  p.heads_kv = k.size(2);
  p.head_dim = q.size(3);
  p.head_group = p.heads_q / p.heads_kv;
  p.q = in_ptr(q);
  p.k = in_ptr(k);
  p.v = in_ptr(v);
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.scale_log2 = static_cast<float>(softmax_scale * M_LOG2E);
  if (causal) window_right = 0;
  banded = causal || window_left >= 0 || window_right >= 0;
  p.diag_offset = p.seqlen_k - p.seqlen_q;
  // rel = key - query - diag_offset lies in [1 - seqlen_k, seqlen_q - 1], so these never cut anything.
  p.window_left = window_left < 0 ? p.seqlen_k : static_cast<int>(std::min<int64_t>(window_left, p.seqlen_k));
  p.window_right = window_right < 0 ? p.seqlen_q : static_cast<int>(std::min<int64_t>(window_right, p.seqlen_q));
  return p;
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, double softmax_scale,
               double softcap) {
  check_tensor(q, "q", q);
  check_tensor(k, "k", q);
  check_tensor(v, "v", q);
  check_device_arch(q);
  FK_CHECK(softcap == 0.0, "flash_kernels_cuda: softcap is not supported by the CUDA path (use the Triton backend)");
  FK_CHECK(softmax_scale > 0.0 && std::isfinite(softmax_scale), "flash_kernels_cuda: softmax_scale must be a "
           "positive finite number, got ", softmax_scale);
  const int64_t b = q.size(0), hq = q.size(2), d = q.size(3), sk = k.size(1), hk = k.size(2);
  check_shape(k, "k", {b, sk, hk, d});
  check_shape(v, "v", {b, sk, hk, d});
  FK_CHECK(hk > 0 && hq % hk == 0, "flash_kernels_cuda: q heads (", hq, ") must be a multiple of k/v heads (",
           hk, ")");
  FK_CHECK(q.size(1) < (1 << 30) && sk < (1 << 30), "flash_kernels_cuda: sequence lengths must be < 2^30");
}

// Varlen calls: the packed (total, heads, d) tensors are viewed as (1, total, heads, d) for the checks and
// the strides, then apply_varlen turns the params into one launch over all sequences.
struct Varlen {
  const Tensor& cu_seqlens_q;
  const Tensor& cu_seqlens_k;
  int64_t max_seqlen_q;
  int64_t max_seqlen_k;
};

void check_cu_seqlens(const Tensor& cu, const char* name, const Tensor& q) {
  FK_CHECK(cu.is_cuda() && cu.device() == q.device(), "flash_kernels_cuda: ", name, " must be on ", device_text(q));
  FK_CHECK(cu.scalar_type() == kInt && cu.dim() == 1 && cu.numel() >= 2 && cu.is_contiguous(),
           "flash_kernels_cuda: ", name, " must be a contiguous 1-D int32 tensor of batch+1 cumulative lengths");
}

// Sequence b of the batch reads rows cu_seqlens[b] .. cu_seqlens[b+1] (the kernels' select_sequence). The
// grid covers max_seqlen_q / max_seqlen_k, which (as in flash_attn) must be >= every sequence's length;
// the cumulative lengths are device data and are not read back here (that would synchronise the stream).
void apply_varlen(AttnParams& p, const Varlen& vl, const Tensor& q4) {
  check_cu_seqlens(vl.cu_seqlens_q, "cu_seqlens_q", q4);
  check_cu_seqlens(vl.cu_seqlens_k, "cu_seqlens_k", q4);
  FK_CHECK(vl.cu_seqlens_q.numel() == vl.cu_seqlens_k.numel(), "flash_kernels_cuda: cu_seqlens_q and "
           "cu_seqlens_k must have the same number of entries (batch + 1)");
  FK_CHECK(vl.max_seqlen_q >= 0 && vl.max_seqlen_k >= 0 && vl.max_seqlen_q < (1 << 30) &&
           vl.max_seqlen_k < (1 << 30), "flash_kernels_cuda: max_seqlen_q / max_seqlen_k must be in [0, 2^30)");
  p.total_q = p.seqlen_q;
  p.total_k = p.seqlen_k;
  p.batch = static_cast<int>(vl.cu_seqlens_q.numel() - 1);
  p.seqlen_q = static_cast<int>(vl.max_seqlen_q);
  p.seqlen_k = static_cast<int>(vl.max_seqlen_k);
  p.cu_seqlens_q = in_ptr<int>(vl.cu_seqlens_q);
  p.cu_seqlens_k = in_ptr<int>(vl.cu_seqlens_k);
  // make_params bounded the window by the total lengths, which no sequence exceeds: still "unbounded".
  p.lse_batch_stride = 0;
  p.lse_head_stride = p.total_q;
}

// The (1, total, heads, d) views have a batch stride of total * heads * d; the kernels add
// b * batch_stride for sequence b, so a varlen launch must see 0 (sequences are found through cu_seqlens).
void clear_batch_strides(AttnParams& p) {
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 0;
  p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = 0;
}

void set_dense_lse_layout(AttnParams& p) {
  p.lse_batch_stride = static_cast<int64_t>(p.heads_q) * p.seqlen_q;
  p.lse_head_stride = p.seqlen_q;
}

// ---- paged KV -------------------------------------------------------------------------------------
void check_int32_vector(const Tensor& t, const char* name, int64_t n, const Tensor& q) {
  FK_CHECK(t.is_cuda() && t.device() == q.device(), "flash_kernels_cuda: ", name, " must be on ", device_text(q),
           ", got ", device_text(t));
  FK_CHECK(t.scalar_type() == kInt && t.dim() == 1 && t.size(0) == n && t.is_contiguous(),
           "flash_kernels_cuda: ", name, " must be a contiguous int32 tensor of shape (", n, "), got ",
           t.scalar_type(), " ", dims_text(shape(t)));
}

// k and v are (num_pages, page_size, heads_kv, head_dim) caches and block_table (batch, max_blocks) int32.
// Page ids are device data and are not read back (a host sync): ids outside [0, num_pages) are never
// dereferenced by the kernels and read as zeros (AttnParams).
void apply_paged(AttnParams& p, const Tensor& k, const Tensor& v, const Tensor& block_table,
                 int64_t batch, const Tensor& q) {
  const int64_t num_pages = k.size(0), page_size = k.size(1);
  FK_CHECK(page_size > 0 && page_size % 16 == 0, "flash_kernels_cuda: paged KV needs a page size (k_cache.size(1)) "
           "that is a multiple of 16, got ", page_size);
  check_shape(v, "v_cache", shape(k));
  FK_CHECK(block_table.is_cuda() && block_table.device() == q.device(), "flash_kernels_cuda: block_table must be "
           "on ", device_text(q), ", got ", device_text(block_table));
  FK_CHECK(block_table.scalar_type() == kInt && block_table.dim() == 2 && block_table.size(0) == batch &&
                  (block_table.size(1) <= 1 || block_table.stride(1) == 1),
           "flash_kernels_cuda: block_table must be an int32 (batch=", batch, ", max_blocks) tensor with a "
           "contiguous last dim, got ", block_table.scalar_type(), " ", dims_text(shape(block_table)));
  const int64_t capacity = block_table.size(1) * page_size;
  FK_CHECK(capacity < (1 << 30) && num_pages < (1LL << 31), "flash_kernels_cuda: max_blocks * page_size (",
           capacity, ") must be < 2^30");
  p.block_table = in_ptr<int>(block_table);
  p.block_table_stride = block_table.stride(0);
  p.k_page_stride = k.stride(0);
  p.v_page_stride = v.stride(0);
  p.page_size = static_cast<int>(page_size);
  p.page_shift = (page_size & (page_size - 1)) == 0 ? __builtin_ctzll(static_cast<uint64_t>(page_size)) : -1;
  p.num_pages = static_cast<int>(num_pages);
  p.cache_capacity = static_cast<int>(capacity);
}

// Number of SMs of q's device, queried once per device.
int device_sm_count(const Tensor& q) {
  static const std::vector<int> counts = [] {
    int count = 0;
    FK_CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<int> sms(count);
    for (int d = 0; d < count; ++d) FK_CUDA_CHECK(cudaDeviceGetAttribute(&sms[d], cudaDevAttrMultiProcessorCount, d));
    return sms;
  }();
  return counts.at(device_index(q));
}

// KV-cache attention: q (batch, seqlen_q, heads_q, d) against a dense (cache_batch, capacity, heads_kv, d) or
// paged (num_pages, page_size, heads_kv, d) cache. See AttnParams for how cache_seqlens / cache_leftpad /
// cache_batch_idx / block_table select the keys; none of them is read on the host.
std::tuple<Tensor, Tensor> kvcache_fwd(const Tensor& q, const Tensor& k_cache,
                                               const Tensor& v_cache, const Tensor& cache_seqlens,
                                               const std::optional<Tensor>& block_table,
                                               const std::optional<Tensor>& cache_batch_idx,
                                               const std::optional<Tensor>& cache_leftpad, double softmax_scale,
                                               int64_t window_left, int64_t window_right, double softcap,
                                               int64_t num_splits) {
  check_tensor(q, "q", q);
  check_tensor(k_cache, "k_cache", q);
  check_tensor(v_cache, "v_cache", q);
  check_device_arch(q);
  FK_CHECK(softmax_scale > 0.0 && std::isfinite(softmax_scale), "flash_kernels_cuda: softmax_scale must be a "
           "positive finite number, got ", softmax_scale);
  FK_CHECK(softcap >= 0.0 && std::isfinite(softcap), "flash_kernels_cuda: softcap must be >= 0 (0 disables "
           "it), got ", softcap);
  FK_CHECK(window_left >= -1 && window_right >= -1, "flash_kernels_cuda: window sizes must be >= 0, or -1 for "
           "unbounded; got (", window_left, ", ", window_right, ")");
  FK_CHECK(num_splits >= 0, "flash_kernels_cuda: num_splits must be >= 0 (0 = automatic), got ", num_splits);
  const int64_t b = q.size(0), sq = q.size(1), hq = q.size(2), d = q.size(3), hk = k_cache.size(2);
  FK_CHECK(k_cache.size(3) == d, "flash_kernels_cuda: k_cache head dim ", k_cache.size(3), " differs from q's ", d);
  FK_CHECK(hk > 0 && hq % hk == 0, "flash_kernels_cuda: q heads (", hq, ") must be a multiple of k/v heads (", hk,
           ")");
  FK_CHECK(b < 65536 && hk < 65536, "flash_kernels_cuda: batch and kv heads must be < 65536");
  check_int32_vector(cache_seqlens, "cache_seqlens", b, q);
  if (cache_leftpad) check_int32_vector(*cache_leftpad, "cache_leftpad", b, q);

  AttnParams p{};
  const bool paged = block_table.has_value();
  if (paged) {
    FK_CHECK(!cache_batch_idx, "flash_kernels_cuda: cache_batch_idx cannot be combined with block_table (as in "
             "flash_attn): the block table already maps each sequence to its pages");
    apply_paged(p, k_cache, v_cache, *block_table, b, q);
  } else {
    const int64_t cache_batch = k_cache.size(0), capacity = k_cache.size(1);
    check_shape(v_cache, "v_cache", shape(k_cache));
    FK_CHECK(capacity < (1 << 30), "flash_kernels_cuda: the cache length must be < 2^30, got ", capacity);
    if (cache_batch_idx) {
      check_int32_vector(*cache_batch_idx, "cache_batch_idx", b, q);
      p.cache_batch_idx = in_ptr<int>(*cache_batch_idx);
    } else {
      FK_CHECK(cache_batch >= b, "flash_kernels_cuda: k_cache has ", cache_batch, " sequences but q has ", b,
               "; pass cache_batch_idx to pick cache rows");
    }
    p.cache_batch = static_cast<int>(cache_batch);
    p.cache_capacity = static_cast<int>(capacity);
    p.k_batch_stride = k_cache.stride(0), p.v_batch_stride = v_cache.stride(0);
  }
  FK_CHECK(sq + p.cache_capacity < (1 << 30), "flash_kernels_cuda: seqlen_q + cache length must be < 2^30");

  const DType dtype = q.scalar_type() == kHalf ? DType::kFloat16 : DType::kBFloat16;
  FK_CHECK(q.scalar_type() == kHalf || q.scalar_type() == kBFloat16, "flash_kernels_cuda: dtype ",
           q.scalar_type(), " is not supported (float16 or bfloat16)");
  FK_CHECK(d > 0 && d % 8 == 0, "flash_kernels_cuda: head dim ", d, " must be a positive multiple of 8");
  const bool tall = sq * (hq / hk) > 16;
  const KvcacheEntry* entry = nullptr;
  for (const KvcacheEntry& e : kKvcacheKernels) {
    if (e.dtype == dtype && e.tall == tall && e.head_dim >= d && (!entry || e.head_dim < entry->head_dim)) entry = &e;
  }
  FK_CHECK(entry != nullptr, "flash_kernels_cuda: head dim ", d, " is larger than every head dim compiled for "
           "the KV-cache kernel (", kKvcacheHeadDims[std::size(kKvcacheHeadDims) - 1], ")");

  const tapi::DeviceGuard guard(device_index(q));
  const cudaStream_t stream = tapi::current_stream(device_index(q));
  Tensor out = tapi::empty(shape(q), q.scalar_type(), q);
  Tensor lse = tapi::empty({b, hq, sq}, kFloat, q);
  if (out.numel() == 0) return {out, lse};
  if (p.cache_capacity == 0 || k_cache.numel() == 0) {  // no key anywhere: every row sees none
    tapi::fill_(lse, INFINITY);
    zero_fill(out, stream);
    return {out, lse};
  }
  p.batch = static_cast<int>(b);
  p.seqlen_q = static_cast<int>(sq);
  p.heads_q = static_cast<int>(hq);
  p.heads_kv = static_cast<int>(hk);
  p.head_dim = static_cast<int>(d);
  p.head_group = static_cast<int>(hq / hk);
  p.seqlen_k = p.cache_capacity;
  p.q = in_ptr(q);
  p.k = in_ptr(k_cache);
  p.v = in_ptr(v_cache);
  p.out = out_ptr(out);
  p.lse = out_ptr<float>(lse);
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.k_row_stride = k_cache.stride(1), p.k_head_stride = k_cache.stride(2);
  p.v_row_stride = v_cache.stride(1), p.v_head_stride = v_cache.stride(2);
  p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
  set_dense_lse_layout(p);
  p.cache_seqlens = in_ptr<int>(cache_seqlens);
  p.cache_leftpad = cache_leftpad ? in_ptr<int>(*cache_leftpad) : nullptr;
  if (softcap > 0.0) {
    // The scale goes inside the tanh; the softmax then runs on the capped scores as they are.
    p.softcap = static_cast<float>(softcap);
    p.softcap_scale = static_cast<float>(softmax_scale / softcap);
    p.softmax_scale = 1.f;
    p.scale_log2 = static_cast<float>(M_LOG2E);
  } else {
    p.softmax_scale = static_cast<float>(softmax_scale);
    p.scale_log2 = static_cast<float>(softmax_scale * M_LOG2E);
  }
  // rel = position - query - (seqlen - seqlen_q) lies in [-capacity, seqlen_q - 1]: these never cut.
  p.window_left =
      window_left < 0 ? p.cache_capacity : static_cast<int>(std::min<int64_t>(window_left, p.cache_capacity));
  p.window_right = window_right < 0 ? p.seqlen_q : static_cast<int>(std::min<int64_t>(window_right, p.seqlen_q));

  p.num_splits = entry->plan(p, device_sm_count(q), static_cast<int>(std::min<int64_t>(num_splits, 1 << 20)));
  Tensor partials;  // one allocation: O (splits, b, hq, sq, d), then lse (splits, b, hq, sq); float32
  if (p.num_splits > 1) {
    const int64_t rows = p.num_splits * b * hq * sq;
    partials = tapi::empty({rows * (d + 1)}, kFloat, q);
    p.partial_o = out_ptr<float>(partials);
    p.partial_lse = p.partial_o + rows * d;
  }
  entry->run(p, stream);
  return {out, lse};
}

// q, k, v are 4-D here (varlen ones viewed as batch 1). Returns out like q and lse in flash_attn's layout.
// block_table (varlen only): k and v are paged caches, see apply_paged.
std::tuple<Tensor, Tensor> fwd_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                            double softmax_scale, bool causal, int64_t window_left,
                                            int64_t window_right, double softcap, const Varlen* varlen,
                                            const Tensor* block_table = nullptr) {
  if (block_table) {
    // The paged cache is not (batch, seqlen, ...): check it by its own shape; q's checks are check_qkv's.
    check_qkv(q, q, q, softmax_scale, softcap);
    check_tensor(k, "k", q);
    check_tensor(v, "v", q);
    FK_CHECK(k.size(3) == q.size(3), "flash_kernels_cuda: k head dim ", k.size(3), " differs from q's ", q.size(3));
    FK_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "flash_kernels_cuda: q heads (", q.size(2),
             ") must be a multiple of k/v heads (", k.size(2), ")");
  } else {
    check_qkv(q, k, v, softmax_scale, softcap);
  }
  const tapi::DeviceGuard guard(device_index(q));
  const cudaStream_t stream = tapi::current_stream(device_index(q));
  Tensor out = tapi::empty(shape(q), q.scalar_type(), q);
  Tensor lse = varlen ? tapi::empty({q.size(2), q.size(1)}, kFloat, q)
                      : tapi::empty({q.size(0), q.size(2), q.size(1)}, kFloat, q);
  bool banded = false;
  AttnParams p = make_params(q, k, v, softmax_scale, causal, window_left, window_right, banded);
  if (varlen) {
    apply_varlen(p, *varlen, q);
  } else {
    set_dense_lse_layout(p);
  }
  if (block_table) {
    apply_paged(p, k, v, *block_table, p.batch, q);
    // make_params bounded the left window by k.size(1), here the page size; bound it by the capacity.
    p.window_left = window_left < 0 ? p.cache_capacity
                                    : static_cast<int>(std::min<int64_t>(window_left, p.cache_capacity));
  }
  const KernelEntry& kernel = find_kernel(q, banded);
  // No query, or no key at all (every row sees none): O = 0, lse = +inf, no launch (the Hopper kernel's
  // tensor maps cannot describe an empty tensor).
  if (out.numel() == 0 || p.seqlen_q == 0 || k.size(1) == 0 || (block_table && p.cache_capacity == 0)) {
    tapi::fill_(lse, INFINITY);
    zero_fill(out, stream);
    return {out, lse};
  }
  p.out = out_ptr(out);
  p.lse = out_ptr<float>(lse);
  p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
  if (varlen) clear_batch_strides(p);
  // The Hopper forward reads K/V through tensor maps of one contiguous tensor: paged KV runs the general kernel.
  const LaunchFn launch = block_table ? kernel.fwd : pick_launcher(q, kernel, false).fn;
  launch(p, stream);
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> bwd_impl(const Tensor& dout, const Tensor& q,
                                                        const Tensor& k, const Tensor& v,
                                                        const Tensor& out, const Tensor& lse,
                                                        double softmax_scale, bool causal, int64_t window_left,
                                                        int64_t window_right, double softcap, const Varlen* varlen) {
  check_qkv(q, k, v, softmax_scale, softcap);
  check_tensor(dout, "dout", q);
  check_tensor(out, "out", q);
  check_shape(dout, "dout", shape(q));
  check_shape(out, "out", shape(q));
  FK_CHECK(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == kFloat && lse.is_contiguous(),
           "flash_kernels_cuda: lse must be a contiguous float32 CUDA tensor on q's device");
  if (varlen) {
    check_shape(lse, "lse", {q.size(2), q.size(1)});
  } else {
    check_shape(lse, "lse", {q.size(0), q.size(2), q.size(1)});
  }
  const tapi::DeviceGuard guard(device_index(q));
  const cudaStream_t stream = tapi::current_stream(device_index(q));
  bool banded = false;
  AttnParams p = make_params(q, k, v, softmax_scale, causal, window_left, window_right, banded);
  if (varlen) {
    apply_varlen(p, *varlen, q);
  } else {
    set_dense_lse_layout(p);
  }
  const KernelEntry& kernel = find_kernel(q, banded);
  // Degenerate sizes: no query or no key means every gradient is zero (and empty grids cannot launch).
  if (q.numel() == 0 || k.numel() == 0 || p.seqlen_q == 0 || p.seqlen_k == 0) {
    return {zeros(shape(q), q.scalar_type(), q, stream), zeros(shape(k), k.scalar_type(), k, stream),
            zeros(shape(v), v.scalar_type(), v, stream)};
  }
  Tensor dq = tapi::empty(shape(q), q.scalar_type(), q);
  Tensor dk = tapi::empty(shape(k), k.scalar_type(), k);
  Tensor dv = tapi::empty(shape(v), v.scalar_type(), v);
  Tensor delta = tapi::empty(shape(lse), kFloat, lse);
  p.out = const_cast<void*>(in_ptr(out));
  p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
  p.lse = const_cast<float*>(in_ptr<float>(lse));
  p.dout = in_ptr(dout);
  p.do_batch_stride = dout.stride(0), p.do_row_stride = dout.stride(1), p.do_head_stride = dout.stride(2);
  p.dq = out_ptr(dq);
  p.dq_batch_stride = dq.stride(0), p.dq_row_stride = dq.stride(1), p.dq_head_stride = dq.stride(2);
  p.dk = out_ptr(dk);
  p.dk_batch_stride = dk.stride(0), p.dk_row_stride = dk.stride(1), p.dk_head_stride = dk.stride(2);
  p.dv = out_ptr(dv);
  p.dv_batch_stride = dv.stride(0), p.dv_row_stride = dv.stride(1), p.dv_head_stride = dv.stride(2);
  p.delta = out_ptr<float>(delta);
  if (varlen) clear_batch_strides(p);
  const Launcher launch = pick_launcher(q, kernel, true);
  // The single-pass Hopper backward's float32 dQ tiles and their counters, zeroed (dq_accum.cuh).
  std::optional<Tensor> workspace;
  if (launch.sm90_head_dim != 0 && sm90_bwd_accumulates_dq(launch.sm90_head_dim)) {
    p.dq_accum_rows = (varlen ? int64_t{p.total_q} : int64_t{p.batch} * p.seqlen_q) + int64_t{kDqTileRows} * p.batch;
    p.dq_semaphores_per_head = p.dq_accum_rows / kDqTileRows + 1;
    const int64_t accum_floats = p.heads_q * p.dq_accum_rows * launch.sm90_head_dim;
    workspace = zeros({accum_floats + p.heads_q * p.dq_semaphores_per_head}, kFloat, q, stream);
    p.dq_accum = out_ptr<float>(*workspace);
    p.dq_semaphore = reinterpret_cast<int*>(p.dq_accum + accum_floats);
  }
  launch.fn(p, stream);
  return {dq, dk, dv};
}

std::tuple<Tensor, Tensor> fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                       double softmax_scale, bool causal, int64_t window_left,
                                       int64_t window_right, double softcap) {
  return fwd_impl(q, k, v, softmax_scale, causal, window_left, window_right, softcap, nullptr);
}

std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                   const Tensor& v, const Tensor& out, const Tensor& lse,
                                                   double softmax_scale, bool causal, int64_t window_left,
                                                   int64_t window_right, double softcap, bool deterministic) {
  // The backward is deterministic whatever `deterministic` asks: the general kernels and the Hopper ones above
  // head dim 128 use no atomics, and the single-pass Hopper kernel adds its dQ tiles in a fixed order.
  (void)deterministic;
  return bwd_impl(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, nullptr);
}

Tensor as_batch_of_one(const Tensor& t, const char* name) {
  FK_CHECK(t.dim() == 3, "flash_kernels_cuda: varlen ", name, " must be 3-D (total_tokens, heads, head_dim), got ",
           t.dim(), "-D");
  return tapi::unsqueeze(t, 0);
}

std::tuple<Tensor, Tensor> varlen_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                                              bool causal, int64_t window_left, int64_t window_right,
                                              double softcap, const std::optional<Tensor>& block_table) {
  const Varlen vl{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  if (block_table) {
    // k, v: (num_pages, page_size, heads_kv, head_dim); cu_seqlens_k gives each sequence's length.
    FK_CHECK(k.dim() == 4 && v.dim() == 4, "flash_kernels_cuda: with block_table, k and v must be paged caches "
             "(num_pages, page_size, heads_kv, head_dim), got ", k.dim(), "-D and ", v.dim(), "-D");
    auto [out, lse] = fwd_impl(as_batch_of_one(q, "q"), k, v, softmax_scale, causal, window_left, window_right,
                               softcap, &vl, &*block_table);
    return {tapi::squeeze(out, 0), lse};
  }
  auto [out, lse] = fwd_impl(as_batch_of_one(q, "q"), as_batch_of_one(k, "k"), as_batch_of_one(v, "v"),
                             softmax_scale, causal, window_left, window_right, softcap, &vl);
  return {tapi::squeeze(out, 0), lse};
}

std::tuple<Tensor, Tensor, Tensor> varlen_bwd(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
    const Tensor& lse, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
    double softcap, bool deterministic) {
  (void)deterministic;  // always deterministic (see bwd)
  const Varlen vl{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  auto [dq, dk, dv] =
      bwd_impl(as_batch_of_one(dout, "dout"), as_batch_of_one(q, "q"), as_batch_of_one(k, "k"),
               as_batch_of_one(v, "v"), as_batch_of_one(out, "out"), lse, softmax_scale, causal, window_left,
               window_right, softcap, &vl);
  return {tapi::squeeze(dq, 0), tapi::squeeze(dk, 0), tapi::squeeze(dv, 0)};
}

// Loads every kernel of the module on `device` (and opts it in to its shared memory) without launching one:
// under lazy module loading the driver otherwise loads a kernel's code on its first launch, which needs device
// memory then, when the GPU may be full. Walks each launcher in prepare-only mode (launch_check.h). Returns
// how many launchers it walked.
int64_t prepare_kernels(int64_t device) {
  int count = 0;
  FK_CUDA_CHECK(cudaGetDeviceCount(&count));
  FK_CHECK(device >= 0 && device < count, "flash_kernels_cuda: prepare_kernels: device ", device, " is not one of the ",
           count, " CUDA devices this process sees");
  const tapi::DeviceGuard guard(static_cast<int>(device));
  int major = 0, minor = 0;
  FK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, static_cast<int>(device)));
  FK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, static_cast<int>(device)));
  int sms = 0;
  FK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, static_cast<int>(device)));
  const PrepareOnlyScope prepare_only;
  AttnParams p{};  // no launch reads it; sizes of one so every host computation stays in range
  p.batch = p.seqlen_q = p.seqlen_k = p.heads_q = p.heads_kv = p.head_group = p.head_dim = 1;
  p.cache_capacity = p.cache_batch = 64;
  p.num_splits = 1;
  int64_t walked = 0;
  for (const KernelEntry& e : kKernels) {
    e.fwd(p, nullptr);
    e.bwd(p, nullptr);
    walked += 2;
  }
#ifdef FLASH_KERNELS_SM90A
  if (major * 10 + minor == 90) {  // sm_90a code loads on exactly cc 9.0
    for (const KernelEntry& e : kSm90Kernels) {
      for (const LaunchFn fn : {e.fwd, e.bwd}) {
        if (fn != nullptr) {
          fn(p, nullptr);
          ++walked;
        }
      }
    }
  }
#endif
  for (const KvcacheEntry& e : kKvcacheKernels) {
    e.plan(p, sms, 1);
    e.run(p, nullptr);
    walked += 2;
  }
  return walked;
}

// The tensor ops' schemas, the same in both builds (tools/tests/test_cuda_ops_registration.py pins them).
constexpr const char* kTensorOpSchemas[] = {
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left, int window_right, "
    "float softcap) -> (Tensor, Tensor)",
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float softmax_scale, bool causal, "
    "int window_left, int window_right, float softcap, bool deterministic) -> (Tensor, Tensor, Tensor)",
    "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "Tensor? block_table=None) -> (Tensor, Tensor)",
    "kvcache_fwd(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, Tensor? block_table, "
    "Tensor? cache_batch_idx, Tensor? cache_leftpad, float softmax_scale, int window_left, int window_right, "
    "float softcap, int num_splits) -> (Tensor, Tensor)",
    "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
    "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, "
    "int window_left, int window_right, float softcap, bool deterministic) -> (Tensor, Tensor, Tensor)",
};

}  // namespace
}  // namespace flash_kernels

#ifdef FLASH_KERNELS_STABLE_ABI
// Stable registration: schemas through aoti_torch_library_def, boxed kernels (TORCH_BOX) through
// torch_library_impl. The stable library has no def(schema, fn) catch-all, so the ops without tensor
// arguments get CompositeExplicitAutograd kernels, which the dispatcher also runs for a call that carries
// no dispatch key (pytorch's own stable-ABI test extension registers its no-tensor ops this way).
STABLE_TORCH_LIBRARY(flash_kernels_cuda, m) {
  for (const char* schema : flash_kernels::kTensorOpSchemas) m.def(schema);
  m.def("compiled_head_dims() -> int[]");
  m.def("sm90_compiled() -> bool");  // whether the module carries the Hopper (sm_90a: wgmma, TMA) kernels
  m.def("kvcache_head_dims() -> int[]");
  m.def("prepare_kernels(int device) -> int");  // load every kernel on the device now (see prepare_kernels)
}

STABLE_TORCH_LIBRARY_IMPL(flash_kernels_cuda, CUDA, m) {
  m.impl("fwd", TORCH_BOX(&flash_kernels::fwd));
  m.impl("bwd", TORCH_BOX(&flash_kernels::bwd));
  m.impl("varlen_fwd", TORCH_BOX(&flash_kernels::varlen_fwd));
  m.impl("varlen_bwd", TORCH_BOX(&flash_kernels::varlen_bwd));
  m.impl("kvcache_fwd", TORCH_BOX(&flash_kernels::kvcache_fwd));
}

STABLE_TORCH_LIBRARY_IMPL(flash_kernels_cuda, CompositeExplicitAutograd, m) {
  m.impl("compiled_head_dims", TORCH_BOX(&flash_kernels::compiled_head_dims));
  m.impl("sm90_compiled", TORCH_BOX(&flash_kernels::sm90_compiled));
  m.impl("kvcache_head_dims", TORCH_BOX(&flash_kernels::kvcache_head_dims));
  m.impl("prepare_kernels", TORCH_BOX(&flash_kernels::prepare_kernels));
}

#else  // version-bound build

TORCH_LIBRARY(flash_kernels_cuda, m) {
  for (const char* schema : flash_kernels::kTensorOpSchemas) m.def(schema);
  // No tensor arguments: registered as a catch-all kernel, callable without a device.
  m.def("compiled_head_dims() -> int[]", &flash_kernels::compiled_head_dims);
  // Whether the module carries the Hopper (sm_90a: wgmma, TMA) kernels.
  m.def("sm90_compiled() -> bool", &flash_kernels::sm90_compiled);
  m.def("kvcache_head_dims() -> int[]", &flash_kernels::kvcache_head_dims);
  m.def("prepare_kernels(int device) -> int", &flash_kernels::prepare_kernels);
}

TORCH_LIBRARY_IMPL(flash_kernels_cuda, CUDA, m) {
  m.impl("fwd", &flash_kernels::fwd);
  m.impl("bwd", &flash_kernels::bwd);
  m.impl("varlen_fwd", &flash_kernels::varlen_fwd);
  m.impl("varlen_bwd", &flash_kernels::varlen_bwd);
  m.impl("kvcache_fwd", &flash_kernels::kvcache_fwd);
}

#endif  // FLASH_KERNELS_STABLE_ABI
