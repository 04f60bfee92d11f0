"""The sanitizer cases that run the single-pass Hopper backward (head dims up to 128), for repeated
compute-sanitizer racecheck runs: the dense cases of flash_kernels/tools/cuda_sanitize_cases.py at those
head dims (the head-dim-40 one is where call 1's racecheck stopped) and a varlen call."""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "flash_kernels", "tools"))
import cuda_sanitize_cases as sc

from flash_kernels import _cuda  # noqa: F401  (registers the ops)

os.environ["FLASH_KERNELS_CUDA_SM90"] = "1"
ops = torch.ops.flash_kernels_cuda
for dtype, b, sq, sk, hq, hk, d, causal, wl, wr in [c for c in sc.CASES if c[6] <= 128]:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g) for s, h in ((sq, hq), (sk, hk), (sk, hk))
    )
    dout = torch.randn_like(q)
    scale = 1.0 / math.sqrt(d)
    out, lse = ops.fwd(q, k, v, scale, causal, wl, wr, 0.0)
    grads = ops.bwd(dout, q, k, v, out, lse, scale, causal, wl, wr, 0.0, False)
    torch.cuda.synchronize()
    print(
        f"ran {dtype} b={b} sq={sq} sk={sk} hq={hq} hk={hk} d={d} causal={causal} window=({wl},{wr}) "
        f"finite={all(bool(torch.isfinite(t).all()) for t in grads)}",
        flush=True,
    )
lens_q, lens_k = (37, 0, 100, 5), (50, 12, 70, 1)
cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
q = torch.randn(sum(lens_q), 4, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(sum(lens_k), 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
out, lse = ops.varlen_fwd(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), 128**-0.5, True, -1, 0, 0.0, None)
grads = ops.varlen_bwd(
    torch.randn_like(q), q, k, v, out, lse, cu_q, cu_k, max(lens_q), max(lens_k), 128**-0.5, True, -1, 0, 0.0, False
)
torch.cuda.synchronize()
print(f"ran varlen d=128 causal finite={all(bool(torch.isfinite(t).all()) for t in grads)}")
