"""Threads on their own CUDA streams calling the kernels at once get, bitwise, what serial calls get.

Every entry point (dense, GQA with a window, varlen, paged varlen, KV cache dense and paged with an
append, packed; forward and backward) runs in 8 threads, each on its own stream, each in its own
order, twice, with every process-wide cache cold and contended: the call memo holds 3 plans (so it
starts over while threads use it) and the Triton tuner (triton_tiles._choose) has a fresh table and
a threshold low enough that the dense case is tuned while the threads run. Then the same calls run
serially on the default stream. The kernels are deterministic (no atomics; the CUDA backward adds
dQ in a fixed order), so any difference is a race: in a cache, in the launch path, or in stream use.
Dropout is left out: its mask depends on the order seeds are drawn from torch's generator.
"""

from __future__ import annotations

import threading

import torch

import flash_kernels as fk
from flash_kernels import call_memo, triton_tiles

from .params import GPU

THREADS = 8
ROUNDS = 2


def _new(shape, dtype, device, grad=False):
    return torch.randn(shape, device=device, dtype=torch.float32).to(dtype).requires_grad_(grad)


def _grads(out, inputs, dout):
    return (out, *torch.autograd.grad(out, inputs, dout))


def _dense_cases(device, dtype):
    q, k, v = (_new((2, 1024, 4, 64), dtype, device, True) for _ in range(3))
    dout = _new((2, 1024, 4, 64), dtype, device)
    gq = _new((2, 300, 8, 128), dtype, device, True)
    gk, gv = (_new((2, 555, 2, 128), dtype, device, True) for _ in range(2))
    gdout = _new((2, 300, 8, 128), dtype, device)
    qkv = _new((1, 257, 3, 4, 64), dtype, device, True)
    pdout = _new((1, 257, 4, 64), dtype, device)
    return {
        "dense_tuned": lambda: _grads(fk.flash_attn_func(q, k, v, causal=True), (q, k, v), dout),
        "gqa_window": lambda: _grads(fk.flash_attn_func(gq, gk, gv, window_size=(100, 7)), (gq, gk, gv), gdout),
        "packed": lambda: _grads(fk.flash_attn_qkvpacked_func(qkv, causal=True), (qkv,), pdout),
    }


def _varlen_cases(device, dtype):
    lengths = torch.tensor([100, 7, 333, 64])
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device=device, dtype=torch.int32)
    total, top = int(lengths.sum()), int(lengths.max())
    q, k, v = (_new((total, 4, 64), dtype, device, True) for _ in range(3))
    dout = _new((total, 4, 64), dtype, device)
    pool_k, pool_v = (_new((24, 64, 2, 64), dtype, device) for _ in range(2))  # 6 pages of 64 keys per sequence
    table = torch.randperm(24, device=device).to(torch.int32).view(4, 6)
    pq = _new((4, 4, 64), dtype, device)
    one = torch.arange(5, device=device, dtype=torch.int32)
    return {
        "varlen": lambda: _grads(fk.flash_attn_varlen_func(q, k, v, cu, cu, top, top, causal=True), (q, k, v), dout),
        "paged_varlen": lambda: (fk.flash_attn_varlen_func(pq, pool_k, pool_v, one, cu, 1, top, block_table=table),),
    }


def _kvcache_case(device, dtype, paged: bool):
    """A KV-cache call with an append, on a cache of its own (each thread gets a copy): the append
    writes the same keys at the same places every call, so every call returns the same."""
    b, cap, hk = 3, 512, 2
    shape = (b * cap // 128, 128, hk, 64) if paged else (b, cap, hk, 64)
    k_base, v_base = _new(shape, dtype, device), _new(shape, dtype, device)
    table = torch.randperm(b * cap // 128, device=device).to(torch.int32).view(b, cap // 128) if paged else None
    q = _new((b, 2, 8, 64), dtype, device)
    k_new, v_new = _new((b, 2, hk, 64), dtype, device), _new((b, 2, hk, 64), dtype, device)
    seqlens = torch.tensor([500, 1, 250], device=device, dtype=torch.int32)

    def make():
        k_cache, v_cache = k_base.clone(), v_base.clone()
        return lambda: (
            *fk.flash_attn_with_kvcache(
                q,
                k_cache,
                v_cache,
                k_new,
                v_new,
                cache_seqlens=seqlens,
                block_table=table,
                causal=True,
                return_softmax_lse=True,
            ),
            k_cache,
            v_cache,
        )

    return make


def _run_all(cases: dict, order: list) -> dict:
    out = {}
    for _ in range(ROUNDS):
        for name in order:
            out.setdefault(name, []).append(tuple(t.detach() for t in cases[name]()))
    return out


@GPU
def test_threads_and_streams_match_serial(backend, device, monkeypatch):
    dtype = torch.float16
    monkeypatch.setattr(call_memo, "LIMIT", 3)
    monkeypatch.setattr(call_memo, "_plans", {})
    monkeypatch.setattr(triton_tiles, "_TUNED", {})
    monkeypatch.setattr(triton_tiles, "_TUNE_MIN_WORK", 1 << 22)  # the 2 x 4 x 1024^2 dense case is tuned
    torch.manual_seed(0)
    shared = {**_dense_cases(device, dtype), **_varlen_cases(device, dtype)}
    kv_makers = {
        "kvcache": _kvcache_case(device, dtype, paged=False),
        "kvcache_paged": _kvcache_case(device, dtype, paged=True),
    }
    names = sorted([*shared, *kv_makers])
    per_thread = [{**shared, **{n: make() for n, make in kv_makers.items()}} for _ in range(THREADS)]
    streams = [torch.cuda.Stream(device) for _ in range(THREADS)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream(device))  # the inputs were made on the default stream
    results, errors = [None] * THREADS, []
    start = threading.Barrier(THREADS)

    def worker(i):
        try:
            order = names[i % len(names) :] + names[: i % len(names)]
            start.wait()
            with torch.cuda.stream(streams[i]):
                results[i] = _run_all(per_thread[i], order)
        except BaseException as exc:  # reported below with the thread's index
            errors.append((i, exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize(device)
    assert not errors, f"threads failed: {errors}"
    serial = _run_all({**shared, **{n: make() for n, make in kv_makers.items()}}, names)
    torch.cuda.synchronize(device)
    for name in names:
        want = serial[name][0]
        assert all(torch.equal(a, b) for a, b in zip(serial[name][-1], want)), f"{name}: serial calls differ"
        for i in range(THREADS):
            for got in results[i][name]:
                same = all(torch.equal(a, b) for a, b in zip(got, want))
                assert same, f"{name}: thread {i} on its own stream differs from the serial call ({backend})"
