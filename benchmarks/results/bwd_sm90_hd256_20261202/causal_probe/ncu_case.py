"""One forward+backward of flash_kernels' CUDA backend for ncu: python ncu_case.py HEAD_DIM causal|full."""

import os
import sys

import torch

import flash_kernels

os.environ["FLASH_KERNELS_BACKEND"] = "cuda"
hd, causal = int(sys.argv[1]), sys.argv[2] == "causal"
heads, seqlen = 2048 // hd, 4096
q, k, v = (torch.randn(4, seqlen, heads, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
for _ in range(2):
    flash_kernels.flash_attn_func(q, k, v, causal=causal).backward(torch.ones_like(q))
torch.cuda.synchronize()
