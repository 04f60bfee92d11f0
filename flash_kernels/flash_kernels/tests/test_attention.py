"""Numerics of every public entry point against the float32 reference (criterion: reference.py).

Shapes are chosen off the tile sizes (1, 17, 113, 203, 217, 239 ...). Cases that the CPU
interpreter can run quickly (fp16/fp32, small head dims) carry no mark; the rest are ``gpu``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import flash_kernels as fk

from .params import GPU
from .params import call as _call
from .params import maybe_gpu as _maybe_gpu
from .reference import attention_ref, check_close

CPU_DTYPES = (torch.float16, torch.float32)
CPU_HEAD_DIMS = (40, 64)
CPU_SEQLENS = ((1, 239), (113, 203), (128, 217), (17, 1), (239, 64))
CPU_FP32_SEQLENS = ((113, 203), (17, 1))
HEAD_DIMS = (40, 64, 80, 96, 128, 192, 256)
SEQLENS = (*CPU_SEQLENS, (512, 512), (1024, 777), (1, 2049))


def _inputs(device, dtype, batch, seqlen_q, seqlen_k, nheads_q, nheads_k, head_dim):
    torch.manual_seed(seqlen_q * 1000 + seqlen_k + head_dim)
    q = torch.randn(batch, seqlen_q, nheads_q, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, head_dim, device=device, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v)]


def _check_fwd_bwd(q, k, v, run, ref_kwargs, check_lse=None):
    """Compare out and dq/dk/dv of run(q, k, v) -> (out, lse) with the reference."""
    dtype = q.dtype
    out, lse = _call(run, q, k, v)
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out_ref, lse_ref = attention_ref(q32, k32, v32, **ref_kwargs)
    dq_ref, dk_ref, dv_ref = torch.autograd.grad(out_ref, (q32, k32, v32), g.float())
    out_pt, _ = attention_ref(q, k, v, upcast=False, **ref_kwargs)
    dq_pt, dk_pt, dv_pt = torch.autograd.grad(out_pt, (q, k, v), g)
    check_close("out", out, out_ref, out_pt, dtype)
    check_close("dq", dq, dq_ref, dq_pt, dtype)
    check_close("dk", dk, dk_ref, dk_pt, dtype)
    check_close("dv", dv, dv_ref, dv_pt, dtype)
    if check_lse is not None:
        lse_ours = check_lse(lse)
        finite = torch.isfinite(lse_ref)
        assert torch.equal(torch.isinf(lse_ours), ~finite), "lse: +inf must mark exactly the empty rows"
        assert (lse_ours[finite] - lse_ref[finite]).abs().max().item() <= 1e-3 * max(
            1.0, lse_ref[finite].abs().max().item())


def _dense_params():
    for dtype, hd, (sq, sk), causal in itertools.product(
            (torch.float16, torch.bfloat16, torch.float32), HEAD_DIMS, SEQLENS, (False, True)):
        if dtype == torch.float32 and hd not in CPU_HEAD_DIMS:
            continue  # fp32 is the interpreter tier's extra dtype, not a GPU target
        if dtype == torch.float32 and (hd != 64 or (sq, sk) not in CPU_FP32_SEQLENS):
            continue
        cpu = dtype in CPU_DTYPES and hd in CPU_HEAD_DIMS and (sq, sk) in CPU_SEQLENS
        yield _maybe_gpu(dtype, hd, sq, sk, causal, cpu=cpu)


@pytest.mark.parametrize("dtype,head_dim,seqlen_q,seqlen_k,causal", list(_dense_params()))
def test_flash_attn_func(backend, device, dtype, head_dim, seqlen_q, seqlen_k, causal):
    q, k, v = _inputs(device, dtype, 2, seqlen_q, seqlen_k, 2, 2, head_dim)

    def run(q, k, v):
        out, lse, s_dmask = fk.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
        assert s_dmask is None
        return out, lse

    _check_fwd_bwd(q, k, v, run, dict(causal=causal), check_lse=lambda lse: lse)


def _feature_params():
    cases = [
        ("window", dict(window=(16, 8))), ("window_left", dict(window=(40, -1))),
        ("window_right", dict(window=(-1, 5))), ("window_causal", dict(window=(24, -1), causal=True)),
        ("softcap", dict(softcap=1.5)), ("softcap_causal", dict(softcap=30.0, causal=True)),
        ("alibi", dict(alibi="heads")), ("alibi_batch_causal", dict(alibi="batch", causal=True)),
        ("gqa", dict(heads=(4, 2))), ("mqa_causal", dict(heads=(4, 1), causal=True)),
        ("scale", dict(softmax_scale=0.3)),
    ]
    for (name, feat), dtype, hd, (sq, sk) in itertools.product(
            cases, (torch.float16, torch.bfloat16), (64, 96, 128),
            ((113, 203), (203, 113), (1, 239), (1024, 1024))):
        cpu = dtype == torch.float16 and hd == 64 and (sq, sk) in ((113, 203), (1, 239))
        yield _maybe_gpu(name, feat, dtype, hd, sq, sk, cpu=cpu)


@pytest.mark.parametrize("name,feat,dtype,head_dim,seqlen_q,seqlen_k", list(_feature_params()))
def test_features(backend, device, name, feat, dtype, head_dim, seqlen_q, seqlen_k):
    nheads_q, nheads_k = feat.get("heads", (2, 2))
    q, k, v = _inputs(device, dtype, 2, seqlen_q, seqlen_k, nheads_q, nheads_k, head_dim)
    alibi = None
    if feat.get("alibi") == "heads":
        alibi = torch.rand(nheads_q, device=device) * 0.3
    elif feat.get("alibi") == "batch":
        alibi = torch.rand(2, nheads_q, device=device) * 0.3
    kwargs = dict(causal=feat.get("causal", False), window_size=feat.get("window", (-1, -1)),
                  softcap=feat.get("softcap", 0.0), alibi_slopes=alibi,
                  softmax_scale=feat.get("softmax_scale"))

    def run(q, k, v):
        out, lse, _ = fk.flash_attn_func(q, k, v, return_attn_probs=True, **kwargs)
        return out, lse

    ref_kwargs = dict(causal=kwargs["causal"], window=kwargs["window_size"],
                      softcap=kwargs["softcap"], alibi_slopes=alibi,
                      softmax_scale=kwargs["softmax_scale"])
    _check_fwd_bwd(q, k, v, run, ref_kwargs, check_lse=lambda lse: lse)


@pytest.mark.parametrize("packing", ["qkv", "kv"])
def test_packed(backend, device, packing):
    torch.manual_seed(3)
    dtype = torch.float16
    if packing == "qkv":
        qkv = torch.randn(2, 77, 3, 4, 64, device=device, dtype=dtype, requires_grad=True)
        out = _call(fk.flash_attn_qkvpacked_func, qkv, causal=True)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        q = torch.randn(2, 77, 4, 64, device=device, dtype=dtype)
        kv = torch.randn(2, 90, 2, 2, 64, device=device, dtype=dtype)
        out = _call(fk.flash_attn_kvpacked_func, q, kv, causal=True)
        k, v = kv[:, :, 0], kv[:, :, 1]
    out_ref, _ = attention_ref(q.detach().float(), k.detach().float(), v.detach().float(), causal=True)
    out_pt, _ = attention_ref(q.detach(), k.detach(), v.detach(), causal=True, upcast=False)
    check_close("out", out, out_ref, out_pt, dtype)
    if packing == "qkv":
        out.sum().backward()
        assert qkv.grad is not None and torch.isfinite(qkv.grad).all()


def _varlen_params():
    for dtype, hd, causal, heads, window in itertools.product(
            (torch.float16, torch.bfloat16), (40, 64, 128), (False, True), ((2, 2), (4, 2)),
            ((-1, -1), (20, 10))):
        cpu = dtype == torch.float16 and hd == 64 and window == (-1, -1)
        yield _maybe_gpu(dtype, hd, causal, heads, window, cpu=cpu)


@pytest.mark.parametrize("dtype,head_dim,causal,heads,window", list(_varlen_params()))
def test_varlen(backend, device, dtype, head_dim, causal, heads, window):
    torch.manual_seed(head_dim)
    seqlens_q = [1, 113, 0, 37, 64]
    seqlens_k = [239, 90, 17, 37, 1]
    nheads_q, nheads_k = heads
    cu_q = torch.tensor([0, *list(itertools.accumulate(seqlens_q))], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *list(itertools.accumulate(seqlens_k))], dtype=torch.int32, device=device)
    q = torch.randn(sum(seqlens_q), nheads_q, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(sum(seqlens_k), nheads_k, head_dim, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(sum(seqlens_k), nheads_k, head_dim, device=device, dtype=dtype, requires_grad=True)

    out, lse, _ = _call(fk.flash_attn_varlen_func, q, k, v, cu_q, cu_k, max(seqlens_q),
                        max(seqlens_k), causal=causal, window_size=window, return_attn_probs=True)
    assert lse.shape == (nheads_q, sum(seqlens_q))
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)

    def per_sequence(q, k, v, upcast):
        outs = []
        for i in range(len(seqlens_q)):
            qs = q[cu_q[i]:cu_q[i + 1]].unsqueeze(0)
            ks = k[cu_k[i]:cu_k[i + 1]].unsqueeze(0)
            vs = v[cu_k[i]:cu_k[i + 1]].unsqueeze(0)
            outs.append(attention_ref(qs, ks, vs, causal=causal, window=window, upcast=upcast)[0][0])
        return torch.cat(outs)

    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out_ref = per_sequence(q32, k32, v32, True)
    grads_ref = torch.autograd.grad(out_ref, (q32, k32, v32), g.float())
    out_pt = per_sequence(q, k, v, False)
    grads_pt = torch.autograd.grad(out_pt, (q, k, v), g)
    check_close("out", out, out_ref, out_pt, dtype)
    for name, a, r, p in zip(("dq", "dk", "dv"), grads, grads_ref, grads_pt):
        check_close(name, a, r, p, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=GPU)])
def test_deterministic_backward(backend, device, dtype):
    """deterministic=True promises bitwise-equal gradients across runs."""
    q, k, v = _inputs(device, dtype, 2, 150, 250, 4, 2, 64)
    g = torch.randn(2, 150, 4, 64, device=device, dtype=dtype)
    results = []
    for _ in range(3):
        out = _call(fk.flash_attn_func, q, k, v, causal=True, deterministic=True)
        results.append(torch.autograd.grad(out, (q, k, v), g))
    for later in results[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), results[0], later):
            assert torch.equal(a, b), f"{name} differs between runs with deterministic=True"


@GPU
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_deterministic_backward_many_blocks(backend, device, causal, head_dim):
    """Bitwise-equal gradients when 17 key blocks add to every dQ tile and the blocks run in more than one
    wave: the Hopper CUDA backward up to head dim 128 sums dQ tiles in a float32 workspace, in a fixed order."""
    q, k, v = _inputs(device, torch.bfloat16, 3, 2047, 2100, 8, 4, head_dim)
    g = torch.randn(3, 2047, 8, head_dim, device=device, dtype=torch.bfloat16)
    results = [torch.autograd.grad(_call(fk.flash_attn_func, q, k, v, causal=causal), (q, k, v), g)
               for _ in range(3)]
    for later in results[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), results[0], later):
            assert torch.equal(a, b), f"{name} differs between runs"


def test_torch_compile_fullgraph(backend, device):
    """A small attention block compiles with fullgraph=True and matches eager, with grads."""
    torch.manual_seed(0)
    dtype = torch.float16
    proj = torch.nn.Linear(64, 3 * 64, device=device, dtype=dtype)

    def block(x):
        qkv = proj(x).view(x.shape[0], x.shape[1], 3, 2, 32)
        out = fk.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
        return out.reshape(x.shape[0], x.shape[1], 64).float().square().mean()

    # The interpreter tier has no C++ compiler guarantee, so it traces through aot_eager
    # (same fake-tensor and autograd registration paths); the GPU tier uses inductor.
    compiled = torch.compile(block, fullgraph=True,
                             backend="aot_eager" if device.type == "cpu" else "inductor")
    x = torch.randn(2, 50, 64, device=device, dtype=dtype)
    loss_eager = _call(block, x)
    grads_eager = torch.autograd.grad(loss_eager, list(proj.parameters()))
    loss_compiled = _call(compiled, x)
    grads_compiled = torch.autograd.grad(loss_compiled, list(proj.parameters()))
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-3, atol=1e-4)
    for a, b in zip(grads_compiled, grads_eager):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)
