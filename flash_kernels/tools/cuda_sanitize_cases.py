"""A handful of small forward+backward calls of the CUDA ops, to run under compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 3 python tools/cuda_sanitize_cases.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python tools/cuda_sanitize_cases.py

Shapes are small (the sanitizer slows kernels 10-100x) and cover: head dims 32/64/96/128 (padded and
swizzled shared-memory layouts), both dtypes,
sequence ends inside a tile, causal with rows that see no key, a sliding window, GQA.
"""

from __future__ import annotations

import math
import sys

import torch

CASES = [
    # (dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window_left, window_right)
    (torch.float16, 1, 70, 133, 2, 1, 64, False, -1, -1),
    (torch.bfloat16, 1, 150, 90, 2, 2, 128, True, -1, -1),
    (torch.bfloat16, 2, 129, 129, 4, 2, 128, False, 32, 8),
    (torch.float16, 1, 200, 200, 2, 2, 128, True, -1, -1),
    (torch.bfloat16, 1, 100, 170, 4, 2, 96, True, -1, -1),
    (torch.float16, 2, 90, 61, 2, 1, 32, False, 20, 5),
]


def main() -> int:
    from flash_kernels import _cuda

    if not _cuda.is_built():
        print(f"CUDA extension not built: {_cuda.import_error()}", file=sys.stderr)
        return 2
    ops = torch.ops.flash_kernels_cuda
    for dtype, b, sq, sk, hq, hk, d, causal, wl, wr in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
        dout = torch.randn_like(q)
        scale = 1.0 / math.sqrt(d)
        out, lse = ops.fwd(q, k, v, scale, causal, wl, wr, 0.0)
        dq, dk, dv = ops.bwd(dout, q, k, v, out, lse, scale, causal, wl, wr, 0.0, False)
        torch.cuda.synchronize()
        finite = all(bool(torch.isfinite(t).all()) for t in (out, dq, dk, dv))
        print(f"ran {dtype} b={b} sq={sq} sk={sk} hq={hq} hk={hk} d={d} causal={causal} window=({wl},{wr}) "
              f"finite={finite}", flush=True)
        if not finite:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
