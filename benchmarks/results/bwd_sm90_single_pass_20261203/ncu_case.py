"""One forward+backward of flash_kernels' CUDA backend (bf16, batch 4, 4096 tokens, 16 heads of 128), for ncu."""

import os
import sys

import torch

import flash_kernels

os.environ["FLASH_KERNELS_BACKEND"] = "cuda"
causal = len(sys.argv) > 1 and sys.argv[1] == "causal"
q, k, v = (torch.randn(4, 4096, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
for _ in range(2):
    flash_kernels.flash_attn_func(q, k, v, causal=causal).backward(torch.ones_like(q))
torch.cuda.synchronize()
