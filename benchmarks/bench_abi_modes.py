"""Two flash_kernels wheels on one GPU in the same run: the stable-ABI wheel against the version-bound one.

The kernels are the same objects in both modes; what differs is the host layer (csrc/torch_api.h): op
registration through torch's stable C shim, one shim call per size/stride query, outputs allocated through
the boxed dispatcher. So the cases are the ones where host work shows: small eager calls and decode, plus a
large forward+backward as a control that must not move.

Each wheel is unpacked into its own folder (`pip install --no-deps --target DIR WHEEL`) and measured in a
child process that imports flash_kernels from there; rounds alternate A B A B so drift hits both. Device
time: the median of triton.testing.do_bench; host time: wall time per call while issuing 300 calls.
Prints, per case, each wheel's median over rounds and the ratio stable/version, and writes
<out-dir>/abi_modes_<stamp>.json and .md with the command. Exit: 0 done, 1 a child failed, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

CASES = {
    # name: (kind, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal)
    "fwd_small_eager": ("fwd", 1, 128, 128, 8, 8, 64, False),
    "fwd_bwd_small_eager": ("fwd_bwd", 1, 128, 128, 8, 8, 64, True),
    "decode_b1_32k": ("decode", 1, 1, 32768, 32, 8, 128, False),
    "decode_b64_2k_d64": ("decode", 64, 1, 2048, 32, 4, 64, False),
    "fwd_hd128_4k_causal": ("fwd", 4, 4096, 4096, 16, 16, 128, True),
    "fwd_bwd_hd128_4k_causal": ("fwd_bwd", 4, 4096, 4096, 16, 16, 128, True),
}


def make_case(fk, torch, kind, b, sq, sk, hq, hk, d, causal):
    g = torch.Generator().manual_seed(b + sq + sk + d)
    q = torch.randn(b, sq, hq, d, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(b, sk, hk, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(b, sk, hk, d, generator=g).to("cuda", torch.bfloat16)
    if kind == "decode":
        seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        return lambda: fk.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, softmax_scale=1 / math.sqrt(d))
    if kind == "fwd":

        def fwd():
            with torch.no_grad():
                return fk.flash_attn_func(q, k, v, causal=causal)

        return fwd
    for t in (q, k, v):
        t.requires_grad_(True)
    grad = torch.randn_like(q)
    return lambda: fk.flash_attn_func(q, k, v, causal=causal).backward(grad)


def child(label: str, rep_ms: int) -> dict:
    from importlib.metadata import version

    import torch
    import triton.testing

    import flash_kernels as fk
    from flash_kernels import _cuda

    out = {"label": label, "version": version("flash_kernels"), "file": _cuda.__file__, "cases": {}}
    for name, case in CASES.items():
        fn = make_case(fk, torch, *case)
        fn()
        torch.cuda.synchronize()
        dev_us = triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median") * 1e3
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(300):
            fn()
        host_us = (time.perf_counter() - t0) * 1e6 / 300
        torch.cuda.synchronize()
        out["cases"][name] = {"device_us": dev_us, "host_us": host_us}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", action="append", default=[], help="LABEL=SITE_DIR (twice: stable=..., version=...)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rep-ms", type=int, default=200)
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.rep_ms)))
        return 0
    sites = dict(w.split("=", 1) for w in args.wheel)
    if set(sites) != {"stable", "version"}:
        p.error("give --wheel stable=DIR and --wheel version=DIR")
    runs: dict[str, list[dict]] = {"stable": [], "version": []}
    for r in range(args.rounds):
        for label in ("version", "stable") if r % 2 else ("stable", "version"):
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([sites[label], os.environ.get("PYTHONPATH", "")])}
            res = subprocess.run(
                [sys.executable, __file__, "--child", label, "--rep-ms", str(args.rep_ms)],
                env=env,
                capture_output=True,
                text=True,
                cwd="/",
            )
            if res.returncode != 0:
                print(f"{label} round {r}: exit {res.returncode}\n{res.stderr[-3000:]}", file=sys.stderr)
                return 1
            runs[label].append(json.loads(res.stdout.strip().splitlines()[-1]))
    rows = []
    for name in CASES:
        row = {"case": name}
        for label in runs:
            for m in ("device_us", "host_us"):
                row[f"{label}_{m}"] = statistics.median(run["cases"][name][m] for run in runs[label])
        for m in ("device_us", "host_us"):
            row[f"ratio_{m}"] = row[f"stable_{m}"] / row[f"version_{m}"]
        rows.append(row)
    command = " ".join([os.path.basename(sys.executable), *sys.argv])
    result = {
        "command": command,
        "wheels": {label: {"version": runs[label][0]["version"], "module": runs[label][0]["file"]} for label in runs},
        "rounds": args.rounds,
        "rows": rows,
    }
    head = (
        f"| case | version dev µs | stable dev µs | ratio | version host µs | stable host µs | ratio |\n|{'---|' * 7}"
    )
    lines = [f"# stable-ABI vs version-bound wheel, same run\n\n`{command}`\n"]
    lines += [f"- {label}: {w['version']}" for label, w in result["wheels"].items()]
    lines += ["", head]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['version_device_us']:.1f} | {r['stable_device_us']:.1f} | {r['ratio_device_us']:.3f} "
            f"| {r['version_host_us']:.1f} | {r['stable_host_us']:.1f} | {r['ratio_host_us']:.3f} |"
        )
    md = "\n".join(lines) + "\n"
    print(md)
    os.makedirs(args.out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with open(os.path.join(args.out_dir, f"abi_modes_{stamp}.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out_dir, f"abi_modes_{stamp}.md"), "w") as f:
        f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
