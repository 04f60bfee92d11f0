// Host side of the CUDA path: validates inputs at the boundary, fills AttnParams, picks the compiled
// launcher from the generated dispatch table, and registers the ops with torch's dispatcher:
//   torch.ops.flash_kernels_cuda.fwd / .bwd / .varlen_fwd / .varlen_bwd / .compiled_head_dims
// No pybind11: the ops are reached through the dispatcher, so the module needs only the stable ABI
// (module_init.cpp), and one cp39-abi3 wheel serves every Python of a torch/CUDA combination.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <sstream>
#include <tuple>
#include <vector>

#include "attn_params.h"
#include "instantiations/dispatch_table.inc"

namespace flash_kernels {
namespace {

std::string compiled_dims_text() {
  std::ostringstream s;
  for (size_t i = 0; i < std::size(kCompiledHeadDims); ++i) s << (i ? ", " : "") << kCompiledHeadDims[i];
  return s.str();
}

std::vector<int64_t> compiled_head_dims() {
  return std::vector<int64_t>(std::begin(kCompiledHeadDims), std::end(kCompiledHeadDims));
}

void check_tensor(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.is_cuda(), "flash_kernels_cuda: ", name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == q.device(), "flash_kernels_cuda: ", name, " is on ", t.device(), " but q is on ",
              q.device());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "flash_kernels_cuda: ", name, " has dtype ", t.scalar_type(),
              " but q has ", q.scalar_type(), "; all of q, k, v (and dout, out) must share one dtype");
  TORCH_CHECK(t.dim() == 4, "flash_kernels_cuda: ", name, " must be 4-D (batch, seqlen, heads, head_dim), got ",
              t.dim(), "-D");
  TORCH_CHECK(t.stride(3) == 1, "flash_kernels_cuda: ", name,
              " must have a contiguous last dim (stride 1); call .contiguous() first");
  // The kernels copy 16 bytes (8 elements) at a time.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "flash_kernels_cuda: ", name,
              " must be 16-byte aligned");
  for (int d = 0; d < 3; ++d) {
    TORCH_CHECK(t.size(d) <= 1 || t.stride(d) % 8 == 0, "flash_kernels_cuda: ", name, " stride(", d, ") = ",
                t.stride(d), " must be a multiple of 8 elements (16 bytes); call .contiguous() first");
  }
}

void check_shape(const at::Tensor& t, const char* name, at::IntArrayRef want) {
  TORCH_CHECK(t.sizes() == want, "flash_kernels_cuda: ", name, " must have shape ", want, ", got ", t.sizes());
}

// A head dim d runs on the kernel compiled for the smallest head dim >= d; the kernel zero-fills columns
// [d, compiled) in shared memory and stores none of them (AttnParams::head_dim), so no tensor is padded.
// d must be a multiple of 8: the kernels copy whole 16-byte chunks of a row.
const KernelEntry& find_kernel(const at::Tensor& q, bool banded) {
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "flash_kernels_cuda: dtype ", q.scalar_type(), " is not supported (float16 or bfloat16)");
  const DType dtype = q.scalar_type() == at::kHalf ? DType::kFloat16 : DType::kBFloat16;
  const int64_t hd = q.size(3);
  TORCH_CHECK(hd > 0 && hd % 8 == 0, "flash_kernels_cuda: head dim ", hd,
              " must be a positive multiple of 8 (rows are copied in 16-byte chunks); use the Triton backend");
  const KernelEntry* best = nullptr;
  for (const KernelEntry& e : kKernels) {
    if (e.dtype == dtype && e.banded == banded && e.head_dim >= hd && (!best || e.head_dim < best->head_dim)) {
      best = &e;
    }
  }
  TORCH_CHECK(best != nullptr, "flash_kernels_cuda: head dim ", hd, " is larger than every head dim compiled in "
              "the CUDA path (compiled: ", compiled_dims_text(), ")");
  return *best;
}

// Compute capability (major * 10 + minor) of q's device, queried once per process: every forward and
// backward call asks, and the answer cannot change. Through the runtime rather than ATen/cuda/CUDAContext.h,
// whose includes (cuBLAS, cuSPARSE headers) are not in every CUDA toolkit that can build this extension.
int device_capability(const at::Tensor& q) {
  static const std::vector<int> capabilities = [] {
    int count = 0;
    C10_CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<int> caps(count);
    for (int d = 0; d < count; ++d) {
      int major = 0, minor = 0;
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d));
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d));
      caps[d] = major * 10 + minor;
    }
    return caps;
  }();
  const int device = q.device().index();
  TORCH_CHECK(device >= 0 && device < static_cast<int>(capabilities.size()), "flash_kernels_cuda: ", q.device(),
              " is not one of the ", capabilities.size(), " CUDA devices this process sees");
  return capabilities[device];
}

void check_device_arch(const at::Tensor& q) {
  const int cc = device_capability(q);
  TORCH_CHECK(cc >= 80, "flash_kernels_cuda: needs an sm_80 (Ampere) or newer GPU; ", q.device(), " is sm_", cc);
}

// The Hopper kernels (wgmma, TMA) replace the general ones on cc 9.0 devices when the module was built with
// 9.0a code: the forward for every head dim up to 256, the backward for head dims up to 128 (the
// entry for the smallest compiled Hopper head dim >= the call's; its bwd is nullptr where there is none).
// FLASH_KERNELS_CUDA_SM90=0 turns them off (A/B timing, or to rule them out when hunting a bug); the
// variable is read on every call, so a process can compare both.
LaunchFn pick_launcher(const at::Tensor& q, const KernelEntry& general, bool backward) {
  const LaunchFn fallback = backward ? general.bwd : general.fwd;
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
    if (fn != nullptr) return fn;
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
AttnParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double softmax_scale,
                       bool causal, int64_t window_left, int64_t window_right, bool& banded) {
  AttnParams p{};
  p.batch = q.size(0);
  p.seqlen_q = q.size(1);
  p.heads_q = q.size(2);
  p.seqlen_k = k.size(1);
  p.heads_kv = k.size(2);
  p.head_dim = q.size(3);
  p.head_group = p.heads_q / p.heads_kv;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
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

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double softmax_scale,
               double softcap) {
  check_tensor(q, "q", q);
  check_tensor(k, "k", q);
  check_tensor(v, "v", q);
  check_device_arch(q);
  TORCH_CHECK(softcap == 0.0, "flash_kernels_cuda: softcap is not supported by the CUDA path (use the Triton backend)");
  TORCH_CHECK(softmax_scale > 0.0 && std::isfinite(softmax_scale), "flash_kernels_cuda: softmax_scale must be a "
              "positive finite number, got ", softmax_scale);
  const int64_t b = q.size(0), hq = q.size(2), d = q.size(3), sk = k.size(1), hk = k.size(2);
  check_shape(k, "k", {b, sk, hk, d});
  check_shape(v, "v", {b, sk, hk, d});
  TORCH_CHECK(hk > 0 && hq % hk == 0, "flash_kernels_cuda: q heads (", hq, ") must be a multiple of k/v heads (",
              hk, ")");
  TORCH_CHECK(q.size(1) < (1 << 30) && sk < (1 << 30), "flash_kernels_cuda: sequence lengths must be < 2^30");
}

// Varlen calls: the packed (total, heads, d) tensors are viewed as (1, total, heads, d) for the checks and
// the strides, then apply_varlen turns the params into one launch over all sequences.
struct Varlen {
  const at::Tensor& cu_seqlens_q;
  const at::Tensor& cu_seqlens_k;
  int64_t max_seqlen_q;
  int64_t max_seqlen_k;
};

void check_cu_seqlens(const at::Tensor& cu, const char* name, const at::Tensor& q) {
  TORCH_CHECK(cu.is_cuda() && cu.device() == q.device(), "flash_kernels_cuda: ", name, " must be on ", q.device());
  TORCH_CHECK(cu.scalar_type() == at::kInt && cu.dim() == 1 && cu.numel() >= 2 && cu.is_contiguous(),
              "flash_kernels_cuda: ", name, " must be a contiguous 1-D int32 tensor of batch+1 cumulative lengths");
}

// Sequence b of the batch reads rows cu_seqlens[b] .. cu_seqlens[b+1] (the kernels' select_sequence). The
// grid covers max_seqlen_q / max_seqlen_k, which (as in flash_attn) must be >= every sequence's length;
// the cumulative lengths are device data and are not read back here (that would synchronise the stream).
void apply_varlen(AttnParams& p, const Varlen& vl, const at::Tensor& q4) {
  check_cu_seqlens(vl.cu_seqlens_q, "cu_seqlens_q", q4);
  check_cu_seqlens(vl.cu_seqlens_k, "cu_seqlens_k", q4);
  TORCH_CHECK(vl.cu_seqlens_q.numel() == vl.cu_seqlens_k.numel(), "flash_kernels_cuda: cu_seqlens_q and "
              "cu_seqlens_k must have the same number of entries (batch + 1)");
  TORCH_CHECK(vl.max_seqlen_q >= 0 && vl.max_seqlen_k >= 0 && vl.max_seqlen_q < (1 << 30) &&
              vl.max_seqlen_k < (1 << 30), "flash_kernels_cuda: max_seqlen_q / max_seqlen_k must be in [0, 2^30)");
  p.total_q = p.seqlen_q;
  p.total_k = p.seqlen_k;
  p.batch = static_cast<int>(vl.cu_seqlens_q.numel() - 1);
  p.seqlen_q = static_cast<int>(vl.max_seqlen_q);
  p.seqlen_k = static_cast<int>(vl.max_seqlen_k);
  p.cu_seqlens_q = vl.cu_seqlens_q.data_ptr<int>();
  p.cu_seqlens_k = vl.cu_seqlens_k.data_ptr<int>();
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

// q, k, v are 4-D here (varlen ones viewed as batch 1). Returns out like q and lse in flash_attn's layout.
std::tuple<at::Tensor, at::Tensor> fwd_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            double softmax_scale, bool causal, int64_t window_left,
                                            int64_t window_right, double softcap, const Varlen* varlen) {
  check_qkv(q, k, v, softmax_scale, softcap);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = varlen ? at::empty({q.size(2), q.size(1)}, q.options().dtype(at::kFloat))
                          : at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  bool banded = false;
  AttnParams p = make_params(q, k, v, softmax_scale, causal, window_left, window_right, banded);
  if (varlen) {
    apply_varlen(p, *varlen, q);
  } else {
    set_dense_lse_layout(p);
  }
  const KernelEntry& kernel = find_kernel(q, banded);
  // No query, or no key at all (every row sees none): O = 0, lse = +inf, no launch (the Hopper kernel's
  // tensor maps cannot describe an empty tensor).
  if (out.numel() == 0 || p.seqlen_q == 0 || k.size(1) == 0) {
    lse.fill_(INFINITY);
    return {out.zero_(), lse};
  }
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
  if (varlen) clear_batch_strides(p);
  pick_launcher(q, kernel, false)(p, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_impl(const at::Tensor& dout, const at::Tensor& q,
                                                        const at::Tensor& k, const at::Tensor& v,
                                                        const at::Tensor& out, const at::Tensor& lse,
                                                        double softmax_scale, bool causal, int64_t window_left,
                                                        int64_t window_right, double softcap, const Varlen* varlen) {
  check_qkv(q, k, v, softmax_scale, softcap);
  check_tensor(dout, "dout", q);
  check_tensor(out, "out", q);
  check_shape(dout, "dout", q.sizes());
  check_shape(out, "out", q.sizes());
  TORCH_CHECK(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat && lse.is_contiguous(),
              "flash_kernels_cuda: lse must be a contiguous float32 CUDA tensor on q's device");
  if (varlen) {
    check_shape(lse, "lse", {q.size(2), q.size(1)});
  } else {
    check_shape(lse, "lse", {q.size(0), q.size(2), q.size(1)});
  }
  const c10::cuda::CUDAGuard guard(q.device());
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
    return {at::zeros(q.sizes(), q.options()), at::zeros(k.sizes(), k.options()), at::zeros(v.sizes(), v.options())};
  }
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  at::Tensor delta = at::empty(lse.sizes(), lse.options());
  p.out = const_cast<void*>(out.data_ptr());
  p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
  p.lse = const_cast<float*>(lse.data_ptr<float>());
  p.dout = dout.data_ptr();
  p.do_batch_stride = dout.stride(0), p.do_row_stride = dout.stride(1), p.do_head_stride = dout.stride(2);
  p.dq = dq.data_ptr();
  p.dq_batch_stride = dq.stride(0), p.dq_row_stride = dq.stride(1), p.dq_head_stride = dq.stride(2);
  p.dk = dk.data_ptr();
  p.dk_batch_stride = dk.stride(0), p.dk_row_stride = dk.stride(1), p.dk_head_stride = dk.stride(2);
  p.dv = dv.data_ptr();
  p.dv_batch_stride = dv.stride(0), p.dv_row_stride = dv.stride(1), p.dv_head_stride = dv.stride(2);
  p.delta = delta.data_ptr<float>();
  if (varlen) clear_batch_strides(p);
  pick_launcher(q, kernel, true)(p, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  return {dq, dk, dv};
}

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       double softmax_scale, bool causal, int64_t window_left,
                                       int64_t window_right, double softcap) {
  return fwd_impl(q, k, v, softmax_scale, causal, window_left, window_right, softcap, nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                   double softmax_scale, bool causal, int64_t window_left,
                                                   int64_t window_right, double softcap, bool deterministic) {
  // The backward never uses atomics, so it is deterministic whatever `deterministic` asks.
  (void)deterministic;
  return bwd_impl(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, nullptr);
}

at::Tensor as_batch_of_one(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 3, "flash_kernels_cuda: varlen ", name, " must be 3-D (total_tokens, heads, head_dim), got ",
              t.dim(), "-D");
  return t.unsqueeze(0);
}

std::tuple<at::Tensor, at::Tensor> varlen_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                                              bool causal, int64_t window_left, int64_t window_right,
                                              double softcap) {
  const Varlen vl{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  auto [out, lse] = fwd_impl(as_batch_of_one(q, "q"), as_batch_of_one(k, "k"), as_batch_of_one(v, "v"),
                             softmax_scale, causal, window_left, window_right, softcap, &vl);
  return {out.squeeze(0), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
    double softcap, bool deterministic) {
  (void)deterministic;  // no atomics: always deterministic
  const Varlen vl{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  auto [dq, dk, dv] =
      bwd_impl(as_batch_of_one(dout, "dout"), as_batch_of_one(q, "q"), as_batch_of_one(k, "k"),
               as_batch_of_one(v, "v"), as_batch_of_one(out, "out"), lse, softmax_scale, causal, window_left,
               window_right, softcap, &vl);
  return {dq.squeeze(0), dk.squeeze(0), dv.squeeze(0)};
}

}  // namespace
}  // namespace flash_kernels

TORCH_LIBRARY(flash_kernels_cuda, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left, int window_right, "
      "float softcap) -> (Tensor, Tensor)");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float softmax_scale, bool causal, "
      "int window_left, int window_right, float softcap, bool deterministic) -> (Tensor, Tensor, Tensor)");
  m.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, float softmax_scale, bool causal, int window_left, int window_right, float softcap) "
      "-> (Tensor, Tensor)");
  m.def(
      "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, "
      "int window_left, int window_right, float softcap, bool deterministic) -> (Tensor, Tensor, Tensor)");
  // No tensor arguments: registered as a catch-all kernel, callable without a device.
  m.def("compiled_head_dims() -> int[]", &flash_kernels::compiled_head_dims);
  // Whether the module carries the Hopper (sm_90a: wgmma, TMA) kernels.
  m.def("sm90_compiled() -> bool", &flash_kernels::sm90_compiled);
}

TORCH_LIBRARY_IMPL(flash_kernels_cuda, CUDA, m) {
  m.impl("fwd", &flash_kernels::fwd);
  m.impl("bwd", &flash_kernels::bwd);
  m.impl("varlen_fwd", &flash_kernels::varlen_fwd);
  m.impl("varlen_bwd", &flash_kernels::varlen_bwd);
}
