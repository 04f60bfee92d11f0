"""Time the CUDA path against SDPA (flash and cuDNN backends) and the Triton path, in one process.

FLOPs = 4 * batch * heads * seqlen^2 * head_dim, halved for causal, x3.5 for forward+backward
(the convention of flash-attention's benchmarks). batch * seqlen = 16k tokens, 16 heads of 128 (hidden
2048), bf16, as in the project's SDPA baseline. Each time is the median of triton.testing.do_bench.

    python tools/gpu/cuda_bench.py [--seqlens 4096 8192 16384] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")  # milliseconds


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def bench_row(b, s, heads, d, causal, skip_triton, flash_kernels) -> dict:
    """All timings of one shape, in TFLOP/s, plus the CUDA path's ratios to SDPA."""
    ops = torch.ops.flash_kernels_cuda
    dtype = torch.bfloat16
    q, k, v, dout = (torch.randn(b, s, heads, d, device="cuda", dtype=dtype) for _ in range(4))
    qt, kt, vt, dot = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
    scale = 1.0 / math.sqrt(d)
    flops = 4 * b * heads * s * s * d / (2 if causal else 1)
    row = {"seqlen": s, "batch": b, "heads": heads, "head_dim": d, "causal": causal}

    def cuda_fwd():
        return ops.fwd(q, k, v, scale, causal, -1, -1, 0.0)

    def cuda_fwd_bwd():
        out, lse = cuda_fwd()
        return ops.bwd(dout, q, k, v, out, lse, scale, causal, -1, -1, 0.0, False)

    row["cuda_fwd"] = tflops(flops, bench(cuda_fwd))
    row["cuda_fwd_bwd"] = tflops(3.5 * flops, bench(cuda_fwd_bwd))
    if ops.sm90_compiled():
        # The general (mma.sync) kernels on the same inputs: what the Hopper kernels replaced.
        os.environ["FLASH_KERNELS_CUDA_SM90"] = "0"
        try:
            row["cuda_general_fwd"] = tflops(flops, bench(cuda_fwd))
            row["cuda_general_fwd_bwd"] = tflops(3.5 * flops, bench(cuda_fwd_bwd))
        finally:
            os.environ.pop("FLASH_KERNELS_CUDA_SM90", None)

    qg, kg, vg = (t.detach().requires_grad_(True) for t in (qt, kt, vt))

    def sdpa_fwd():
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    def sdpa_fwd_bwd():
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(dot)

    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel([backend]):
                row[f"{name}_fwd"] = tflops(flops, bench(sdpa_fwd))
                row[f"{name}_fwd_bwd"] = tflops(3.5 * flops, bench(sdpa_fwd_bwd))
        except RuntimeError as exc:  # backend refused this shape
            row[f"{name}_error"] = str(exc)[:200]

    qf, kf, vf = (t.detach().requires_grad_(True) for t in (q, k, v))

    def triton_fwd():
        return flash_kernels.flash_attn_func(q, k, v, causal=causal)

    def triton_fwd_bwd():
        flash_kernels.flash_attn_func(qf, kf, vf, causal=causal).backward(dout)

    if skip_triton:
        row["triton_error"] = "not run (--skip-triton)"
    else:
        os.environ["FLASH_KERNELS_BACKEND"] = "triton"
        try:
            row["triton_fwd"] = tflops(flops, bench(triton_fwd))
            row["triton_fwd_bwd"] = tflops(3.5 * flops, bench(triton_fwd_bwd))
        except Exception as exc:  # a Triton failure is reported in its row; the CUDA timings still matter
            row["triton_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            os.environ.pop("FLASH_KERNELS_BACKEND", None)

    for base in ("sdpa_flash", "sdpa_cudnn"):
        for kind in ("fwd", "fwd_bwd"):
            if f"{base}_{kind}" in row:
                row[f"cuda_{kind}_vs_{base}"] = row[f"cuda_{kind}"] / row[f"{base}_{kind}"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--json")
    ap.add_argument("--skip-triton", action="store_true", help="time only the CUDA path and SDPA")
    args = ap.parse_args(argv)

    import flash_kernels
    from flash_kernels import _cuda

    if not _cuda.is_built():
        print(f"CUDA extension not built: {_cuda.import_error()}", file=sys.stderr)
        return 2
    d, heads, tokens = args.head_dim, 2048 // args.head_dim, 16384
    rows = []
    for causal in (False, True):
        for s in args.seqlens:
            row = bench_row(max(1, tokens // s), s, heads, d, causal, args.skip_triton, flash_kernels)
            rows.append(row)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
