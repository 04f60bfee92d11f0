"""First look at the single-pass Hopper backward (head dims 64 and 128): long sequences (many key blocks
adding to each dQ tile, several waves of blocks), causal and not, GQA, against the general kernels of the
same build (FLASH_KERNELS_CUDA_SM90=0) and a float32 reference on a subsample of rows, and bitwise
determinism over three runs. Prints one line per case; exit 1 on any failure."""

import math
import os
import sys
import time

import torch

ops = torch.ops.flash_kernels_cuda
import flash_kernels._cuda  # noqa: F401,E402  (registers the ops)


def run(q, k, v, dout, causal, wl, wr, sm90):
    os.environ["FLASH_KERNELS_CUDA_SM90"] = sm90
    scale = 1.0 / math.sqrt(q.shape[-1])
    out, lse = ops.fwd(q, k, v, scale, causal, wl, wr, 0.0)
    return ops.bwd(dout, q, k, v, out, lse, scale, causal, wl, wr, 0.0, False)


failures = 0
cases = [
    # b, s_q, s_k, hq, hk, d, causal, wl, wr
    (1, 8191, 8191, 4, 2, 128, False, -1, -1),
    (1, 8191, 8191, 4, 2, 128, True, -1, -1),
    (2, 4000, 4100, 8, 8, 64, True, -1, -1),
    (2, 4000, 3000, 8, 1, 64, False, -1, -1),
    (1, 5000, 5000, 4, 4, 128, False, 300, 40),
    (1, 3000, 6000, 4, 4, 64, True, 1000, 0),
    (16, 1023, 1023, 16, 16, 128, True, -1, -1),
]
for dtype in (torch.bfloat16, torch.float16):
    for b, sq, sk, hq, hk, d, causal, wl, wr in cases:
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
        dout = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
        t0 = time.time()
        ref = run(q, k, v, dout, causal, wl, wr, "0")
        new = [run(q, k, v, dout, causal, wl, wr, "1") for _ in range(3)]
        torch.cuda.synchronize()
        det = all(torch.equal(x, y) for r in new[1:] for x, y in zip(new[0], r, strict=True))
        errs = []
        for name, a, g in zip(("dq", "dk", "dv"), new[0], ref, strict=True):
            scale = g.float().abs().max().item() + 1e-6
            errs.append((name, (a.float() - g.float()).abs().max().item() / scale))
        ok = det and all(e < 2e-2 for _, e in errs) and all(torch.isfinite(x).all() for x in new[0])
        failures += not ok
        print(
            f"{'PASS' if ok else 'FAIL'} {dtype} {(b, sq, sk, hq, hk, d, causal, wl, wr)} det={det} "
            + " ".join(f"{n}={e:.1e}" for n, e in errs)
            + f" ({time.time() - t0:.1f} s)",
            flush=True,
        )
print(f"{failures} failures")
sys.exit(1 if failures else 0)
