"""Paged against dense KV-cache decode in one process: flash_attn_with_kvcache, one query token,
no append, bf16, page ids a random permutation (the scattered pages a real allocator gives).

Decode is bandwidth-bound: bytes = K + V read once = 2 * batch * cache_len * heads_k * d * 2 B.
Each time is the median of triton.testing.do_bench over a CUDA-graph replay of 20 calls (the
host path of one call costs more than its kernels: many small launches are timed as a graph), divided
by 20; "eager" is the median of plain back-to-back calls, host overhead included.

    python tools/gpu/paged_decode_bench.py [--pages 16 32 64 128 256] [--json PATH]
"""

from __future__ import annotations

import argparse
import json

import torch

SHAPES = [  # (batch, cache_len, heads_q, heads_k, head_dim)
    (32, 8192, 32, 8, 128),
    (8, 32768, 32, 8, 128),
    (64, 4096, 16, 16, 128),
    (128, 2048, 32, 4, 64),
]
REPLAYS = 20


def graph_ms(fn) -> float:
    from triton.testing import do_bench

    fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPLAYS):
            fn()
    return do_bench(graph.replay, warmup=25, rep=200, return_mode="median") / REPLAYS


def eager_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def row(fk, batch, cache_len, heads_q, heads_k, d, page) -> dict:
    dtype, dev = torch.bfloat16, "cuda"
    q = torch.randn(batch, 1, heads_q, d, device=dev, dtype=dtype)
    k = torch.randn(batch, cache_len, heads_k, d, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    lengths = torch.full((batch,), cache_len, dtype=torch.int32, device=dev)
    pages_per_seq = cache_len // page
    perm = torch.randperm(batch * pages_per_seq, device=dev)
    table = perm.view(batch, pages_per_seq).to(torch.int32)
    # Page p of sequence b holds keys [p*page, (p+1)*page) of dense row b, scattered by the table.
    k_pool = torch.empty(batch * pages_per_seq, page, heads_k, d, device=dev, dtype=dtype)
    v_pool = torch.empty_like(k_pool)
    k_pool[table.long().flatten()] = k.view(batch * pages_per_seq, page, heads_k, d)
    v_pool[table.long().flatten()] = v.view(batch * pages_per_seq, page, heads_k, d)

    def dense():
        return fk.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths, causal=True)

    def paged():
        return fk.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=lengths, block_table=table,
                                          causal=True)

    err = (dense().float() - paged().float()).abs().max().item()
    gbytes = 2 * k.numel() * k.element_size() / 1e9
    out = {"batch": batch, "cache_len": cache_len, "heads_q": heads_q, "heads_k": heads_k, "head_dim": d,
           "page": page, "max_abs_diff": err, "gbytes": gbytes}
    for name, fn in (("dense", dense), ("paged", paged)):
        out[f"{name}_graph_ms"] = graph_ms(fn)
        out[f"{name}_eager_ms"] = eager_ms(fn)
    out["paged_over_dense"] = out["paged_graph_ms"] / out["dense_graph_ms"]
    out["dense_tbps"] = gbytes / out["dense_graph_ms"]  # GB / ms = TB/s
    out["paged_tbps"] = gbytes / out["paged_graph_ms"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, nargs="+", default=[16, 64, 128, 256])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import flash_kernels as fk

    torch.manual_seed(0)
    rows = []
    print(f"{'shape (b, L, hq, hk, d)':28} {'page':>5} {'dense ms':>9} {'paged ms':>9} {'ratio':>6} "
          f"{'dense TB/s':>10} {'paged TB/s':>10} {'eager d/p ms':>14} {'diff':>8}", flush=True)
    for shape in SHAPES:
        for page in args.pages:
            r = row(fk, *shape, page)
            rows.append(r)
            print(f"{shape!s:28} {page:5d} {r['dense_graph_ms']:9.4f} {r['paged_graph_ms']:9.4f} "
                  f"{r['paged_over_dense']:6.3f} {r['dense_tbps']:10.2f} {r['paged_tbps']:10.2f} "
                  f"{r['dense_eager_ms']:6.3f}/{r['paged_eager_ms']:6.3f} {r['max_abs_diff']:8.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f,
                      indent=1)
    worst = max(r["paged_over_dense"] for r in rows if r["page"] >= 64)
    print(f"PAGED_DECODE worst paged/dense at page >= 64: {worst:.3f} (target <= 1.10)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
