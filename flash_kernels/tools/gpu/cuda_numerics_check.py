"""Numerics of the CUDA ops (torch.ops.flash_kernels_cuda) against a float32 reference, on a GPU.

Criterion (flash-attention's): for out, lse, dq, dk, dv,
    max|cuda - ref32| <= 2 * max|lowp - ref32| + ATOL_SLACK
where lowp is the same attention computed by PyTorch in the input dtype (fp16/bf16 matmuls and
softmax) and ref32 in float32 from the same inputs. Outputs are poisoned first: the allocator's blocks
of the output sizes are NaN-filled and freed, so an element the kernel forgets to write shows as NaN.
The backward is run twice and must be bit-identical (it has no atomics). On a cc 9.0 GPU with the Hopper
kernels compiled, every case runs with them and again with the general ones (FLASH_KERNELS_CUDA_SM90=0).

Head dims: every compiled one, plus multiples of 8 between them (8, 40, 80, 136, 200, 248), which run on
the next larger compiled kernel with the columns past d predicated off. For those, q, k, v and dout are
column slices of NaN-filled buffers 8 columns wider, so a kernel that read past d would produce NaN.

    python tools/gpu/cuda_numerics_check.py [--quick] [--kvcache-only] [--json PATH]

Varlen (when the extension has varlen_fwd): packed sequences of different lengths (some empty, some
shorter than the keys, so causal rows see no key) against the same references run per sequence; and the
paged forward (block_table) on the same sequences scattered over shuffled pages of 16/48/64/256 rows.

KV cache (when the extension has kvcache_fwd; forward only): dense and paged caches (pages of 16, 48, 64,
256 rows, shuffled block tables), GQA ratios 1/4/8, seqlen_q 1 and > 1 (decode and tall tiles, causal
and windows bottom-right aligned), cache_leftpad, cache_batch_idx, softcap, forced and automatic split
counts, lengths that are not multiples of the tiles (0, 1, the capacity), against the same references run
per sequence on the keys the call must see. Then a CUDA graph: capture kvcache_fwd on static tensors,
change q, the cache and cache_seqlens in place, replay, and compare with an eager call (bit-identical)
and the reference. The KV-cache kernel and the paged forward do not depend on FLASH_KERNELS_CUDA_SM90,
so they run once.

Exit code: 0 all cases pass, 1 any case fails, 2 the extension is not built / no GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import torch

ATOL_SLACK = 1e-5  # absorbs float32-reference rounding where the low-precision error is ~0


def reference(q, k, v, scale, causal, wl, wr, dtype, softcap=0.0):
    """Attention computed in `dtype` by PyTorch ops; rows that see no key give out 0, lse +inf."""
    qf, kf, vf = (t.to(dtype) for t in (q, k, v))
    _b, sq, hq, _d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = hq // hk
    kf = kf.repeat_interleave(g, dim=2)
    vf = vf.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    rel = j - i - (sk - sq)
    if causal:
        wr = 0
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if wl >= 0:
        visible &= rel >= -wl
    if wr >= 0:
        visible &= rel <= wr
    # Rows with no visible key: a finite dummy row, zeroed after softmax, so no NaN reaches autograd.
    row_any = visible.any(dim=-1, keepdim=True)
    s = s.masked_fill(~visible, float("-inf")).masked_fill(~row_any, 0.0)
    lse = torch.logsumexp(s.float(), dim=-1).masked_fill(~row_any.squeeze(-1), float("inf"))  # (b, h, sq)
    p = torch.softmax(s, dim=-1) * row_any
    out = torch.einsum("bhqk,bkhd->bqhd", p, vf)
    return out, lse


def poison(shapes_dtypes, device):
    """NaN-fill allocator blocks of these sizes and free them, so the next allocations reuse them."""
    blocks = [torch.full(s, float("nan"), dtype=dt, device=device) for s, dt in shapes_dtypes]
    del blocks


def max_err(a, b, finite_mask=None):
    a = a.float()
    b = b.float()
    if finite_mask is not None:
        a = a[finite_mask]
        b = b[finite_mask]
    if a.numel() == 0:
        return 0.0
    return (a - b).abs().max().item()


def compare_outputs(names, mine, ref, lowp):
    """flash-attention's criterion for each named output: (all passed, {name: details}). ref and lowp hold
    the float32 and low-precision references in the same order; "lse" rows that see no key are +inf in ref
    and must be exactly +inf in mine, the finite ones are compared numerically."""
    finite = torch.isfinite(ref[names.index("lse")])
    ok, results = True, {}
    for idx, name in enumerate(names):
        m = mine[idx]
        nan = bool(torch.isnan(m).any())
        if name == "lse":
            err, base = max_err(m, ref[idx], finite), max_err(lowp[idx], ref[idx], finite)
            passed = torch.equal(torch.isinf(m), ~finite) and not nan and err <= 2 * base + ATOL_SLACK
        else:
            err, base = max_err(m, ref[idx]), max_err(lowp[idx], ref[idx])
            passed = not nan and err <= 2 * base + ATOL_SLACK
        results[name] = {"err": err, "lowp_err": base, "nan": nan, "pass": passed}
        ok = ok and passed
    return ok, results


def _input(shape, dtype, device, guard):
    """randn of `shape`; with guard, a view of the first d columns of a buffer whose 8 extra are NaN."""
    if not guard:
        return torch.randn(shape, device=device, dtype=dtype)
    d = shape[-1]
    buf = torch.full((*shape[:-1], d + 8), float("nan"), device=device, dtype=dtype)
    buf[..., :d] = torch.randn(shape, device=device, dtype=dtype)
    return buf[..., :d]


def run_case(case, dtype, device, guard=False):
    b, sq, sk, hq, hk, d, causal, wl, wr = case
    torch.manual_seed(hash(case) % (2**31))
    q = _input((b, sq, hq, d), dtype, device, guard)
    k = _input((b, sk, hk, d), dtype, device, guard)
    v = _input((b, sk, hk, d), dtype, device, guard)
    dout = _input((b, sq, hq, d), dtype, device, guard)
    scale = 1.0 / math.sqrt(d)
    ops = torch.ops.flash_kernels_cuda

    poison([((b, sq, hq, d), dtype), ((b, hq, sq), torch.float32)], device)
    out, lse = ops.fwd(q, k, v, scale, causal, wl, wr, 0.0)
    poison([((b, sq, hq, d), dtype), ((b, sk, hk, d), dtype), ((b, sk, hk, d), dtype), ((b, hq, sq), torch.float32)],
           device)
    dq, dk, dv = ops.bwd(dout, q, k, v, out, lse, scale, causal, wl, wr, 0.0, False)
    dq2, dk2, dv2 = ops.bwd(dout, q, k, v, out, lse, scale, causal, wl, wr, 0.0, True)
    deterministic = all(torch.equal(x, y) for x, y in ((dq, dq2), (dk, dk2), (dv, dv2)))

    grads = {}
    for name, dt in (("ref", torch.float32), ("lowp", dtype)):
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        o, lse_ref = reference(qq, kk, vv, scale, causal, wl, wr, dt)
        o.backward(dout.to(dt))
        grads[name] = (o.detach(), lse_ref.detach(), qq.grad, kk.grad, vv.grad)
    ref, lowp = grads["ref"], grads["lowp"]
    ok, results = compare_outputs(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv), ref, lowp)
    ok = ok and deterministic
    return ok, deterministic, results


PREDICATED_HEAD_DIMS = (8, 40, 80, 136, 200, 248)


def cases(quick: bool, head_dims):
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window_left, window_right)
    # Sequence lengths avoid multiples of the 64/128 tiles; sq > sk causal has rows that see no key.
    shapes = [
        (2, 113, 203, 4, 2, False, -1, -1),
        (1, 257, 257, 8, 1, True, -1, -1),
        (2, 200, 77, 4, 4, False, -1, -1),
        (1, 77, 300, 6, 3, True, -1, -1),
        (1, 300, 100, 2, 2, True, -1, -1),
        (2, 333, 333, 4, 2, False, 64, 0),
        (1, 190, 513, 4, 4, False, 40, 17),
        (1, 1, 129, 2, 1, True, -1, -1),
        (3, 65, 65, 2, 2, False, -1, -1),
    ]
    if quick:
        shapes = shapes[:3]
    for hd in head_dims:
        for b, sq, sk, hq, hk, causal, wl, wr in shapes:
            yield (b, sq, sk, hq, hk, hd, causal, wl, wr)
    # Between the compiled dims: GQA, sequence ends inside tiles, causal rows that see no key, a window.
    for hd in PREDICATED_HEAD_DIMS:
        if hd <= max(head_dims) and hd not in head_dims:
            for i in ((0, 1, 3, 4, 6) if not quick else (0, 1)):
                b, sq, sk, hq, hk, causal, wl, wr = shapes[i] if i < len(shapes) else shapes[-1]
                yield (b, sq, sk, hq, hk, hd, causal, wl, wr)


VARLEN_CASES = [
    # (seqlens_q, seqlens_k, heads_q, heads_kv, head_dim, causal, window_left, window_right)
    ((37, 0, 130, 64, 1), (50, 12, 130, 200, 1), 4, 2, 64, False, -1, -1),
    ((37, 70, 130, 64, 1), (50, 12, 130, 200, 3), 4, 2, 128, True, -1, -1),
    ((100, 65, 3), (100, 65, 90), 2, 1, 96, False, 30, 5),
    ((77, 140), (90, 140), 2, 2, 256, True, -1, -1),
    ((33, 129), (129, 33), 4, 4, 40, True, -1, -1),
]


def _cat(parts, dim):
    return torch.cat(parts, dim=dim)


def run_varlen_case(case, dtype, device):
    """Packed varlen call against per-sequence references; same criterion as run_case."""
    sqs, sks, hq, hk, d, causal, wl, wr = case
    torch.manual_seed(sum(sqs) * 131 + sum(sks) + d)
    tq, tk = sum(sqs), sum(sks)
    q = torch.randn(tq, hq, d, device=device, dtype=dtype)
    k = torch.randn(tk, hk, d, device=device, dtype=dtype)
    v = torch.randn(tk, hk, d, device=device, dtype=dtype)
    dout = torch.randn(tq, hq, d, device=device, dtype=dtype)
    cu_q = torch.tensor([0, *itertools.accumulate(sqs)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *itertools.accumulate(sks)], dtype=torch.int32, device=device)
    scale = 1.0 / math.sqrt(d)
    ops = torch.ops.flash_kernels_cuda
    poison([((tq, hq, d), dtype), ((hq, tq), torch.float32)], device)
    out, lse = ops.varlen_fwd(q, k, v, cu_q, cu_k, max(sqs), max(sks), scale, causal, wl, wr, 0.0)
    poison([((tq, hq, d), dtype), ((tk, hk, d), dtype), ((tk, hk, d), dtype), ((hq, tq), torch.float32)], device)
    dq, dk, dv = ops.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max(sqs), max(sks), scale, causal, wl, wr,
                                0.0, False)
    mine = (out, lse, dq, dk, dv)
    refs = {}
    for name, dt in (("ref", torch.float32), ("lowp", dtype)):
        parts = ([], [], [], [], [])
        oq = ok = 0
        for sq, sk in zip(sqs, sks, strict=True):
            qq = q[oq:oq + sq].unsqueeze(0).detach().clone().requires_grad_(True)
            kk = k[ok:ok + sk].unsqueeze(0).detach().clone().requires_grad_(True)
            vv = v[ok:ok + sk].unsqueeze(0).detach().clone().requires_grad_(True)
            o, lse_seq = reference(qq, kk, vv, scale, causal, wl, wr, dt)
            o.backward(dout[oq:oq + sq].unsqueeze(0).to(dt))
            for i, t in enumerate((o.detach(), lse_seq.detach(), qq.grad, kk.grad, vv.grad)):
                t = torch.zeros_like(qq if i in (0, 2) else kk) if t is None else t
                parts[i].append(t[0])
            oq, ok = oq + sq, ok + sk
        refs[name] = tuple(_cat(p, -1 if i == 1 else 0) for i, p in enumerate(parts))
    ref, lowp = refs["ref"], refs["lowp"]
    return compare_outputs(("out", "lse", "dq", "dk", "dv"), mine, ref, lowp)


def _paged_copy(rows_per_seq, page_size, device, extra_pages=3, generator=None):
    """Pages for sequences of the given row counts, in shuffled order: (block_table, num_pages, max_blocks).
    Table slots past a sequence's rows hold ids in [-3, num_pages + 5), some out of range: the kernels must
    never dereference a slot past the sequence's length (compute-sanitizer runs these too)."""
    max_blocks = max(1, max((r + page_size - 1) // page_size for r in rows_per_seq))
    used = sum((r + page_size - 1) // page_size for r in rows_per_seq)
    num_pages = used + extra_pages
    perm = torch.randperm(num_pages, generator=generator).tolist()
    table = torch.randint(-3, num_pages + 5, (len(rows_per_seq), max_blocks), dtype=torch.int32, generator=generator)
    nxt = 0
    for b, r in enumerate(rows_per_seq):
        for j in range((r + page_size - 1) // page_size):
            table[b, j] = perm[nxt]
            nxt += 1
    return table.to(device), num_pages, max_blocks


def _scatter_to_pages(rows, table_row, page_size, cache):
    """Write rows (n, h, d) into cache pages (num_pages, page_size, h, d) at positions 0..n-1 of table_row."""
    for j in range(0, rows.shape[0], page_size):
        page = int(table_row[j // page_size])
        chunk = rows[j:j + page_size]
        cache[page, :chunk.shape[0]] = chunk


# (batch, seqlen_q, heads_q, heads_kv, head_dim, page_size (0 = dense), capacity (dense) or max rows per
#  sequence (paged), leftpad, cache_batch (0 = no cache_batch_idx), window_left, window_right, softcap,
#  num_splits (0 = auto))
KVCACHE_CASES = [
    (3, 1, 8, 8, 128, 0, 1000, False, 0, -1, -1, 0.0, 0),      # MHA decode, auto splits
    (2, 1, 32, 8, 128, 0, 3000, False, 0, -1, -1, 0.0, 0),     # GQA 4
    (2, 1, 32, 8, 128, 0, 3000, False, 0, -1, -1, 0.0, 7),     # forced splits
    (2, 1, 16, 2, 64, 0, 515, False, 0, -1, -1, 0.0, 0),       # GQA 8, 16 packed rows
    (2, 3, 8, 2, 64, 0, 700, False, 0, -1, 0, 0.0, 0),         # sq > 1 in the decode tile, causal
    (2, 5, 16, 2, 128, 0, 700, False, 0, -1, 0, 0.0, 3),       # 40 rows: tall tile, causal, split
    (3, 2, 4, 1, 128, 0, 400, True, 0, 50, 0, 0.0, 0),         # leftpad + sliding window
    (2, 1, 4, 2, 256, 0, 333, False, 5, -1, -1, 0.0, 0),       # cache_batch_idx (one id out of range)
    (2, 1, 8, 2, 128, 0, 900, False, 0, -1, -1, 30.0, 0),      # softcap
    (2, 33, 4, 4, 256, 0, 300, False, 0, -1, -1, 0.0, 0),      # tall, MHA, non-causal
    (2, 70, 2, 2, 64, 0, 200, False, 0, 16, 4, 0.0, 2),        # tall, window, some rows see no key
    (2, 1, 8, 2, 80, 0, 450, False, 0, -1, -1, 0.0, 0),        # head dim between compiled ones (-> 128)
    (2, 2, 8, 4, 200, 0, 260, True, 0, -1, 0, 0.0, 0),         # (-> 256), leftpad, causal
    (2, 1, 4, 4, 32, 0, 130, False, 0, -1, -1, 0.0, 0),        # (-> 64)
    (3, 1, 32, 4, 128, 16, 640, False, 0, -1, -1, 0.0, 0),     # paged 16, GQA 8
    (2, 4, 8, 2, 128, 64, 600, False, 0, -1, 0, 0.0, 0),       # paged 64, sq 4 causal
    (2, 1, 4, 4, 64, 256, 1200, False, 0, -1, -1, 0.0, 0),     # paged 256, MHA
    (2, 1, 8, 1, 128, 48, 500, False, 0, -1, -1, 0.0, 5),      # page size not a power of two, MQA
    (2, 9, 16, 4, 256, 16, 300, True, 0, -1, 0, 0.0, 0),       # paged 16 + leftpad, tall, causal
    (2, 1, 8, 2, 128, 64, 700, False, 0, 100, 0, 20.0, 3),     # paged + softcap + window + splits
    (1, 1, 32, 8, 128, 16, 8192, False, 0, -1, -1, 0.0, 0),    # long paged decode, many splits
    (3, 1, 32, 4, 64, 16, 2100, True, 0, -1, -1, 0.0, 0),      # hdim 64 decode, 8 pages per key block, leftpad
    (2, 1, 16, 2, 64, 48, 1500, False, 0, -1, -1, 0.0, 5),     # hdim 64, page not a power of two, splits
]


def _kvcache_inputs(case, dtype, device, guard):
    b, sq, hq, hk, d, page, cap, leftpad, cache_batch, _wl, _wr, _softcap, _splits = case
    g = torch.Generator().manual_seed(hash(case) % (2**31))
    # Lengths not multiples of the tiles, and the edges: 0 keys, 1 key, the whole capacity.
    seqlens = torch.randint(1, cap + 1, (b,), generator=g)
    if b >= 2:
        seqlens[0] = cap
    if b >= 3:
        seqlens[1] = 0 if sq == 1 else 1
    lp = torch.randint(0, 60, (b,), generator=g).minimum(seqlens) if leftpad else None
    q = _input((b, sq, hq, d), dtype, device, guard)
    if page:
        table, num_pages, max_blocks = _paged_copy([cap] * b, page, device, generator=g)
        k_cache = _input((num_pages, page, hk, d), dtype, device, guard)
        v_cache = _input((num_pages, page, hk, d), dtype, device, guard)
        capacity = max_blocks * page
        batch_idx = None
    else:
        table = None
        rows = max(cache_batch, b)
        k_cache = _input((rows, cap, hk, d), dtype, device, guard)
        v_cache = _input((rows, cap, hk, d), dtype, device, guard)
        capacity = cap
        batch_idx = None
        if cache_batch:
            idx = torch.randperm(cache_batch, generator=g)[:b]
            idx[-1] = cache_batch + 2  # out of range: that sequence sees no key (documented)
            batch_idx = idx.to(torch.int32).to(device)
    return (q, k_cache, v_cache, seqlens.to(torch.int32).to(device), table,
            batch_idx, None if lp is None else lp.to(torch.int32).to(device), capacity)


def kvcache_reference(q, k_cache, v_cache, seqlens, table, batch_idx, leftpad, capacity, scale, wl, wr, softcap,
                      dtype):
    """Per sequence: gather the visible keys [leftpad, seqlen) and run reference() on them."""
    outs, lses = [], []
    b = q.shape[0]
    for i in range(b):
        end = min(int(seqlens[i]), capacity)
        beg = int(leftpad[i]) if leftpad is not None else 0
        if table is not None:
            page = k_cache.shape[1]
            n_pages = (end + page - 1) // page
            ids = table[i, :n_pages].long()
            kk = k_cache[ids].flatten(0, 1)[beg:end]
            vv = v_cache[ids].flatten(0, 1)[beg:end]
        else:
            row = int(batch_idx[i]) if batch_idx is not None else i
            if row >= k_cache.shape[0]:
                beg = end = 0
                row = 0
            kk, vv = k_cache[row, beg:end], v_cache[row, beg:end]
        with torch.no_grad():
            o, lse = reference(q[i:i + 1], kk[None], vv[None], scale, False, wl, wr, dtype, softcap)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def run_kvcache_case(case, dtype, device, guard=False):
    b, sq, hq, _hk, d, _page, _cap, _leftpad, _cache_batch, wl, wr, softcap, splits = case
    q, k_cache, v_cache, seqlens, table, batch_idx, lp, capacity = _kvcache_inputs(case, dtype, device, guard)
    scale = 1.0 / math.sqrt(d)
    poison([((b, sq, hq, d), dtype), ((b, hq, sq), torch.float32)], device)
    out, lse = torch.ops.flash_kernels_cuda.kvcache_fwd(q, k_cache, v_cache, seqlens, table, batch_idx, lp, scale,
                                                        wl, wr, softcap, splits)
    refs = {name: kvcache_reference(q, k_cache, v_cache, seqlens, table, batch_idx, lp, capacity, scale, wl, wr,
                                    softcap, dt)
            for name, dt in (("ref", torch.float32), ("lowp", dtype))}
    return compare_outputs(("out", "lse"), (out, lse), refs["ref"], refs["lowp"])


def run_kvcache_graph_case(dtype, device, paged):
    """Capture kvcache_fwd, change every input in place, replay; compare with eager and the reference."""
    case = (4, 1, 32, 8, 128, 16 if paged else 0, 2000, False, 0, -1, -1, 0.0, 0)
    q, k_cache, v_cache, seqlens, table, _batch_idx, _lp, capacity = _kvcache_inputs(case, dtype, device, False)
    scale = 1.0 / math.sqrt(128)
    ops = torch.ops.flash_kernels_cuda
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.kvcache_fwd(q, k_cache, v_cache, seqlens, table, None, None, scale, -1, -1, 0.0, 0)  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = ops.kvcache_fwd(q, k_cache, v_cache, seqlens, table, None, None, scale, -1, -1, 0.0, 0)
    results = {}
    ok = True
    for step in range(3):
        q.copy_(torch.randn_like(q))
        k_cache.copy_(torch.randn_like(k_cache))
        v_cache.copy_(torch.randn_like(v_cache))
        seqlens.copy_(torch.randint(1, capacity + 1, seqlens.shape, device=device, dtype=torch.int32))
        g_out.fill_(float("nan"))
        graph.replay()
        out, lse = ops.kvcache_fwd(q, k_cache, v_cache, seqlens, table, None, None, scale, -1, -1, 0.0, 0)
        same = torch.equal(out, g_out) and torch.equal(lse, g_lse)
        refs = {name: kvcache_reference(q, k_cache, v_cache, seqlens, table, None, None, capacity, scale, -1, -1,
                                        0.0, dt)
                for name, dt in (("ref", torch.float32), ("lowp", dtype))}
        step_ok, step_res = compare_outputs(("out", "lse"), (g_out, g_lse), refs["ref"], refs["lowp"])
        step_ok = step_ok and same
        results[f"replay{step}"] = {"equal_to_eager": same, **step_res}
        ok = ok and step_ok
    return ok, results


VARLEN_PAGED_CASES = [
    # (seqlens_q, seqlens_k, heads_q, heads_kv, head_dim, causal, window_left, window_right, page_size)
    ((37, 0, 130, 64, 1), (50, 12, 130, 200, 1), 4, 2, 64, False, -1, -1, 16),
    ((37, 70, 130, 64, 1), (50, 12, 130, 200, 3), 4, 2, 128, True, -1, -1, 64),
    ((100, 65, 3), (100, 65, 90), 2, 1, 96, False, 30, 5, 48),
    ((77, 140), (90, 300), 2, 2, 256, True, -1, -1, 256),
    ((33, 129), (129, 33), 8, 1, 40, True, -1, -1, 16),
]


def run_varlen_paged_case(case, dtype, device):
    """varlen_fwd with block_table against per-sequence references on the same keys, unpaged."""
    sqs, sks, hq, hk, d, causal, wl, wr, page = case
    g = torch.Generator().manual_seed(sum(sqs) * 131 + sum(sks) + d + page)
    tq = sum(sqs)
    q = torch.randn(tq, hq, d, generator=g).to(device=device, dtype=dtype)
    ks = [torch.randn(n, hk, d, generator=g).to(device=device, dtype=dtype) for n in sks]
    vs = [torch.randn(n, hk, d, generator=g).to(device=device, dtype=dtype) for n in sks]
    table, num_pages, _max_blocks = _paged_copy(list(sks), page, device, generator=g)
    k_cache = torch.randn(num_pages, page, hk, d, generator=g).to(device=device, dtype=dtype)
    v_cache = torch.randn(num_pages, page, hk, d, generator=g).to(device=device, dtype=dtype)
    for b in range(len(sks)):
        _scatter_to_pages(ks[b], table[b].cpu(), page, k_cache)
        _scatter_to_pages(vs[b], table[b].cpu(), page, v_cache)
    cu_q = torch.tensor([0, *itertools.accumulate(sqs)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *itertools.accumulate(sks)], dtype=torch.int32, device=device)
    scale = 1.0 / math.sqrt(d)
    poison([((tq, hq, d), dtype), ((hq, tq), torch.float32)], device)
    out, lse = torch.ops.flash_kernels_cuda.varlen_fwd(q, k_cache, v_cache, cu_q, cu_k, max(sqs), max(sks), scale,
                                                       causal, wl, wr, 0.0, table)
    refs = {}
    for name, dt in (("ref", torch.float32), ("lowp", dtype)):
        o_parts, l_parts, oq = [], [], 0
        for b, (sq, _sk) in enumerate(zip(sqs, sks, strict=True)):
            with torch.no_grad():
                o, l_ = reference(q[oq:oq + sq][None], ks[b][None], vs[b][None], scale, causal, wl, wr, dt)
            o_parts.append(o[0])
            l_parts.append(l_[0])
            oq += sq
        refs[name] = (torch.cat(o_parts), torch.cat(l_parts, dim=-1))
    return compare_outputs(("out", "lse"), (out, lse), refs["ref"], refs["lowp"])


def check_kvcache(args, _cuda, device, rows) -> int:
    """The KV-cache kernel, its CUDA-graph replay, and the paged varlen forward (once: no kernel sets)."""
    failures = 0
    ops = torch.ops.flash_kernels_cuda
    if not hasattr(ops, "kvcache_fwd"):
        print("kvcache: not in this build (no flash_kernels_cuda.kvcache_fwd)")
        return 0
    cases = KVCACHE_CASES if not args.quick else [c for i, c in enumerate(KVCACHE_CASES) if i % 3 == 0]
    for dtype in (torch.float16, torch.bfloat16):
        for case in cases:
            guard = case[4] not in _cuda.kvcache_head_dims()
            ok, res = run_kvcache_case(case, dtype, device, guard)
            failures += not ok
            rows.append({"kvcache_case": case, "dtype": str(dtype), "pass": ok, "results": res})
            print(f"{'PASS' if ok else 'FAIL'} {dtype!s:14s} kvcache b,sq,hq,hk,d,page,cap,leftpad,cache_batch,"
                  f"wl,wr,softcap,splits={case} out_err={res['out']['err']:.2e} lowp={res['out']['lowp_err']:.2e}"
                  + ("" if ok else f" {json.dumps(res)}"), flush=True)
        for paged in (False, True):
            ok, res = run_kvcache_graph_case(dtype, device, paged)
            failures += not ok
            rows.append({"kvcache_graph": {"paged": paged}, "dtype": str(dtype), "pass": ok, "results": res})
            print(f"{'PASS' if ok else 'FAIL'} {dtype!s:14s} kvcache CUDA graph capture+replay paged={paged}"
                  + ("" if ok else f" {json.dumps(res)}"), flush=True)
        for case in VARLEN_PAGED_CASES:
            ok, res = run_varlen_paged_case(case, dtype, device)
            failures += not ok
            rows.append({"varlen_paged_case": case, "dtype": str(dtype), "pass": ok, "results": res})
            print(f"{'PASS' if ok else 'FAIL'} {dtype!s:14s} varlen paged sq,sk,hq,hk,d,causal,wl,wr,page={case}"
                  + ("" if ok else f" {json.dumps(res)}"), flush=True)
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 shapes per head dim instead of all")
    ap.add_argument("--json", help="write per-case results here")
    ap.add_argument("--kvcache-only", action="store_true", help="only the KV-cache and paged cases")
    args = ap.parse_args(argv)
    try:
        from flash_kernels import _cuda
    except ImportError as exc:
        print(f"cannot import flash_kernels._cuda: {exc}", file=sys.stderr)
        return 2
    if not _cuda.is_built() or not torch.cuda.is_available():
        print(f"CUDA extension not usable: built={_cuda.is_built()} ({_cuda.import_error()}), "
              f"cuda={torch.cuda.is_available()}", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    rows, failures, t0 = [], 0, time.time()
    failures += check_kvcache(args, _cuda, device, rows)
    if args.kvcache_only:
        print(f"{len(rows) - failures}/{len(rows)} cases passed in {time.time() - t0:.1f} s")
        return 0 if failures == 0 else 1
    for sm90 in _cuda.kernel_sets():
        os.environ["FLASH_KERNELS_CUDA_SM90"] = sm90
        print(f"FLASH_KERNELS_CUDA_SM90={sm90}", flush=True)
        failures += check_all(args, _cuda, device, rows, sm90)
    print(f"{len(rows) - failures}/{len(rows)} cases passed in {time.time() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if failures == 0 else 1


def check_all(args, _cuda, device, rows, sm90) -> int:
    failures = 0
    for dtype in (torch.float16, torch.bfloat16):
        for case in cases(args.quick, _cuda.compiled_head_dims()):
            guard = case[5] not in _cuda.compiled_head_dims()
            ok, det, res = run_case(case, dtype, device, guard)
            failures += not ok
            rows.append({"case": case, "dtype": str(dtype), "sm90": sm90, "pass": ok, "deterministic": det,
                         "results": res})
            worst = max(res.items(), key=lambda kv: kv[1]["err"] / (2 * kv[1]["lowp_err"] + 1e-5))
            print(f"{'PASS' if ok else 'FAIL'} {dtype!s:14s} b,sq,sk,hq,hk,d,causal,wl,wr={case} "
                  f"det={det} worst={worst[0]} err={worst[1]['err']:.2e} lowp={worst[1]['lowp_err']:.2e}"
                  + ("" if ok else f" {json.dumps(res)}"), flush=True)
    if hasattr(torch.ops.flash_kernels_cuda, "varlen_fwd"):
        for dtype in (torch.float16, torch.bfloat16):
            for case in VARLEN_CASES:
                if _cuda.kernel_head_dim(case[4]) is None:
                    continue
                ok, res = run_varlen_case(case, dtype, device)
                failures += not ok
                rows.append({"varlen_case": case, "dtype": str(dtype), "sm90": sm90, "pass": ok, "results": res})
                print(f"{'PASS' if ok else 'FAIL'} {dtype!s:14s} varlen sq,sk,hq,hk,d,causal,wl,wr={case}"
                      + ("" if ok else f" {json.dumps(res)}"), flush=True)
    else:
        print("varlen: not in this build (no flash_kernels_cuda.varlen_fwd)")
    return failures


if __name__ == "__main__":
    sys.exit(main())
