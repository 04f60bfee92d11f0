"""Compile the Triton kernels for sm_90 on a machine without a GPU, to catch what the CPU
interpreter accepts and the compiler rejects (e.g. a jit function whose constexpr branches return
different types), and to read the PTX: 16-byte cp.async, wgmma, shared memory per variant.

Pointers and strides are declared 16-divisible, as Triton specialises them at launch for the
usual contiguous layouts, so the PTX matches what a real launch compiles; the argument types and
hints are flash_kernels.aot's (flash_kernels/aot/signature.py), inputs bf16.

    python tools/triton_compile_check.py [--ptx-dir DIR]     (exit 1 if any variant fails)
"""

from __future__ import annotations

import argparse
import os
import sys

import triton
from triton.backends.compiler import GPUTarget

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from flash_kernels import triton_backward, triton_forward, triton_kvcache
from flash_kernels.aot.signature import ast_source

TARGET = GPUTarget("cuda", 90, 64)
COMMON = dict(HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False, ALIBI=False, DROPOUT=False, HEAD_DIM=128,
              HEAD_DIM_PAD=128, DOT_PRECISION="tf32")
DECODE = dict(COMMON, GROUP=4, PACK_GQA=True, NUM_SPLITS=4, IS_VARLEN=False, HAS_SEQLENS_K=True,
              HAS_BATCH_IDX=False, HAS_LEFTPAD=False, PAGE_SIZE=0, BLOCK_M=16, BLOCK_N=64)
DENSE = dict(DECODE, PACK_GQA=False, NUM_SPLITS=1, HAS_SEQLENS_K=False, BLOCK_M=128, BLOCK_N=64)
BACKWARD = dict(COMMON, GROUP=2, IS_VARLEN=False, BLOCK_M=64, BLOCK_N=64)
APPEND = dict(HAS_BATCH_IDX=False, PAGE_SIZE=16, ROTARY=True, ROTARY_DIM=64, INTERLEAVED=False, HEAD_DIM=128,
              HEAD_DIM_PAD=128, BLOCK_H=8)

# (label, kernel, constexprs, num_warps, num_stages)
VARIANTS = [
    *[(f"decode page={page}", triton_forward._attn_fwd, dict(DECODE, PAGE_SIZE=page), 4, 2)
      for page in (0, 16, 64, 256)],
    ("decode page=64 leftpad softcap alibi", triton_forward._attn_fwd,
     dict(DECODE, PAGE_SIZE=64, HAS_LEFTPAD=True, SOFTCAP=True, ALIBI=True), 4, 2),
    ("decode d=256 page=48", triton_forward._attn_fwd,
     dict(DECODE, PAGE_SIZE=48, HEAD_DIM=256, HEAD_DIM_PAD=256, BLOCK_N=32), 4, 2),
    ("paged varlen", triton_forward._attn_fwd,
     dict(DENSE, PAGE_SIZE=16, IS_VARLEN=True), 8, 3),
    ("dense", triton_forward._attn_fwd, DENSE, 8, 3),
    ("dense dropout", triton_forward._attn_fwd, dict(DENSE, DROPOUT=True), 8, 3),
    ("dense d=256 dropout", triton_forward._attn_fwd,
     dict(DENSE, DROPOUT=True, HEAD_DIM=256, HEAD_DIM_PAD=256, BLOCK_M=64), 8, 2),
    ("S_dmask", triton_forward._attn_probs,
     {k: v for k, v in dict(BACKWARD, IS_VARLEN=True).items() if k != "DROPOUT"}, 4, 2),
    ("dK/dV", triton_backward._bwd_dkdv, BACKWARD, 8, 2),
    ("dK/dV dropout", triton_backward._bwd_dkdv, dict(BACKWARD, DROPOUT=True), 8, 2),
    ("dQ dropout", triton_backward._bwd_dq, dict(BACKWARD, DROPOUT=True), 8, 2),
    ("dK/dV d=256 dropout", triton_backward._bwd_dkdv,
     dict(BACKWARD, DROPOUT=True, HEAD_DIM=256, HEAD_DIM_PAD=256, BLOCK_N=32), 8, 1),
    *[(f"append page={page} interleaved={inter}", triton_kvcache._append_kv,
       dict(APPEND, PAGE_SIZE=page, HAS_BATCH_IDX=page == 0, INTERLEAVED=inter), 4, 1)
      for page in (0, 16) for inter in (False, True)],
    ("rotary q d=80", triton_kvcache._rotary_q,
     dict(PER_ROW=True, HEAD_DIM=80, HEAD_DIM_PAD=128, ROTARY_DIM=80, INTERLEAVED=False, BLOCK_H=32), 4, 1),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ptx-dir", default=None)
    args = parser.parse_args()
    failed = 0
    for label, fn, constexprs, warps, stages in VARIANTS:
        try:
            kernel = triton.compile(ast_source(fn, constexprs, "bfloat16"), target=TARGET,
                                    options={"num_warps": warps, "num_stages": stages})
        except Exception as e:  # report every variant, then fail
            failed += 1
            cause = e
            while cause.__cause__ is not None:
                cause = cause.__cause__
            print(f"FAIL {label}: {type(cause).__name__}: {str(cause)[-600:]}", flush=True)
            continue
        ptx = kernel.asm["ptx"]
        if args.ptx_dir:
            os.makedirs(args.ptx_dir, exist_ok=True)
            with open(os.path.join(args.ptx_dir, label.replace(" ", "_").replace("/", "") + ".ptx"), "w") as f:
                f.write(ptx)
        print(f"ok   {label:40} shared {kernel.metadata.shared:7d} B  cp.async.16B "
              f"{ptx.count('cp.async.cg.shared.global'):4d}  wgmma {ptx.count('wgmma.mma_async'):4d}  "
              f"mma.sync {ptx.count('mma.sync'):4d}", flush=True)
    print(f"TRITON_COMPILE_CHECK sm_90 variants={len(VARIANTS)} failed={failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
