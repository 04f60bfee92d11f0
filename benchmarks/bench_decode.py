"""Decode attention on one GPU: the CUDA KV-cache kernel (dense and paged) against the Triton decode path
and torch SDPA (cuDNN, flash), all measured in one run beside the device's copy bandwidth.

Shapes: the decode table of the kernels' goals plus b=1 with 128k keys; one new token per sequence, bf16, every cache
full (cache_seqlens = cache length). Bytes = K + V of the cache read once (what decode must move at the
least); share of copy = bytes / time / copy bandwidth, the copy bandwidth being (read + write bytes) / time
of a 2 GiB device-to-device copy measured at the start of the same run.

Each implementation is timed two ways:
- call: the median of triton.testing.do_bench over back-to-back calls from Python (what a caller sees,
  host path included; the GPU stays busy as long as the host issues faster than the kernels run);
- graph: CUDA-graph replay of 20 calls, per call (the kernels and launch gaps only).
plus host: Python's wall time per call to issue 200 calls without waiting for the GPU.

Implementations: api (flash_attn_with_kvcache as a user calls it, backend auto: host checks and all),
cuda (kvcache_fwd, dense cache), cuda_s<n> (the same with n splits forced, with --splits),
cuda_paged16/64/256 (the same data in shuffled pages of 16/64/256 rows through a block table),
triton (flash_attn_with_kvcache on the Triton backend),
sdpa_cudnn / sdpa_flash on the same unexpanded cache (enable_gqa) where the backend takes it, else on a
copy with the kv heads repeated to the q heads (noted per row); SDPA's backend is selected once around its
measurement, as a model does. Every output is compared with a float32
reference; a difference over 0.02 fails the run (exit 1).

    PYTHONPATH=flash_kernels python3 benchmarks/bench_decode.py [--out-dir DIR] [--quick]

Writes DIR/decode.json, DIR/decode.md (and decode.png with matplotlib), each naming the command.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

import torch
import triton.testing
from bench_attention import copy_bandwidth  # same script folder: one definition of the ceiling
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

import flash_kernels as fk
from flash_kernels import _cuda

# (batch, cache length, q heads, kv heads, head dim)
SHAPES = [
    (1, 32768, 32, 8, 128),
    (8, 8192, 32, 8, 128),
    (32, 4096, 32, 8, 128),
    (16, 16384, 16, 16, 128),
    (64, 2048, 32, 4, 64),
    (1, 131072, 32, 8, 128),
]
PAGE_SIZES = (16, 64, 256)
GRAPH_CALLS = 20


def bench_call_us(fn, rep_ms):
    return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median") * 1e3


def bench_graph_us(fn, reps=20):
    """Per-call time of GRAPH_CALLS calls captured in one CUDA graph (median of `reps` replays)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / GRAPH_CALLS)
    del graph
    return sorted(times)[len(times) // 2]


def host_us(fn, calls=200):
    """Python wall time per call while issuing `calls` calls (no sync inside; the queue absorbs them)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / calls


def to_pages(k_cache, v_cache, page, generator):
    """The same rows in shuffled pages: (k_pages, v_pages, block_table)."""
    b, s, hk, d = k_cache.shape
    blocks = (s + page - 1) // page
    perm = torch.randperm(b * blocks, generator=generator).to(k_cache.device)
    table = perm.view(b, blocks).to(torch.int32)
    pad = blocks * page - s

    def paged(cache):
        c = torch.nn.functional.pad(cache, (0, 0, 0, 0, 0, pad)) if pad else cache
        out = torch.empty(b * blocks, page, hk, d, dtype=cache.dtype, device=cache.device)
        out[perm] = c.reshape(b * blocks, page, hk, d)
        return out

    return paged(k_cache), paged(v_cache), table


def reference(q, k_cache, v_cache):
    group = q.shape[2] // k_cache.shape[2]
    k = k_cache.repeat_interleave(group, 2).transpose(1, 2).float()
    v = v_cache.repeat_interleave(group, 2).transpose(1, 2).float()
    return sdpa(q.transpose(1, 2).float(), k, v).transpose(1, 2)


def measure(name, fn, ref, rep_ms, nbytes, copy_bw, graph=True):
    out = fn()
    out = out[0] if isinstance(out, tuple) else out
    diff = (out.float() - ref).abs().max().item()
    row = {"impl": name, "max_abs_diff": diff, "call_us": bench_call_us(fn, rep_ms)}
    row["graph_us"] = None
    if graph:
        try:
            row["graph_us"] = bench_graph_us(fn)
        except RuntimeError as exc:  # not capturable: report the call timing alone
            row["graph_error"] = str(exc)[:200]
            torch.cuda.synchronize()
    row["host_us"] = host_us(fn)
    best = min(t for t in (row["call_us"], row["graph_us"]) if t is not None)
    row["share_of_copy_call"] = nbytes / (row["call_us"] * 1e-6) / copy_bw
    row["share_of_copy_graph"] = nbytes / (row["graph_us"] * 1e-6) / copy_bw if row["graph_us"] else None
    row["best_us"] = best
    return row


def sdpa_runner(backend, q, k_cache, v_cache):
    """SDPA on the unexpanded cache (enable_gqa) if the backend takes it, else on a head-repeated copy.

    The backend is selected by the caller, once around the measurement (``sdpa_kernel`` costs tens of
    microseconds of host time per entry; a model sets it once, not per call)."""
    qt = q.transpose(1, 2)
    kt, vt = k_cache.transpose(1, 2), v_cache.transpose(1, 2)

    def gqa():
        return sdpa(qt, kt, vt, enable_gqa=True).transpose(1, 2)

    try:
        with sdpa_kernel([backend]):
            gqa()
        return gqa, "unexpanded cache (enable_gqa)"
    except RuntimeError:
        pass
    group = q.shape[2] // k_cache.shape[2]
    ke = k_cache.repeat_interleave(group, 2).transpose(1, 2)
    ve = v_cache.repeat_interleave(group, 2).transpose(1, 2)

    def expanded():
        return sdpa(qt, ke, ve).transpose(1, 2)

    with sdpa_kernel([backend]):
        expanded()  # raises when the backend refuses this shape altogether
    return expanded, f"kv heads repeated x{group} (backend refused enable_gqa)"


def run_shape(shape, args, copy_bw):
    b, s, hq, hk, d = shape
    g = torch.Generator().manual_seed(b * 1000 + s + hq + d)
    q = torch.randn(b, 1, hq, d, generator=g).to("cuda", torch.bfloat16)
    k_cache = torch.randn(b, s, hk, d, generator=g).to("cuda", torch.bfloat16)
    v_cache = torch.randn(b, s, hk, d, generator=g).to("cuda", torch.bfloat16)
    seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    scale = 1.0 / math.sqrt(d)
    nbytes = 2 * k_cache.numel() * k_cache.element_size()
    ref = reference(q, k_cache, v_cache)
    rows = []

    def cuda_dense(splits=0):  # 0: the kernel's own split choice
        return _cuda.kvcache_fwd(q, k_cache, v_cache, seqlens, None, None, None, scale, -1, -1, 0.0, splits)

    rows.append(measure("cuda", cuda_dense, ref, args.rep_ms, nbytes, copy_bw))

    def api():  # what a user calls: flash_attn_with_kvcache, backend auto (the CUDA kernel here)
        return fk.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, softmax_scale=scale)

    rows.append(measure("api", api, ref, args.rep_ms, nbytes, copy_bw))
    for splits in args.splits:
        rows.append(
            measure(f"cuda_s{splits}", functools.partial(cuda_dense, splits), ref, args.rep_ms, nbytes, copy_bw)
        )
    for page in PAGE_SIZES:
        kp, vp, table = to_pages(k_cache, v_cache, page, g)

        def cuda_paged(kp=kp, vp=vp, table=table):
            return _cuda.kvcache_fwd(q, kp, vp, seqlens, table, None, None, scale, -1, -1, 0.0, 0)

        rows.append(measure(f"cuda_paged{page}", cuda_paged, ref, args.rep_ms, nbytes, copy_bw))
        del kp, vp, table

    if args.cuda_only:
        for row in rows:
            row.update(batch=b, cache_len=s, heads_q=hq, heads_kv=hk, head_dim=d, MB=nbytes / 1e6)
        return rows

    def triton_decode():
        return fk.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, softmax_scale=scale)

    os.environ["FLASH_KERNELS_BACKEND"] = "triton"
    try:
        rows.append(measure("triton", triton_decode, ref, args.rep_ms, nbytes, copy_bw))
    except Exception as exc:  # the Triton path belongs to another engineer: report, don't stop
        rows.append({"impl": "triton", "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    finally:
        os.environ.pop("FLASH_KERNELS_BACKEND", None)

    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        try:
            fn, how = sdpa_runner(backend, q, k_cache, v_cache)
            with sdpa_kernel([backend]):
                row = measure(name, fn, ref, args.rep_ms, nbytes, copy_bw)
            row["note"] = how
            rows.append(row)
        except RuntimeError as exc:
            rows.append({"impl": name, "error": str(exc)[:200]})
    for row in rows:
        row.update(batch=b, cache_len=s, heads_q=hq, heads_kv=hk, head_dim=d, MB=nbytes / 1e6)
    return rows


def summarise(rows):
    """Per shape: the CUDA kernel's times and ratios against the others (best of call/graph for each)."""
    out = []
    shapes = sorted(
        {(r["batch"], r["cache_len"], r["heads_q"], r["heads_kv"], r["head_dim"]) for r in rows},
        key=lambda t: SHAPES.index(t) if t in SHAPES else 99,
    )
    for shape in shapes:
        by = {
            r["impl"]: r
            for r in rows
            if (r["batch"], r["cache_len"], r["heads_q"], r["heads_kv"], r["head_dim"]) == shape and "error" not in r
        }
        mine = by.get("cuda")
        if not mine:
            continue
        entry = {
            "shape": shape,
            "MB": mine["MB"],
            "cuda_call_us": mine["call_us"],
            "cuda_graph_us": mine["graph_us"],
            "cuda_share_call": mine["share_of_copy_call"],
            "cuda_share_graph": mine["share_of_copy_graph"],
            "cuda_host_us": mine["host_us"],
        }
        for page in PAGE_SIZES:
            p = by.get(f"cuda_paged{page}")
            if p:
                entry[f"paged{page}_over_dense_call"] = p["call_us"] / mine["call_us"]
                entry[f"paged{page}_over_dense_graph"] = (
                    p["graph_us"] / mine["graph_us"] if p["graph_us"] and mine["graph_us"] else None
                )
        api = by.get("api")
        cudnn = by.get("sdpa_cudnn")
        if api:
            entry["api_call_us"] = api["call_us"]
            entry["api_host_us"] = api["host_us"]
            if cudnn:
                entry["api_vs_cudnn_call"] = cudnn["call_us"] / api["call_us"]
                entry["api_vs_cudnn_graph"] = (
                    cudnn["graph_us"] / api["graph_us"] if cudnn["graph_us"] and api["graph_us"] else None
                )
        forced = {r["impl"]: r for r in by.values() if r["impl"].startswith("cuda_s")}
        if forced:
            best = min(forced.values(), key=lambda r: r["graph_us"] or r["call_us"])
            entry["best_forced_splits"] = best["impl"]
            entry["auto_over_best_forced_graph"] = (
                mine["graph_us"] / best["graph_us"] if mine["graph_us"] and best["graph_us"] else None
            )
        for other in ("sdpa_cudnn", "sdpa_flash", "triton"):
            o = by.get(other)
            if o:
                entry[f"{other}_call_us"] = o["call_us"]
                entry[f"speedup_vs_{other}_call"] = o["call_us"] / mine["call_us"]
                entry[f"speedup_vs_{other}_graph"] = (
                    o["graph_us"] / mine["graph_us"] if o["graph_us"] and mine["graph_us"] else None
                )
        out.append(entry)
    return out


def markdown(result):
    lines = [
        f"# Decode attention, {result['device']}",
        "",
        f"Command: `{result['command']}`",
        "",
        f"torch {result['torch']}; bf16, one new token, caches full; copy bandwidth measured in this run: "
        f"{result['copy_TBps']:.2f} TB/s (read + write). Share = K+V bytes / time / copy bandwidth. "
        "call = do_bench median of back-to-back Python calls; graph = CUDA-graph replay, per call; "
        "host = Python time to issue one call.",
        "",
        "| b | keys | hq | hk | d | MB | impl | call us | graph us | host us | share (call) | share (graph) | "
        "max diff | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(
                f"| {r['batch']} | {r['cache_len']} | {r['heads_q']} | {r['heads_kv']} | {r['head_dim']} | "
                f"{r['MB']:.0f} | {r['impl']} | - | - | - | - | - | - | {r['error']} |"
            )
            continue
        graph = f"{r['graph_us']:.1f}" if r["graph_us"] else "-"
        share_g = f"{r['share_of_copy_graph']:.2f}" if r["share_of_copy_graph"] else "-"
        lines.append(
            f"| {r['batch']} | {r['cache_len']} | {r['heads_q']} | {r['heads_kv']} | {r['head_dim']} | {r['MB']:.0f} | "
            f"{r['impl']} | {r['call_us']:.1f} | {graph} | {r['host_us']:.1f} | {r['share_of_copy_call']:.2f} | "
            f"{share_g} | {r['max_abs_diff']:.1e} | {r.get('note', '')} |"
        )
    lines += [
        "",
        "## flash_attn_with_kvcache as users call it, against SDPA cuDNN (ratio > 1: flash_kernels is faster)",
        "",
        "| shape (b, keys, hq, hk, d) | api call us | cuDNN call us | api vs cuDNN (call) | api vs cuDNN (graph) | "
        "api host us | best forced splits | auto / best (graph) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in result["summary"]:

        def g(key, e=e, fmt="{:.2f}"):
            v = e.get(key)
            return fmt.format(v) if isinstance(v, float) else (v if isinstance(v, str) else "-")

        lines.append(
            f"| {e['shape']} | {g('api_call_us', fmt='{:.1f}')} | {g('sdpa_cudnn_call_us', fmt='{:.1f}')} | "
            f"{g('api_vs_cudnn_call')} | {g('api_vs_cudnn_graph')} | {g('api_host_us', fmt='{:.1f}')} | "
            f"{g('best_forced_splits')} | {g('auto_over_best_forced_graph')} |"
        )
    lines += [
        "",
        "## CUDA kernel against the others (ratio > 1: the CUDA kernel is faster)",
        "",
        "| shape (b, keys, hq, hk, d) | cuda call us | share call | share graph | vs cuDNN (call) | "
        "vs flash (call) | vs triton (call) | paged16/dense | paged64/dense | paged256/dense (call) | "
        "paged16/dense | paged64/dense | paged256/dense (graph) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in result["summary"]:

        def f(key, e=e):
            v = e.get(key)
            return f"{v:.2f}" if isinstance(v, float) else "-"

        lines.append(
            f"| {e['shape']} | {e['cuda_call_us']:.1f} | {f('cuda_share_call')} | {f('cuda_share_graph')} | "
            f"{f('speedup_vs_sdpa_cudnn_call')} | {f('speedup_vs_sdpa_flash_call')} | "
            f"{f('speedup_vs_triton_call')} | {f('paged16_over_dense_call')} | "
            f"{f('paged64_over_dense_call')} | {f('paged256_over_dense_call')} | "
            f"{f('paged16_over_dense_graph')} | {f('paged64_over_dense_graph')} | {f('paged256_over_dense_graph')} |"
        )
    return "\n".join(lines) + "\n"


def plot(result, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    impls = ["api", "cuda", "cuda_paged16", "cuda_paged64", "cuda_paged256", "triton", "sdpa_cudnn", "sdpa_flash"]
    shapes = [tuple(e["shape"]) for e in result["summary"]]
    labels = [f"b{s[0]} k{s[1] // 1024}k\n{s[2]}/{s[3]} d{s[4]}" for s in shapes]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        ys = []
        for s in shapes:
            r = next(
                (
                    r
                    for r in result["rows"]
                    if r["impl"] == impl
                    and "error" not in r
                    and (r["batch"], r["cache_len"], r["heads_q"], r["heads_kv"], r["head_dim"]) == s
                ),
                None,
            )
            ys.append(r["share_of_copy_call"] if r else 0)
        ax.bar([i + j * width for i in range(len(shapes))], ys, width, label=impl)
    ax.axhline(0.9, color="k", linestyle="--", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], labels, fontsize=8)
    ax.set_ylabel("share of copy bandwidth (call)")
    ax.set_title(f"decode, bf16, {result['device']}")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="benchmarks/results/decode")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="first two shapes only")
    ap.add_argument(
        "--shapes",
        help="b,keys,hq,hk,d[;...] instead of the table's shapes (a GPU session's time is short: measure what changed)",
    )
    ap.add_argument("--cuda-only", action="store_true", help="the CUDA kernel alone (dense and paged), no others")
    ap.add_argument(
        "--splits",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[],
        help="also time the dense CUDA kernel with these forced split-KV counts (e.g. 1,2,4,8,16,32): "
        "how far the automatic choice is from the best one",
    )
    args = ap.parse_args(argv)
    if not _cuda.is_built() or not hasattr(torch.ops.flash_kernels_cuda, "kvcache_fwd"):
        print(f"the CUDA KV-cache kernel is not built: {_cuda.import_error()}", file=sys.stderr)
        return 2
    copy_bw = copy_bandwidth(args.rep_ms)
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    shapes = SHAPES[:2] if args.quick else SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in part.split(",")) for part in args.shapes.split(";") if part.strip()]
    for shape in shapes:
        shape_rows = run_shape(shape, args, copy_bw)
        for r in shape_rows:
            if "error" in r:
                print(f"{shape} {r['impl']}: {r['error']}", flush=True)
            else:
                g = f"{r['graph_us']:.1f}" if r["graph_us"] else "-"
                print(
                    f"{shape} {r['impl']:14s} call {r['call_us']:8.1f} us graph {g:>8s} us host "
                    f"{r['host_us']:5.1f} us share(call) {r['share_of_copy_call']:.2f} diff {r['max_abs_diff']:.1e}",
                    flush=True,
                )
        rows += shape_rows
        torch.cuda.empty_cache()
    result = {
        "command": "PYTHONPATH=flash_kernels python3 benchmarks/bench_decode.py " + " ".join(argv or sys.argv[1:]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_TBps": copy_bw / 1e12,
        "rows": rows,
    }
    result["summary"] = summarise(rows)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "decode.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = markdown(result)
    with open(os.path.join(args.out_dir, "decode.md"), "w") as f:
        f.write(md)
    plot(result, os.path.join(args.out_dir, "decode.png"))
    print(md)
    bad = [r for r in rows if "error" not in r and r["max_abs_diff"] > 0.02]
    for r in bad:
        print(f"FAIL: {r['impl']} at {r['batch'], r['cache_len']} differs by {r['max_abs_diff']:.3f}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
