"""A handful of small forward+backward calls of the CUDA ops, to run under compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 3 python tools/gpu/cuda_sanitize_cases.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python tools/gpu/cuda_sanitize_cases.py

Shapes are small (the sanitizer slows kernels 10-100x) and cover: head dims 32/64/96/128/160/192/256
(padded and swizzled shared-memory layouts; one-pass and split dK/dV backward), head dims between the
compiled ones (40, 200: columns past d predicated off), both dtypes,
sequence ends inside a tile, causal with rows that see no key, a sliding window, GQA; varlen when built.
On a cc 9.0 GPU with the Hopper kernels compiled, every case runs with them and with the general ones.

KV cache (kvcache_fwd, when built): decode and tall tiles at head dims 64/128/256 (and 80, predicated),
dense and paged (pages of 16, 48, 64, 256 rows), forced and automatic splits (the combine kernel),
leftpad, causal and window, softcap, a cache_batch_idx and block-table ids out of range (the kernels must
not read them: memcheck), lengths past the capacity (clamped); and the paged varlen forward. These do not
depend on FLASH_KERNELS_CUDA_SM90 and run once.
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


KVCACHE_CASES = [
    # (dtype, batch, seqlen_q, heads_q, heads_kv, head_dim, page_size (0 dense), rows per sequence, leftpad,
    #  window_left, window_right, softcap, num_splits)
    (torch.bfloat16, 2, 1, 8, 2, 128, 0, 300, False, -1, -1, 0.0, 3),
    (torch.float16, 2, 6, 8, 2, 128, 0, 200, True, -1, 0, 0.0, 0),
    (torch.bfloat16, 3, 1, 16, 2, 64, 16, 150, False, -1, -1, 0.0, 2),
    (torch.float16, 2, 3, 8, 1, 256, 48, 130, True, 40, 0, 0.0, 2),
    (torch.bfloat16, 2, 1, 4, 4, 80, 64, 200, False, -1, -1, 25.0, 0),
    (torch.float16, 2, 20, 4, 4, 64, 256, 300, False, -1, 0, 0.0, 1),
    (torch.bfloat16, 2, 1, 32, 4, 64, 16, 700, True, -1, -1, 0.0, 0),  # decode page table over several blocks
]


def run_kvcache_cases(ops) -> int:
    if not hasattr(ops, "kvcache_fwd"):
        return 0
    for dtype, b, sq, hq, hk, d, page, rows, leftpad, wl, wr, softcap, splits in KVCACHE_CASES:
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
        # Lengths: one past the capacity (clamped), one inside a tile, one of 0 keys when b > 2.
        seqlens = torch.tensor([rows + 50, rows // 2 + 3, 0][:b], dtype=torch.int32, device="cuda")
        leftpad_t = torch.tensor([7, 1, 0][:b], dtype=torch.int32, device="cuda") if leftpad else None
        table = batch_idx = None
        if page:
            blocks = (rows + page - 1) // page
            num_pages = b * blocks
            k_cache = torch.randn(num_pages, page, hk, d, device="cuda", dtype=dtype, generator=g)
            table = torch.randperm(num_pages, device="cuda", generator=g).to(torch.int32).view(b, blocks)
            table[-1, -1] = num_pages + 1000  # out of range inside a sequence: read as zeros, never dereferenced
        else:
            k_cache = torch.randn(b + 1, rows, hk, d, device="cuda", dtype=dtype, generator=g)
            batch_idx = torch.tensor([b, 0, 99][:b], dtype=torch.int32, device="cuda")  # last id out of range
            batch_idx[-1] = 99
        v_cache = torch.randn_like(k_cache)
        out, _lse = ops.kvcache_fwd(q, k_cache, v_cache, seqlens, table, batch_idx, leftpad_t, 1.0 / math.sqrt(d),
                                   wl, wr, softcap, splits)
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(out).all())
        print(f"ran kvcache {dtype} b={b} sq={sq} hq={hq} hk={hk} d={d} page={page} rows={rows} leftpad={leftpad} "
              f"window=({wl},{wr}) softcap={softcap} splits={splits} finite={finite}", flush=True)
        if not finite:
            return 1
    # Paged varlen forward: one empty sequence, table slots past each sequence out of range.
    for dtype, d, causal, page in ((torch.bfloat16, 128, True, 16), (torch.float16, 256, False, 64)):
        sqs, sks, hq, hk = (37, 0, 100), (50, 12, 70), 4, 2
        blocks = max((n + page - 1) // page for n in sks)
        num_pages = len(sks) * blocks
        k_cache = torch.randn(num_pages, page, hk, d, device="cuda", dtype=dtype)
        v_cache = torch.randn_like(k_cache)
        table = torch.randperm(num_pages, device="cuda").to(torch.int32).view(len(sks), blocks)
        table[1, :] = -5
        cu_q = torch.tensor([0, 37, 37, 137], dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0, 50, 62, 132], dtype=torch.int32, device="cuda")
        q = torch.randn(sum(sqs), hq, d, device="cuda", dtype=dtype)
        out, _lse = ops.varlen_fwd(q, k_cache, v_cache, cu_q, cu_k, max(sqs), max(sks), 1.0 / math.sqrt(d), causal,
                                  -1, -1, 0.0, table)
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(out).all())
        print(f"ran varlen paged {dtype} d={d} causal={causal} page={page} finite={finite}", flush=True)
        if not finite:
            return 1
    return 0


def main() -> int:
    from flash_kernels import _cuda

    if not _cuda.is_built():
        print(f"CUDA extension not built: {_cuda.import_error()}", file=sys.stderr)
        return 2
    if run_kvcache_cases(torch.ops.flash_kernels_cuda):
        return 1
    if os.environ.get("FLASH_KERNELS_SANITIZE_KVCACHE_ONLY") == "1":
        return 0
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
