"""Every entry point with the GPU nearly full: ``python -m flash_kernels.tests.oom_probe [options]``.

One process (the caller starts one per trial, so a crash takes only the trial):
1. builds the inputs of every entry point (dense, varlen, paged varlen, KV cache dense and paged,
   packed, dropout, deterministic; forward and, where there is one, backward); with ``--preload``
   calls flash_kernels.prepare_kernels(), with ``--warm`` runs each entry point once;
2. fills the GPU until ``--free-mb`` MB are left to the driver (0: until a 2 MB allocation fails);
3. calls each entry point: it must succeed or raise ``torch.OutOfMemoryError``;
4. frees the filler and calls each again: it must succeed, and its results must equal (bitwise)
   those of a second call, and those of step 3 where step 3 succeeded.

Each step is appended to ``--progress`` before it starts (flushed), so when the process dies the
last line names the call it died in. The results go to ``--json``: per entry point the outcome
under pressure ("ok", "oom" or "error"), the exception text and whether its traceback passed
through flash_kernels, the outcome after freeing, and the equality checks. Exit status 0 when
every entry point met the rules, 1 otherwise (a signal when the process crashed).

``--backend cuda`` forces the CUDA path where it supports the entry point (dropout runs on Triton
under ``auto``); ``--shapes issue`` runs instead the three dense shapes of the original out-of-memory report.
Used by flash_kernels/tests/test_oom.py and flash_kernels/tools/gpu/oom_check.sh.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import traceback

import torch

import flash_kernels as fk
from flash_kernels import dispatch

MB = 1 << 20
SEED = 1234


def _new(shape, dtype, grad=False):
    t = torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)
    return t.requires_grad_(grad)


def _grads(out, inputs, dout):
    return (out, *torch.autograd.grad(out, inputs, dout))


def _dense(b, sq, sk, h, hk, d, dtype, **kwargs):
    q, k, v = _new((b, sq, h, d), dtype, True), _new((b, sk, hk, d), dtype, True), _new((b, sk, hk, d), dtype, True)
    dout = _new((b, sq, h, d), dtype)
    return lambda: _grads(fk.flash_attn_func(q, k, v, **kwargs), (q, k, v), dout)


def _dropout(dtype):
    q, k, v = (_new((2, 256, 4, 64), dtype, True) for _ in range(3))
    dout = _new((2, 256, 4, 64), dtype)

    def run():
        out, lse, probs = fk.flash_attn_func(q, k, v, dropout_p=0.2, causal=True, return_attn_probs=True)
        return (lse, probs, *_grads(out, (q, k, v), dout))

    return run


def _varlen(dtype):
    lengths = [300, 17, 512, 129]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    total, top = sum(lengths), max(lengths)
    q, k, v = (_new((total, 8, 128), dtype, True) for _ in range(3))
    dout = _new((total, 8, 128), dtype)
    return lambda: _grads(fk.flash_attn_varlen_func(q, k, v, cu, cu, top, top, causal=True), (q, k, v), dout)


def _paged_pool(batch, pages_per_seq, page, hk, d, dtype):
    k_cache, v_cache = (_new((batch * pages_per_seq, page, hk, d), dtype) for _ in range(2))
    perm = torch.randperm(batch * pages_per_seq, device="cuda").to(torch.int32)
    return k_cache, v_cache, perm.view(batch, pages_per_seq)


def _paged_varlen(dtype):
    lengths = [200, 64, 511]
    cu_q = torch.tensor([0, 1, 2, 3], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    k_cache, v_cache, table = _paged_pool(3, 2, 256, 2, 128, dtype)
    q = _new((3, 8, 128), dtype)
    return lambda: (fk.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 1, max(lengths), block_table=table),)


def _kvcache(dtype, paged):
    b, cap, hk, d = 4, 1024, 2, 128
    if paged:
        k_cache, v_cache, table = _paged_pool(b, cap // 256, 256, hk, d, dtype)
    else:
        k_cache, v_cache, table = _new((b, cap, hk, d), dtype), _new((b, cap, hk, d), dtype), None
    q, k_new, v_new = _new((b, 1, 16, d), dtype), _new((b, 1, hk, d), dtype), _new((b, 1, hk, d), dtype)
    seqlens = torch.tensor([1000, 3, 517, 64], device="cuda", dtype=torch.int32)
    cos, sin = _new((cap, d // 4), torch.float32), _new((cap, d // 4), torch.float32)

    def run():
        # The append writes the same rotated keys at the same positions every call, so every call sees
        # the same cache and returns the same result.
        out, lse = fk.flash_attn_with_kvcache(
            q,
            k_cache,
            v_cache,
            k_new,
            v_new,
            rotary_cos=cos,
            rotary_sin=sin,
            cache_seqlens=seqlens,
            block_table=table,
            causal=True,
            return_softmax_lse=True,
        )
        return out, lse  # the cache itself is the same tensor every call; out reads what was appended

    return run


def _packed(dtype):
    qkv = _new((2, 384, 3, 8, 64), dtype, True)
    q, kv = _new((2, 384, 8, 64), dtype, True), _new((2, 384, 2, 8, 64), dtype, True)
    dout = _new((2, 384, 8, 64), dtype)

    def run():
        return (
            *_grads(fk.flash_attn_qkvpacked_func(qkv, causal=True), (qkv,), dout),
            *_grads(fk.flash_attn_kvpacked_func(q, kv), (q, kv), dout),
        )

    return run


def entry_points(dtype) -> dict:
    """name -> (runs on the CUDA path, the call); inputs are made here, before the GPU is filled."""
    return {
        "dense": (True, _dense(2, 512, 512, 8, 8, 64, dtype, causal=True)),
        "dense_gqa_window": (True, _dense(2, 333, 700, 8, 2, 128, dtype, window_size=(128, 0))),
        "deterministic": (True, _dense(2, 256, 256, 4, 4, 96, dtype, deterministic=True)),
        "dropout": (False, _dropout(dtype)),
        "varlen": (True, _varlen(dtype)),
        "paged_varlen": (True, _paged_varlen(dtype)),
        "kvcache": (True, _kvcache(dtype, paged=False)),
        "kvcache_paged": (True, _kvcache(dtype, paged=True)),
        "packed": (True, _packed(dtype)),
    }


def issue_shapes(dtype) -> dict:
    """The original out-of-memory report's shapes: head dim 40 with 799 x 3 causal, 256 with 1024 x 1024, 128 with 4096 x 4096 causal."""
    return {
        "hd40_799x3_causal": (True, _dense(2, 799, 3, 8, 8, 40, dtype, causal=True)),
        "hd256_1024x1024": (True, _dense(2, 1024, 1024, 8, 8, 256, dtype)),
        "hd128_4096x4096_causal": (True, _dense(2, 4096, 4096, 8, 8, 128, dtype, causal=True)),
    }


def warm_torch(dtype) -> None:
    """Load the code of torch's own kernels that the probe's autograd runs around flash_kernels' calls
    (the packed forms' select backward: zeros, a strided copy, an add), so that a failure under
    pressure is flash_kernels', not the driver loading torch's kernels on first use."""
    g = _new((2, 8, 4, 8), dtype)
    torch.zeros(8, device="cuda", dtype=torch.float32)  # a zero gradient for lse (the registered ops' autograd)
    z = torch.zeros((2, 8, 3, 4, 8), device="cuda", dtype=dtype)
    z.select(2, 0).copy_(g)
    (z + z).sum()
    torch.cuda.synchronize()


class Filler:
    """Device memory taken through torch's allocator until ``free_mb`` MB are left to the driver."""

    def __init__(self, free_mb: int):
        self.blocks = []
        target = free_mb * MB
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # blocks cached from making the inputs go back to the driver, then to the filler
        for chunk in (1 << 34, 1 << 32, 1 << 30, 1 << 28, 1 << 26, 1 << 24, 1 << 22, 2 * MB):
            while True:
                free, _ = torch.cuda.mem_get_info()
                if free - chunk < target and not (free_mb == 0 and chunk == 2 * MB):
                    break
                try:
                    self.blocks.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
                except torch.OutOfMemoryError:
                    break
        self.free_mb = torch.cuda.mem_get_info()[0] / MB

    def release(self) -> None:
        self.blocks.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _inside_flash_kernels(exc: BaseException) -> bool:
    package = os.path.dirname(os.path.abspath(dispatch.__file__))
    frames = traceback.extract_tb(exc.__traceback__)
    tests = os.path.join(package, "tests") + os.sep
    files = [os.path.abspath(f.filename) for f in frames]
    return any(f.startswith(package + os.sep) and not f.startswith(tests) for f in files)


def attempt(fn):
    """(outcome, detail, tensors): outcome is ok, oom or error."""
    torch.manual_seed(SEED)  # dropout draws its seed from torch's generator: the same mask every call
    try:
        result = fn()
        torch.cuda.synchronize()
        return "ok", "", [t.detach() for t in result]  # fresh tensors of this call: no copy needed
    except torch.OutOfMemoryError as exc:
        return "oom", str(exc).splitlines()[0][:400], None
    except Exception as exc:  # every other type breaks the rule; recorded, not raised
        where = "inside flash_kernels" if _inside_flash_kernels(exc) else "outside flash_kernels"
        return "error", f"{type(exc).__module__}.{type(exc).__name__} ({where}): {str(exc)[:400]}", None


def _same(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _log(progress, text: str) -> None:
    if progress is not None:
        progress.write(text + "\n")
        progress.flush()


def _use_backend(backend: str, cuda_ok: bool) -> None:
    os.environ[dispatch.BACKEND_ENV] = backend if backend != "cuda" or cuda_ok else "auto"


def _verdict(entry: dict) -> bool:
    """An entry meets the rules: ok or torch.OutOfMemoryError under pressure; ok twice after freeing,
    bitwise equal to each other and to every earlier successful call."""
    same = entry["after_free_repeat_equal"] and entry.get("pressure_equal", True) and entry.get("warm_equal", True)
    return entry["pressure"] in ("ok", "oom") and entry["after_free"] == "ok" and same


def run_probe(args) -> dict:
    dtype = getattr(torch, args.dtype)
    entries = issue_shapes(dtype) if args.shapes == "issue" else entry_points(dtype)
    if args.entries:
        entries = {name: entries[name] for name in args.entries.split(",")}
    progress = open(args.progress, "a", encoding="utf-8") if args.progress else None  # noqa: SIM115
    warm_torch(dtype)
    prepared = fk.prepare_kernels() if args.preload else None
    warm = {}
    for name, (cuda_ok, fn) in entries.items() if args.warm else ():
        _use_backend(args.backend, cuda_ok)
        _log(progress, f"warm {name}")
        warm[name] = attempt(fn)
    filler = Filler(args.free_mb)
    report = {
        "backend": args.backend,
        "dtype": args.dtype,
        "warm": args.warm,
        "preloaded_launchers": prepared,
        "free_mb_requested": args.free_mb,
        "free_mb_after_fill": round(filler.free_mb, 1),
        "entries": {},
    }
    pressure = {}
    for name, (cuda_ok, fn) in entries.items():
        _use_backend(args.backend, cuda_ok)
        _log(progress, f"pressure {name}")
        pressure[name] = attempt(fn)
    _log(progress, "release")
    filler.release()
    for name, (cuda_ok, fn) in entries.items():
        _use_backend(args.backend, cuda_ok)
        _log(progress, f"after-free {name}")
        first, second = attempt(fn), attempt(fn)
        entry = {
            "pressure": pressure[name][0],
            "pressure_detail": pressure[name][1],
            "after_free": first[0] if first[0] != "ok" else second[0],
            "after_free_detail": first[1] or second[1],
            "after_free_repeat_equal": _same(first[2], second[2]),
        }
        if pressure[name][0] == "ok":
            entry["pressure_equal"] = _same(pressure[name][2], first[2])
        if name in warm:
            entry["warm"] = warm[name][0]
            entry["warm_equal"] = _same(warm[name][2], first[2])
        entry["meets_rules"] = _verdict(entry)
        report["entries"][name] = entry
    _log(progress, "done")
    report["meets_rules"] = all(e["meets_rules"] for e in report["entries"].values())
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flash_kernels.tests.oom_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="auto", choices=dispatch.BACKENDS)
    parser.add_argument("--free-mb", type=int, default=4, help="MB left to the driver (0: fill until 2 MB fails)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--shapes", default="entries", choices=("entries", "issue"))
    parser.add_argument("--entries", default="", help="comma list of entry points (default: all)")
    parser.add_argument("--warm", action="store_true", help="call every entry point once before filling")
    parser.add_argument("--preload", action="store_true", help="flash_kernels.prepare_kernels() before filling")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--progress", help="append each step here before it starts")
    args = parser.parse_args(argv)
    faulthandler.enable()
    report = run_probe(args)
    text = json.dumps(report, indent=1)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    for name, entry in report["entries"].items():
        print(
            f"{name}: pressure={entry['pressure']} after_free={entry['after_free']} "
            f"meets_rules={entry['meets_rules']} {entry['pressure_detail'] or entry['after_free_detail']}"
        )
    print(f"free after fill {report['free_mb_after_fill']} MB; meets_rules={report['meets_rules']}")
    return 0 if report["meets_rules"] else 1


if __name__ == "__main__":
    sys.exit(main())
