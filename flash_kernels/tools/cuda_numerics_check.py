"""Numerics of the CUDA ops (torch.ops.flash_kernels_cuda) against a float32 reference, on a GPU.

Criterion (flash-attention's): for out, lse, dq, dk, dv,
    max|cuda - ref32| <= 2 * max|lowp - ref32| + ATOL_SLACK
where lowp is the same attention computed by PyTorch in the input dtype (fp16/bf16 matmuls and
softmax) and ref32 in float32 from the same inputs. Outputs are poisoned first: the allocator's blocks
of the output sizes are NaN-filled and freed, so an element the kernel forgets to write shows as NaN.
The backward is run twice and must be bit-identical (it has no atomics).

    python tools/cuda_numerics_check.py [--quick] [--json PATH]

Exit code: 0 all cases pass, 1 any case fails, 2 the extension is not built / no GPU.
"""

from __future__ import annotations

import argparse
import json
import math
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


def run_case(case, dtype, device):
    b, sq, sk, hq, hk, d, causal, wl, wr = case
    torch.manual_seed(hash(case) % (2**31))
    q = torch.randn(b, sq, hq, d, device=device, dtype=dtype)
    k = torch.randn(b, sk, hk, d, device=device, dtype=dtype)
    v = torch.randn(b, sk, hk, d, device=device, dtype=dtype)
    dout = torch.randn(b, sq, hq, d, device=device, dtype=dtype)
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
    for dtype in (torch.float16, torch.bfloat16):
        for case in cases(args.quick, _cuda.compiled_head_dims()):
            ok, det, res = run_case(case, dtype, device)
            failures += not ok
            rows.append({"case": case, "dtype": str(dtype), "pass": ok, "deterministic": det, "results": res})
            worst = max(res.items(), key=lambda kv: kv[1]["err"] / (2 * kv[1]["lowp_err"] + 1e-5))
            print(f"{'PASS' if ok else 'FAIL'} {str(dtype):14s} b,sq,sk,hq,hk,d,causal,wl,wr={case} "
                  f"det={det} worst={worst[0]} err={worst[1]['err']:.2e} lowp={worst[1]['lowp_err']:.2e}"
                  + ("" if ok else f" {json.dumps(res)}"), flush=True)
    print(f"{len(rows) - failures}/{len(rows)} cases passed in {time.time() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
