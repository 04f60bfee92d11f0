# Quick diagnosis of the sm90 forward: compare against the sm80 kernel and a float32 reference.
import math, os, sys
import torch
ops = torch.ops.flash_kernels_cuda
from flash_kernels import _cuda
assert _cuda.is_built(), _cuda.import_error()
print("sm90 compiled:", ops.sm90_forward_compiled())
torch.manual_seed(0)

def run(q, k, v, causal, sm90):
    os.environ["FLASH_KERNELS_CUDA_SM90"] = "1" if sm90 else "0"
    out, lse = ops.fwd(q, k, v, 1 / math.sqrt(q.shape[-1]), causal, -1, -1, 0.0)
    torch.cuda.synchronize()
    return out.float(), lse

def ref(q, k, v, causal):
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal).transpose(1, 2)

for d in (128, 64, 192, 256, 96, 160, 224):
  for name, mk in (("q=0 (PV only)", lambda s, d: (torch.zeros(1, s, 1, d), torch.randn(1, s, 1, d), torch.randn(1, s, 1, d))),
                   ("random", lambda s, d: (torch.randn(1, s, 1, d), torch.randn(1, s, 1, d), torch.randn(1, s, 1, d))),
                   ("v=onehot rows", lambda s, d: (torch.randn(1, s, 1, d) * 3, torch.randn(1, s, 1, d), torch.eye(s, d).reshape(1, s, 1, d)))):
    for s in (200, 1000):
        q, k, v = (t.to("cuda", torch.bfloat16) for t in mk(s, d))
        r = ref(q, k, v, False)
        os.environ["FLASH_KERNELS_SM90_OVERLAP"] = "1"
        o90o, _ = run(q, k, v, False, True)
        os.environ["FLASH_KERNELS_SM90_OVERLAP"] = "0"
        o90, _ = run(q, k, v, False, True)
        o80, _ = run(q, k, v, False, False)
        print(f"   overlap err {(o90o - r).abs().max().item():.4g}")
        e90 = (o90 - r).abs()
        e80 = (o80 - r).abs()
        print(f"d={d} s={s} {name}: err sm90 {e90.max().item():.4g} sm80 {e80.max().item():.4g}")
        if e90.max() > 4 * e80.max() + 1e-3:
            t = e90[0, :, 0, :]
            rows = (t.amax(1) > 4 * e80.max() + 1e-3).nonzero().flatten().tolist()
            cols = (t.amax(0) > 4 * e80.max() + 1e-3).nonzero().flatten().tolist()
            print("  bad rows", rows[:40], len(rows), " bad cols", cols[:40], len(cols))

# Timing A/B (bf16, 16k tokens, 2048 hidden): sm90 3-stage / 2-stage, sm80, SDPA flash.
from triton.testing import do_bench
from torch.nn.attention import SDPBackend, sdpa_kernel
for d in (128, 64, 192, 256, 96, 160):
    heads = max(1, 2048 // d)
    for causal in (False, True):
        for s in (4096, 8192, 16384):
            b = 16384 // s
            q, k, v = (torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * b * heads * s * s * d / (2 if causal else 1)
            res = {}
            for name, env in (("sm90", {"FLASH_KERNELS_CUDA_SM90": "1", "FLASH_KERNELS_SM90_OVERLAP": "0"}),
                              ("sm90o", {"FLASH_KERNELS_CUDA_SM90": "1", "FLASH_KERNELS_SM90_OVERLAP": "1"}),
                              ("sm80", {"FLASH_KERNELS_CUDA_SM90": "0"})):
                os.environ.update(env)
                res[name] = do_bench(lambda: ops.fwd(q, k, v, 1 / math.sqrt(d), causal, -1, -1, 0.0), warmup=25, rep=100, return_mode="median")
            qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel([be]):
                        res[name] = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), warmup=25, rep=100, return_mode="median")
                except RuntimeError:
                    res[name] = float("inf")
            tf = {k2: flops / (v2 * 1e-3) / 1e12 for k2, v2 in res.items()}
            print(f"d={d} s={s} {'causal' if causal else 'full'}: " + " ".join(f"{k2} {v2:.0f}" for k2, v2 in tf.items()) + f" | sm90/flash {tf['sm90']/tf['flash']:.3f} sm90o/flash {tf['sm90o']/tf['flash']:.3f} sm90o/cudnn {tf['sm90o']/tf['cudnn']:.3f}", flush=True)
