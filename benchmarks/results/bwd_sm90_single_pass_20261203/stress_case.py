"""The case where racecheck stalled (bf16, b=1, s_q 70, s_k 75, 2:1 GQA, head dim 40, causal), run natively
N times (argv[1]) with the result checked against the first run each time, then random small shapes for
argv[2] seconds (head dims up to 128, so the single-pass backward; masks, GQA, s_q != s_k, batch)."""

import math
import random
import sys
import time

import torch

from flash_kernels import _cuda  # noqa: F401  (registers the ops)

ops = torch.ops.flash_kernels_cuda


def bwd(b, sq, sk, hq, hk, d, causal, wl, wr, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
    dout = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
    scale = 1.0 / math.sqrt(d)
    out, lse = ops.fwd(q, k, v, scale, causal, wl, wr, 0.0)
    return ops.bwd(dout, q, k, v, out, lse, scale, causal, wl, wr, 0.0, False)


t0 = time.time()
first = bwd(1, 70, 75, 2, 1, 40, True, -1, -1, torch.bfloat16, 0)
for i in range(int(sys.argv[1])):
    again = bwd(1, 70, 75, 2, 1, 40, True, -1, -1, torch.bfloat16, 0)
    if i % 100 == 0:
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True)), f"run {i} differs"
torch.cuda.synchronize()
print(f"case: {sys.argv[1]} runs, bitwise equal, {time.time() - t0:.1f} s", flush=True)
rng, n, t1 = random.Random(0), 0, time.time()
while time.time() - t1 < float(sys.argv[2]):
    hk = rng.choice((1, 2, 4))
    causal = rng.random() < 0.5
    wl, wr = rng.choice(((-1, -1), (-1, -1), (rng.randint(0, 300), rng.randint(0, 50))))
    shape = (rng.randint(1, 3), rng.randint(1, 700), rng.randint(1, 900), hk * rng.choice((1, 2, 4)), hk)
    bwd(*shape, rng.choice((8, 40, 64, 96, 128)), causal, wl, wr, rng.choice((torch.float16, torch.bfloat16)), n)
    n += 1
torch.cuda.synchronize()
print(f"random: {n} shapes in {time.time() - t1:.1f} s, no hang", flush=True)
