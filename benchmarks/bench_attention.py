"""Attention throughput on one GPU: flash_kernels against torch SDPA, measured in the same run.

Problem (flash-attention's benchmark convention): bf16, batch x seqlen = 16k tokens, hidden 2048
(nheads = 2048 / headdim), seqlen 1k..16k, causal and not. FLOPs = 4 * batch * nheads * seqlen^2
* headdim, halved when causal; forward+backward counts 3.5x the forward. Time: the median of
triton.testing.do_bench. Baselines: torch.nn.functional.scaled_dot_product_attention restricted
to each of its FLASH_ATTENTION, CUDNN_ATTENTION and EFFICIENT_ATTENTION backends.

Decode: flash_attn_with_kvcache with one query token against a bf16 cache; bandwidth = bytes of
K and V read / time, reported as a fraction of the device-to-device copy bandwidth measured in
this run (bytes read + bytes written / time of a large copy).

Writes <out-dir>/attention_<stamp>.json and .md (and .png when matplotlib is present); each file
names the command that produced it. Exit status: 0 done; 1 a correctness check failed; 2 usage.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import sys
import tempfile
import time

import torch
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

import flash_kernels as fk

TOKENS = 16 * 1024
HIDDEN = 2048
SDPA_BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
}


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _csv_ints(text):
    return [int(x) for x in text.split(",") if x]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dims", type=_csv_ints, default=[64, 128])
    p.add_argument("--seqlens", type=_csv_ints, default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--modes", default="fwd,fwd_bwd,decode")
    p.add_argument(
        "--backends",
        default="triton",
        help="flash_kernels backends to measure: triton, cuda, cuda_general (comma list)",
    )
    p.add_argument("--no-sdpa", action="store_true", help="skip the SDPA baselines")
    p.add_argument("--causal", default="0,1", help="0, 1 or 0,1")
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type of the attention rows")
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    return p.parse_args(argv)


def flops(batch, nheads, seqlen, head_dim, causal, mode):
    f = 4.0 * batch * nheads * seqlen * seqlen * head_dim
    if causal:
        f /= 2
    return f * (3.5 if mode == "fwd_bwd" else 1.0)


def bench_ms(fn, rep_ms, grad_to_none=None):
    return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, grad_to_none=grad_to_none, return_mode="median")


def copy_bandwidth(rep_ms):
    """Device-to-device copy of 2 GiB: (read + write bytes) / median time, bytes/s."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), rep_ms)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


# "cuda_general": the CUDA backend with its Hopper kernels turned off (FLASH_KERNELS_CUDA_SM90=0), i.e. the
# mma.sync kernels every sm_80+ GPU runs; on other GPUs it equals "cuda".
BACKENDS = {"triton": ("triton", "1"), "cuda": ("cuda", "1"), "cuda_general": ("cuda", "0")}


def make_fk(backend, causal):
    fk_backend, sm90 = BACKENDS[backend]

    def run(q, k, v):
        os.environ["FLASH_KERNELS_BACKEND"] = fk_backend
        os.environ["FLASH_KERNELS_CUDA_SM90"] = sm90
        return fk.flash_attn_func(q, k, v, causal=causal)

    return run


def make_sdpa(sdpa_backend, causal):
    def run(q, k, v):  # (b, s, h, d) views -> SDPA's (b, h, s, d)
        with sdpa_kernel([sdpa_backend]):
            return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)

    return run


def make_step(mode, fn, q, k, v, g):
    if mode == "fwd":

        def step():
            with torch.no_grad():
                fn(q, k, v)
    else:

        def step():
            fn(q, k, v).backward(g)

    return step


def attention_rows(args, impls, failures):
    rows = []
    modes = [m for m in args.modes.split(",") if m in ("fwd", "fwd_bwd")]
    if not modes:
        return rows
    for head_dim in args.head_dims:
        nheads = HIDDEN // head_dim
        for seqlen in args.seqlens:
            batch = max(1, TOKENS // seqlen)
            for causal in [bool(int(c)) for c in args.causal.split(",")]:
                torch.manual_seed(0)
                q, k, v = (
                    torch.randn(
                        batch, seqlen, nheads, head_dim, device="cuda", dtype=DTYPES[args.dtype], requires_grad=True
                    )
                    for _ in range(3)
                )
                g = torch.randn_like(q)
                reference = None
                for name, make in impls.items():
                    fn = make(causal)
                    try:
                        out = fn(q, k, v)
                    except Exception as e:  # a baseline that does not support the shape
                        rows.append(
                            dict(
                                impl=name,
                                head_dim=head_dim,
                                seqlen=seqlen,
                                batch=batch,
                                nheads=nheads,
                                causal=causal,
                                error=str(e)[:200],
                            )
                        )
                        continue
                    if reference is None:
                        reference = out.detach().float()
                        max_diff = 0.0
                    else:
                        max_diff = (out.detach().float() - reference).abs().max().item()
                    if max_diff > 0.05:
                        failures.append(
                            f"{name} hd{head_dim} s{seqlen} causal={causal}: "
                            f"differs from {next(iter(impls))} by {max_diff:.3g}"
                        )
                    for mode in modes:
                        step = make_step(mode, fn, q, k, v, g)
                        try:
                            ms = bench_ms(step, args.rep_ms, grad_to_none=[q, k, v])
                        except Exception as e:
                            rows.append(
                                dict(
                                    impl=name,
                                    mode=mode,
                                    head_dim=head_dim,
                                    seqlen=seqlen,
                                    batch=batch,
                                    nheads=nheads,
                                    causal=causal,
                                    error=str(e)[:200],
                                )
                            )
                            continue
                        tf = flops(batch, nheads, seqlen, head_dim, causal, mode) / (ms * 1e-3) / 1e12
                        rows.append(
                            dict(
                                impl=name,
                                mode=mode,
                                head_dim=head_dim,
                                seqlen=seqlen,
                                batch=batch,
                                nheads=nheads,
                                causal=causal,
                                ms=ms,
                                tflops=tf,
                                max_abs_diff_vs_first=max_diff,
                            )
                        )
                        print(
                            f"{mode:8s} hd{head_dim:<4d} s{seqlen:<6d} causal={int(causal)} "
                            f"{name:16s} {ms:8.3f} ms {tf:7.1f} TFLOP/s",
                            flush=True,
                        )
    return rows


def decode_rows(args, copy_bw):
    rows = []
    cases = [
        (32, 8192, 32, 8, 128),
        (8, 32768, 32, 8, 128),
        (1, 131072, 32, 8, 128),
        (64, 4096, 16, 16, 128),
        (32, 8192, 16, 2, 64),
    ]
    for batch, cache_len, nheads_q, nheads_k, head_dim in cases:
        torch.manual_seed(0)
        q = torch.randn(batch, 1, nheads_q, head_dim, device="cuda", dtype=torch.bfloat16)
        k_cache = torch.randn(batch, cache_len, nheads_k, head_dim, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        seqlens = torch.full((batch,), cache_len, dtype=torch.int32, device="cuda")
        os.environ["FLASH_KERNELS_BACKEND"] = "triton"
        step = functools.partial(fk.flash_attn_with_kvcache, q, k_cache, v_cache, cache_seqlens=seqlens)
        out = step()
        with sdpa_kernel([SDPBackend.MATH]):
            kk = k_cache.repeat_interleave(nheads_q // nheads_k, 2)
            vv = v_cache.repeat_interleave(nheads_q // nheads_k, 2)
            ref = sdpa(q.transpose(1, 2).float(), kk.transpose(1, 2).float(), vv.transpose(1, 2).float()).transpose(
                1, 2
            )
            del kk, vv
        max_diff = (out.float() - ref).abs().max().item()
        ms = bench_ms(step, args.rep_ms)
        nbytes = 2 * k_cache.numel() * k_cache.element_size()
        bw = nbytes / (ms * 1e-3)
        rows.append(
            dict(
                batch=batch,
                cache_len=cache_len,
                nheads_q=nheads_q,
                nheads_k=nheads_k,
                head_dim=head_dim,
                ms=ms,
                bytes=nbytes,
                bandwidth_TBps=bw / 1e12,
                fraction_of_copy=bw / copy_bw,
                max_abs_diff=max_diff,
            )
        )
        print(
            f"decode b{batch} L{cache_len} hq{nheads_q} hk{nheads_k} d{head_dim}: {ms:.3f} ms "
            f"{bw / 1e12:.2f} TB/s = {bw / copy_bw:.2f} of copy (diff {max_diff:.2g})",
            flush=True,
        )
    return rows


def markdown(result):
    lines = [
        f"# Attention benchmark, {result['device']}",
        "",
        f"Command: `{result['command']}`",
        "",
        f"torch {result['torch']}, triton {result['triton']}; {result.get('dtype', 'bf16')}, batch x seqlen = {TOKENS}, "
        f"hidden {HIDDEN}; TFLOP/s = 4*b*h*s^2*d (/2 causal, x3.5 fwd+bwd) / median time.",
        "",
    ]
    rows = [r for r in result["attention"] if "tflops" in r]
    ours = sorted({r["impl"] for r in rows if r["impl"].startswith("fk_")})
    base = [b for b in SDPA_BACKENDS if any(r["impl"] == b for r in rows)]
    for mode in ("fwd", "fwd_bwd"):
        sel = [r for r in rows if r["mode"] == mode]
        if not sel:
            continue
        lines += [
            f"## {mode}",
            "",
            "| hd | seqlen | causal | "
            + " | ".join(ours + base)
            + " | "
            + " | ".join(f"{o}/{b}" for o in ours for b in base if b != "sdpa_efficient")
            + " |",
            "|" + "---|" * (3 + len(ours) + len(base) + len(ours) * len([b for b in base if b != "sdpa_efficient"])),
        ]
        keys = sorted({(r["head_dim"], r["seqlen"], r["causal"]) for r in sel})
        for key in keys:
            tf = {r["impl"]: r["tflops"] for r in sel if (r["head_dim"], r["seqlen"], r["causal"]) == key}
            cells = [f"{tf[i]:.0f}" if i in tf else "-" for i in ours + base]
            ratios = [
                f"{tf[o] / tf[b]:.2f}" if o in tf and b in tf else "-"
                for o in ours
                for b in base
                if b != "sdpa_efficient"
            ]
            lines.append(f"| {key[0]} | {key[1]} | {int(key[2])} | " + " | ".join(cells + ratios) + " |")
        lines.append("")
    if result.get("decode"):
        lines += [
            "## decode (flash_attn_with_kvcache, 1 query token)",
            "",
            f"Copy bandwidth measured in this run: {result['copy_bandwidth_TBps']:.2f} TB/s.",
            "",
            "| batch | cache len | hq | hk | d | ms | TB/s | fraction of copy |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in result["decode"]:
            lines.append(
                f"| {r['batch']} | {r['cache_len']} | {r['nheads_q']} | {r['nheads_k']} | "
                f"{r['head_dim']} | {r['ms']:.3f} | {r['bandwidth_TBps']:.2f} | "
                f"{r['fraction_of_copy']:.2f} |"
            )
        lines.append("")
    errors = [r for r in result["attention"] if "error" in r]
    if errors:
        lines += (
            ["## not measured", ""]
            + [
                f"- {r['impl']} hd{r['head_dim']} s{r['seqlen']} causal={int(r['causal'])}: {r['error']}"
                for r in errors
            ]
            + [""]
        )
    return "\n".join(lines)


def plot(result, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in result["attention"] if "tflops" in r]
    panels = sorted({(r["mode"], r["head_dim"], r["causal"]) for r in rows})
    if not panels:
        return False
    cols = 4
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.2 * nrows), squeeze=False)
    for ax, (mode, hd, causal) in zip(axes.flat, panels, strict=False):
        for impl in sorted({r["impl"] for r in rows}):
            pts = sorted(
                (r["seqlen"], r["tflops"])
                for r in rows
                if (r["mode"], r["head_dim"], r["causal"], r["impl"]) == (mode, hd, causal, impl)
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{mode} hd{hd} causal={int(causal)}", fontsize=9)
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    _atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), binary=True)
    return True


def _atomic_write(path, write, binary=False):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_attention: needs a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    impls = {}
    for backend in [b for b in args.backends.split(",") if b]:
        if backend not in BACKENDS:
            print(f"bench_attention: unknown backend {backend!r} ({', '.join(BACKENDS)})", file=sys.stderr)
            return 2
        impls[f"fk_{backend}"] = functools.partial(make_fk, backend)
    if not args.no_sdpa:
        for name, sdpa_backend in SDPA_BACKENDS.items():
            impls[name] = functools.partial(make_sdpa, sdpa_backend)
    failures = []
    copy_bw = copy_bandwidth(args.rep_ms)
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    started = time.time()
    result = dict(
        command="python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        copy_bandwidth_TBps=copy_bw / 1e12,
        dtype=args.dtype,
        attention=attention_rows(args, impls, failures),
        decode=decode_rows(args, copy_bw) if "decode" in args.modes.split(",") else [],
        failures=failures,
    )
    result["seconds"] = round(time.time() - started, 1)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = os.path.join(args.out_dir, f"attention_{stamp}")
    _atomic_write(base + ".json", lambda f: json.dump(result, f, indent=1, sort_keys=True))
    text = markdown(result)
    _atomic_write(base + ".md", lambda f: f.write(text))
    plot(result, base + ".png")
    print(text)
    for failure in failures:
        print(f"CHECK FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
