# Warm-up then one profiled call each of dense, paged 256, 64, 16 at the d64 decode shape (ncu: --launch-skip 4).
import sys
import torch
sys.path.insert(0, "new/benchmarks")
from bench_decode import to_pages
from flash_kernels import _cuda
b, s, hq, hk, d = 64, 2048, 32, 4, 64
g = torch.Generator().manual_seed(7)
q = torch.randn(b, 1, hq, d, generator=g).to("cuda", torch.bfloat16)
k = torch.randn(b, s, hk, d, generator=g).to("cuda", torch.bfloat16)
v = torch.randn(b, s, hk, d, generator=g).to("cuda", torch.bfloat16)
seq = torch.full((b,), s, dtype=torch.int32, device="cuda")
calls = [(k, v, None)] + [to_pages(k, v, p, g) for p in (256, 64, 16)]
for _ in range(2):
    for kc, vc, t in calls:
        _cuda.kvcache_fwd(q, kc, vc, seq, t, None, None, d ** -0.5, -1, -1, 0.0, 0)
torch.cuda.synchronize()
print("ok")
