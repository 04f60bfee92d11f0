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

    python tools/cuda_numerics_check.py [--quick] [--json PATH]

Varlen (when the extension has varlen_fwd): packed sequences of different lengths (some empty, some
shorter than the keys, so causal rows see no key) against the same references run per sequence.

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


def reference(q, k, v, scale, causal, wl, wr, dtype):
    """Attention computed in `dtype` by PyTorch ops; rows that see no key give out 0, lse +inf."""
    qf, kf, vf = (t.to(dtype) for t in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = hq // hk
    kf = kf.repeat_interleave(g, dim=2)
    vf = vf.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
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

    results = {}
    grads = {}
    for name, dt in (("ref", torch.float32), ("lowp", dtype)):
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        o, lse_ref = reference(qq, kk, vv, scale, causal, wl, wr, dt)
        o.backward(dout.to(dt))
        grads[name] = (o.detach(), lse_ref.detach(), qq.grad, kk.grad, vv.grad)
    ref, lowp = grads["ref"], grads["lowp"]
    finite = torch.isfinite(ref[1])
    ok = deterministic
    mine_all = (out, lse, dq, dk, dv)
    for idx, name in enumerate(("out", "lse", "dq", "dk", "dv")):
        mine = mine_all[idx]
        if name == "lse":
            # +inf rows (no visible key) must match exactly; compare the finite ones numerically.
            same_inf = torch.equal(torch.isinf(mine), ~finite)
            err = max_err(mine, ref[1], finite)
            base = max_err(lowp[1], ref[1], finite)
            nan = bool(torch.isnan(mine).any())
            passed = same_inf and not nan and err <= 2 * base + ATOL_SLACK
        else:
            nan = bool(torch.isnan(mine).any())
            err = max_err(mine, ref[idx])
            base = max_err(lowp[idx], ref[idx])
            passed = not nan and err <= 2 * base + ATOL_SLACK
        results[name] = {"err": err, "lowp_err": base, "nan": nan, "pass": passed}
        ok = ok and passed
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
    finite = torch.isfinite(ref[1])
    ok_all, results = True, {}
    for idx, name in enumerate(("out", "lse", "dq", "dk", "dv")):
        m = mine[idx]
        nan = bool(torch.isnan(m).any())
        if name == "lse":
            err, base = max_err(m, ref[1], finite), max_err(lowp[1], ref[1], finite)
            passed = torch.equal(torch.isinf(m), ~finite) and not nan and err <= 2 * base + ATOL_SLACK
        else:
            err, base = max_err(m, ref[idx]), max_err(lowp[idx], ref[idx])
            passed = not nan and err <= 2 * base + ATOL_SLACK
        results[name] = {"err": err, "lowp_err": base, "nan": nan, "pass": passed}
        ok_all = ok_all and passed
    return ok_all, results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 shapes per head dim instead of all")
    ap.add_argument("--json", help="write per-case results here")
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
            print(f"{'PASS' if ok else 'FAIL'} {str(dtype):14s} b,sq,sk,hq,hk,d,causal,wl,wr={case} "
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
