"""Compare builds of the CUDA ops (e.g. tile-shape variants): forward and backward TFLOP/s per wheel.

Each wheel is installed to its own --target folder and timed in its own interpreter (the op namespace
flash_kernels_cuda can be loaded once per process). bf16, batch 2 x seqlen 8192, 2048 hidden
(16 heads of 128, 32 of 64), causal and not; FLOPs as in cuda_bench.py (backward counted as 2.5x).

    python flash_kernels/tools/gpu/cuda_variant_bench.py NAME=path/to/wheel.whl [NAME=...]
"""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import json, math, sys, torch
sys.path.insert(0, sys.argv[1])
from flash_kernels import _cuda
from triton.testing import do_bench
ops = torch.ops.flash_kernels_cuda
res = {"variant": sys.argv[2]}
for d, heads in ((128, 16), (64, 32)):
    for causal in (False, True):
        s, b = 8192, 2
        q, k, v, do = (torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        sc = 1 / math.sqrt(d)
        flops = 4 * b * heads * s * s * d / (2 if causal else 1)
        t = do_bench(lambda: ops.fwd(q, k, v, sc, causal, -1, -1, 0.0), warmup=25, rep=100, return_mode="median")
        o, l = ops.fwd(q, k, v, sc, causal, -1, -1, 0.0)
        tb = do_bench(lambda: ops.bwd(do, q, k, v, o, l, sc, causal, -1, -1, 0.0, False), warmup=25, rep=100,
                      return_mode="median")
        res[f"d{d}_causal{int(causal)}_fwd"] = round(flops / t / 1e9, 1)
        res[f"d{d}_causal{int(causal)}_bwd"] = round(2.5 * flops / tb / 1e9, 1)
print(json.dumps(res), flush=True)
"""


def main(argv: list[str]) -> int:
    rc = 0
    for item in argv:
        name, _, wheel = item.partition("=")
        target = f"/tmp/fk_variant_{name}"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--upgrade",
                        "--target", target, wheel], check=True)
        rc |= subprocess.run([sys.executable, "-c", CHILD, target, name]).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
