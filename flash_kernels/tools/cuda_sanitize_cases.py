"""A handful of small forward+backward calls of the CUDA ops, to run under compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 3 python tools/cuda_sanitize_cases.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python tools/cuda_sanitize_cases.py

Shapes are small (the sanitizer slows kernels 10-100x) and cover: head dims 32/64/96/128/160/192/256
(padded and swizzled shared-memory layouts; one-pass and split dK/dV backward), head dims between the
compiled ones (40, 200: columns past d predicated off), both dtypes,
sequence ends inside a tile, causal with rows that see no key, a sliding window, GQA; varlen when built.
On a cc 9.0 GPU with the Hopper kernels compiled, every case runs with them and with the general ones.
"""

from __future__ import annotations

import math
import os
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
    (torch.bfloat16, 1, 77, 140, 2, 1, 160, True, -1, -1),
    (torch.float16, 1, 130, 70, 2, 2, 192, False, 30, 10),
    (torch.bfloat16, 1, 100, 100, 4, 2, 256, True, -1, -1),
    (torch.float16, 1, 90, 150, 2, 1, 256, False, -1, -1),
    (torch.bfloat16, 1, 70, 75, 2, 1, 40, True, -1, -1),
    (torch.float16, 1, 65, 99, 2, 2, 200, False, -1, -1),
]


def main() -> int:
    from flash_kernels import _cuda

    if not _cuda.is_built():
        print(f"CUDA extension not built: {_cuda.import_error()}", file=sys.stderr)
        return 2
    for sm90 in _cuda.kernel_sets():
        os.environ["FLASH_KERNELS_CUDA_SM90"] = sm90
        print(f"FLASH_KERNELS_CUDA_SM90={sm90}", flush=True)
        if run_cases(torch.ops.flash_kernels_cuda):
            return 1
    return 0


def run_cases(ops) -> int:
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
    if hasattr(ops, "varlen_fwd"):
        # Packed sequences, one empty and one shorter than its keys; grids cover the longest.
        for dtype, d, causal in ((torch.bfloat16, 128, True), (torch.float16, 256, False), (torch.float16, 40, True)):
            sqs, sks, hq, hk = (37, 0, 100, 5), (50, 12, 70, 1), 4, 2
            cu_q = torch.tensor([0, 37, 37, 137, 142], dtype=torch.int32, device="cuda")
            cu_k = torch.tensor([0, 50, 62, 132, 133], dtype=torch.int32, device="cuda")
            q = torch.randn(sum(sqs), hq, d, device="cuda", dtype=dtype)
            k = torch.randn(sum(sks), hk, d, device="cuda", dtype=dtype)
            v = torch.randn(sum(sks), hk, d, device="cuda", dtype=dtype)
            dout = torch.randn_like(q)
            scale = 1.0 / math.sqrt(d)
            out, lse = ops.varlen_fwd(q, k, v, cu_q, cu_k, max(sqs), max(sks), scale, causal, -1, -1, 0.0)
            dq, dk, dv = ops.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max(sqs), max(sks), scale, causal,
                                        -1, -1, 0.0, False)
            torch.cuda.synchronize()
            finite = all(bool(torch.isfinite(t).all()) for t in (out, dq, dk, dv))
            print(f"ran varlen {dtype} seqlens_q={sqs} seqlens_k={sks} d={d} causal={causal} finite={finite}",
                  flush=True)
            if not finite:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
