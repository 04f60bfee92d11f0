"""Host time per call, layer by layer: where the ~100 us that flash_kernels spends before its kernel runs go.

Method: the GPU is kept busy with ``torch.cuda._sleep`` while N calls are issued,
so the wall time of the loop is the CPU side alone (the kernels queue behind the sleep). Best of --repeats.
A run whose sleep ended before the loop did is reported as invalid rather than counted.

Each shape is timed at every layer of the call, outermost first, so the differences say what each layer
costs:

- ``api``: the flash_attn-compatible function (flash_kernels.flash_attn_with_kvcache / flash_attn_func /
  flash_attn_varlen_func): the call signature's memo (the checks and backend choice run once per
  signature), then the op's body;
- ``custom_op``: the registered op (flash_kernels.ops.attn_*) called with the backend already chosen:
  torch's custom-op dispatch and the op's Python body (what torch.compile runs; eager calls skip it);
- ``op_body``: the op's plain body (flash_kernels.ops.kvcache_fwd / dense_fwd / varlen_fwd), what eager
  calls run (the difference to ``custom_op`` is what torch's dispatch costs);
- ``wrapper``: flash_kernels._cuda's function: the Python wrapper around the C++ op;
- ``torch_op``: ``torch.ops.flash_kernels_cuda.*`` itself: the dispatcher, the C++ checks, the launch;
- ``sdpa_cudnn`` / ``sdpa_flash``: torch's SDPA on the same tensors, the same-run baseline.

Then cProfile of the api layer (the functions with the most own time), so a fix starts from data.

    python3 benchmarks/bench_host_path.py --out results/host_path.json --profile results/host_path_profile.txt
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import math
import pstats
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CALLS = 200
SLEEP_CYCLES = 400_000_000  # ~0.2 s at the H200's clock: longer than 200 calls' issue time


def host_us(fn, repeats: int) -> tuple[float | None, int]:
    """Best per-call issue time over ``repeats`` loops of CALLS calls, and how many loops were valid."""
    fn()
    torch.cuda.synchronize()
    best, valid = math.inf, 0
    for _ in range(repeats):
        torch.cuda._sleep(SLEEP_CYCLES)
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        t1 = time.perf_counter()
        busy = not torch.cuda.current_stream().query()  # the sleep still runs: nothing waited on the GPU
        torch.cuda.synchronize()
        if busy:
            valid += 1
            best = min(best, (t1 - t0) / CALLS * 1e6)
    return (best if valid else None), valid


class Sdpa:
    """torch's SDPA on flash_kernels' (batch, seqlen, heads, dim) tensors, one backend. The backend is chosen
    once, around the timed loop (``sdpa_kernel`` itself costs tens of microseconds: a model sets it once)."""

    def __init__(self, backend, q, k, v, causal) -> None:
        self.backend = backend
        self.args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        self.kwargs = {"is_causal": causal, "enable_gqa": q.shape[2] != k.shape[2]}

    def __call__(self):
        return F.scaled_dot_product_attention(*self.args, **self.kwargs)


def sdpa(backend, q, k, v, causal) -> Sdpa:
    return Sdpa(backend, q, k, v, causal)


def kvcache_layers(b, keys, hq, hk, d):
    import flash_kernels
    from flash_kernels import _cuda, ops

    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(b, 1, hq, d, device=dev, dtype=dt)
    kc = torch.randn(b, keys, hk, d, device=dev, dtype=dt)
    vc = torch.randn_like(kc)
    cs = torch.full((b,), keys, device=dev, dtype=torch.int32)
    scale = d**-0.5
    return {
        "api": lambda: flash_kernels.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=cs),
        "custom_op": lambda: ops.attn_kvcache_fwd(
            q, kc, vc, None, None, cs, None, None, None, None, None, True, scale, -1, -1, 0.0, None, 0, "cuda"
        ),
        "op_body": lambda: ops.kvcache_fwd(
            q, kc, vc, None, None, cs, None, None, None, None, None, True, scale, -1, -1, 0.0, None, 0, "cuda"
        ),
        "wrapper": lambda: _cuda.kvcache_fwd(q, kc, vc, cs, None, None, None, scale, -1, -1, 0.0, 0),
        "torch_op": lambda: torch.ops.flash_kernels_cuda.kvcache_fwd(
            q, kc, vc, cs, None, None, None, scale, -1, -1, 0.0, 0
        ),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, q, kc, vc, False),
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION, q, kc, vc, False),
    }


def dense_layers(b, s, h, d, causal):
    import flash_kernels
    from flash_kernels import _cuda, ops

    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=dt) for _ in range(3))
    scale = d**-0.5
    right = 0 if causal else -1
    return {
        "api": lambda: flash_kernels.flash_attn_func(q, k, v, causal=causal),
        "custom_op": lambda: ops.attn_fwd(q, k, v, scale, -1, right, 0.0, None, 0.0, None, False, "cuda"),
        "op_body": lambda: ops.dense_fwd(q, k, v, scale, -1, right, 0.0, None, 0.0, None, False, "cuda"),
        "wrapper": lambda: _cuda.fwd(q, k, v, scale, causal, -1, right, 0.0),
        "torch_op": lambda: torch.ops.flash_kernels_cuda.fwd(q, k, v, scale, causal, -1, right, 0.0),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal),
    }


def varlen_layers(b, s, h, d, causal):
    import flash_kernels
    from flash_kernels import _cuda, ops

    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(b * s, h, d, device=dev, dtype=dt) for _ in range(3))
    cu = torch.arange(0, (b + 1) * s, s, device=dev, dtype=torch.int32)
    scale = d**-0.5
    right = 0 if causal else -1
    return {
        "api": lambda: flash_kernels.flash_attn_varlen_func(q, k, v, cu, cu, s, s, causal=causal),
        "custom_op": lambda: ops.attn_varlen_fwd(
            q, k, v, cu, cu, s, s, scale, -1, right, 0.0, None, 0.0, None, False, "cuda"
        ),
        "op_body": lambda: ops.varlen_fwd(q, k, v, cu, cu, s, s, scale, -1, right, 0.0, None, 0.0, None, False, "cuda"),
        "wrapper": lambda: _cuda.varlen_fwd(q, k, v, cu, cu, s, s, scale, causal, -1, right, 0.0),
    }


SHAPES = {
    "kvcache b=1 32k 32/8 d128": lambda: kvcache_layers(1, 32768, 32, 8, 128),
    "kvcache b=64 2k 32/4 d64": lambda: kvcache_layers(64, 2048, 32, 4, 64),
    "func b=2 s=256 h=16 d128 causal": lambda: dense_layers(2, 256, 16, 128, True),
    "varlen b=2 s=256 h=16 d128 causal": lambda: varlen_layers(2, 256, 16, 128, True),
}


def profile(fn, top: int) -> str:
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="write the table as JSON here")
    p.add_argument("--profile", help="write cProfile of each shape's api layer here")
    args = p.parse_args()
    rows, profiles = [], []
    print(f"{'shape':36} {'layer':12} {'us/call':>9}  valid")
    for name, make in SHAPES.items():
        layers = make()
        for layer, fn in layers.items():
            try:
                with sdpa_kernel([fn.backend]) if isinstance(fn, Sdpa) else contextlib.nullcontext():
                    us, valid = host_us(fn, args.repeats)
            except Exception as exc:  # a baseline this torch cannot run is a row that says so
                rows.append({"shape": name, "layer": layer, "us": None, "error": f"{type(exc).__name__}: {exc}"})
                print(f"{name:36} {layer:12} {'error':>9}  {type(exc).__name__}: {str(exc)[:80]}")
                continue
            rows.append({"shape": name, "layer": layer, "us": us, "valid_loops": valid})
            shown = f"{us:9.1f}" if us is not None else "  invalid"
            print(f"{name:36} {layer:12} {shown}  {valid}/{args.repeats}")
        if args.profile:
            profiles.append(f"===== {name}: api layer, {CALLS} calls\n{profile(layers['api'], 30)}")
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "calls": CALLS,
        "repeats": args.repeats,
        "command": "python3 benchmarks/bench_host_path.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v is not None),
    }
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({**meta, "rows": rows}, fh, indent=2)
    if args.profile:
        with open(args.profile, "w") as fh:
            fh.write("\n".join(profiles))


if __name__ == "__main__":
    main()
