"""The Triton path's backward, one tile config at a time: the data behind the tile rules in triton_tiles.

For each shape (flash-attention's convention: batch x seqlen = 16k tokens, hidden 2048), times the forward
alone and forward+backward with the Triton backend for every tile config given, each config forced on both
backward kernels (dK/dV and dQ), and torch SDPA's cuDNN backend on the same tensors in the same run. Reports
each config's backward time (fwd+bwd minus fwd), TFLOP/s and the ratio of its fwd+bwd time to cuDNN's, next
to what the Triton path picks today ("default": its own rules and tuner). A config that does not compile for
this GPU (shared memory, registers) is listed with Triton's reason. Gradients are checked against cuDNN's.

This reads flash_kernels' private tile hooks (``triton_attention.bwd_config``/``bwd_candidates``) on purpose:
it measures configs the package's rules do not allow yet. It changes nothing on disk.

    PYTHONPATH=flash_kernels python3 benchmarks/bench_triton_tiles.py --head-dims 256 --seqlens 4096,16384 \\
        --causal 0,1 --out triton_tiles.json

Exit status: 0 done; 1 a config's gradients differ from cuDNN's beyond bf16 tolerance; 2 usage or no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

import torch
import triton
import triton.testing
from bench_attention import _atomic_write  # same script folder: one way to write a result
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

TOKENS, HIDDEN = 16384, 2048
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_CFG = re.compile(r"(\d+)x(\d+)w(\d+)s(\d+)")
# Tiles of at most 4096 elements: at head dim 256 the backward holds two fp32 accumulators of BLOCK x 256.
DEFAULT_CONFIGS = ",".join(
    f"{m}x{n}w{w}s{s}" for m in (32, 64, 128) for n in (32, 64) for w in (4, 8) for s in (1, 2) if m * n <= 4096
)
_ORIGINALS: tuple = ()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dims", default="256", help="comma list (default 256)")
    p.add_argument("--seqlens", default="4096,16384", help="comma list (default 4096,16384)")
    p.add_argument("--causal", default="0,1", help="0, 1 or 0,1")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="BMxBNwWARPSsSTAGES, comma list (default: a grid)")
    p.add_argument("--rep-ms", type=int, default=50, help="do_bench time per measurement")
    p.add_argument("--time-limit", type=float, default=0, help="stop starting new configs after this many s")
    p.add_argument("--out", default="triton_tiles.json", help="result file (JSON, written atomically)")
    args = p.parse_args(argv)
    try:
        args.head_dims = [int(x) for x in args.head_dims.split(",")]
        args.seqlens = [int(x) for x in args.seqlens.split(",")]
        args.causal = [bool(int(x)) for x in args.causal.split(",")]
    except ValueError as exc:
        p.error(f"--head-dims, --seqlens and --causal take comma lists of integers ({exc})")
    bad = [c for c in args.configs.split(",") if not _CFG.fullmatch(c)]
    if bad:
        p.error(f"--configs: {', '.join(bad)} not of the form 64x32w8s1 (BLOCK_M x BLOCK_N, warps, stages)")
    return args


def flops(batch, nheads, seqlen, head_dim, causal, fwd_bwd):
    f = 4 * batch * nheads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
    return f * (3.5 if fwd_bwd else 1.0)


def forced(cfg):
    """Force ``cfg`` (a TileConfig, or None for the package's own choice) on the Triton backward."""
    global _ORIGINALS
    from flash_kernels import triton_attention, triton_tiles

    if not _ORIGINALS:
        _ORIGINALS = (triton_attention.bwd_config, triton_attention.bwd_candidates)
    triton_tiles._TUNED.clear()
    if cfg is None:
        triton_attention.bwd_config, triton_attention.bwd_candidates = _ORIGINALS
    else:
        triton_attention.bwd_config = lambda *a, **k: cfg
        triton_attention.bwd_candidates = lambda *a, **k: [cfg]


def timed(step, rep_ms, grads):
    return triton.testing.do_bench(step, rep=rep_ms, grad_to_none=grads)


def shape_rows(args, head_dim, seqlen, causal, configs, started, failures):
    from flash_kernels.triton_tiles import TileConfig

    import flash_kernels as fk

    nheads, batch = HIDDEN // head_dim, max(1, TOKENS // seqlen)
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=DTYPES[args.dtype], requires_grad=True)
        for _ in range(3)
    )
    g = torch.randn_like(q)
    shape = dict(head_dim=head_dim, seqlen=seqlen, batch=batch, nheads=nheads, causal=causal)

    def cudnn(q, k, v):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)

    def triton_fk(q, k, v):
        return fk.flash_attn_func(q, k, v, causal=causal)

    def grads_of(fn):
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(g)
        return [t.grad.float() for t in (q, k, v)]

    ref = grads_of(cudnn)
    base = dict(shape)
    base["cudnn_fwd_ms"] = timed(lambda: cudnn(q, k, v), args.rep_ms, None)
    base["cudnn_fwd_bwd_ms"] = timed(lambda: cudnn(q, k, v).backward(g), args.rep_ms, [q, k, v])
    os.environ["FLASH_KERNELS_BACKEND"] = "triton"
    forced(None)
    with torch.no_grad():
        base["triton_fwd_ms"] = timed(lambda: triton_fk(q, k, v), args.rep_ms, None)
    rows = []
    for name in ["default", *configs]:
        if name != "default" and args.time_limit and time.time() - started > args.time_limit:
            rows.append(dict(base, config=name, error="not run: --time-limit reached"))
            continue
        m = _CFG.fullmatch(name)
        forced(None if m is None else TileConfig(*(int(x) for x in m.groups())))
        row = dict(base, config=name)
        try:
            got = grads_of(triton_fk)
            ms = timed(lambda: triton_fk(q, k, v).backward(g), args.rep_ms, [q, k, v])
        except Exception as exc:  # a config this GPU cannot hold: Triton says why
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            rows.append(row)
            print(f"hd{head_dim} s{seqlen} causal={int(causal)} {name:12s} {row['error']}", flush=True)
            continue
        diff = max((a - b).abs().max().item() for a, b in zip(got, ref, strict=True))
        scale = max(b.abs().max().item() for b in ref)
        if diff > 0.05 * max(scale, 1.0):
            failures.append(f"{name} hd{head_dim} s{seqlen} causal={causal}: gradients differ by {diff:.3g}")
        row.update(
            fwd_bwd_ms=ms,
            bwd_ms=ms - base["triton_fwd_ms"],
            tflops=flops(batch, nheads, seqlen, head_dim, causal, True) / (ms * 1e-3) / 1e12,
            vs_cudnn=base["cudnn_fwd_bwd_ms"] / ms,
            max_grad_diff_vs_cudnn=diff,
        )
        rows.append(row)
        print(
            f"hd{head_dim} s{seqlen} causal={int(causal)} {name:12s} fwd+bwd {ms:8.3f} ms "
            f"{row['tflops']:6.1f} TFLOP/s  {row['vs_cudnn']:.2f}x cuDNN",
            flush=True,
        )
    forced(None)
    return rows


def markdown(result):
    lines = [f"# Triton backward tiles, {result['device']}", "", f"Command: `{result['command']}`", ""]
    lines += [f"torch {result['torch']}, triton {result['triton']}; {result['dtype']}; fwd+bwd / cuDNN is a ratio of "
              "speeds (higher is better).", ""]  # fmt: skip
    shapes = {}
    for r in result["rows"]:
        shapes.setdefault((r["head_dim"], r["seqlen"], r["causal"]), []).append(r)
    for (hd, s, causal), rows in shapes.items():
        lines += [f"## head dim {hd}, seqlen {s}, {'causal' if causal else 'not causal'}", ""]
        lines += [
            f"cuDNN fwd+bwd {rows[0]['cudnn_fwd_bwd_ms']:.3f} ms; Triton fwd {rows[0]['triton_fwd_ms']:.3f} ms",
            "",
        ]
        lines += ["| config | fwd+bwd ms | bwd ms | TFLOP/s | vs cuDNN |", "|---|---|---|---|---|"]
        ok = sorted((r for r in rows if "error" not in r), key=lambda r: r["fwd_bwd_ms"])
        for r in ok:
            lines.append(
                f"| {r['config']} | {r['fwd_bwd_ms']:.3f} | {r['bwd_ms']:.3f} | {r['tflops']:.1f} | {r['vs_cudnn']:.2f} |"
            )
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['config']} | – | – | – | {r['error']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_triton_tiles: needs a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    started, failures, rows = time.time(), [], []
    configs = args.configs.split(",")
    for hd in args.head_dims:
        for s in args.seqlens:
            for causal in args.causal:
                rows += shape_rows(args, hd, s, causal, configs, started, failures)
    result = dict(
        command="python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        python=platform.python_version(), dtype=args.dtype, rows=rows, failures=failures,
        seconds=round(time.time() - started, 1),
    )  # fmt: skip
    _atomic_write(args.out, lambda f: json.dump(result, f, indent=1, sort_keys=True))
    text = markdown(result)
    _atomic_write(os.path.splitext(args.out)[0] + ".md", lambda f: f.write(text))
    print(text)
    for f in failures:
        print(f"CHECK FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
