"""Attention dropout: the mask, read back from S_dmask, against a reference that applies the same
mask (criterion: reference.py), for the output and every gradient; the RNG's reproducibility and
its behaviour under CUDA-graph replay.

S_dmask holds the softmax probabilities with the dropped entries negated, so the sign bit is
the mask (``torch.signbit`` also reads a dropped 0 as dropped).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import flash_kernels as fk

from .params import call, maybe_gpu
from .reference import attention_grads_rounded, attention_ref, check_close

P = 0.17


def _kept(s_dmask, seqlen_q, seqlen_k):
    return ~torch.signbit(s_dmask[:, :, :seqlen_q, :seqlen_k])


def _dense_params():
    cpu_cases = [(torch.float16, 64, 113, 203, False, (2, 2), (-1, -1)),
                 (torch.float16, 40, 77, 77, True, (4, 2), (-1, -1)),
                 (torch.float32, 64, 17, 130, False, (2, 1), (30, 5))]
    for case in cpu_cases:
        yield maybe_gpu(*case, cpu=True)
    for dtype, head_dim, (sq, sk), causal in itertools.product(
            (torch.float16, torch.bfloat16), (64, 128), ((113, 203), (512, 512), (1, 239)), (False, True)):
        yield maybe_gpu(dtype, head_dim, sq, sk, causal, (8, 2), (-1, -1), cpu=False)
    yield maybe_gpu(torch.bfloat16, 256, 1024, 777, True, (4, 4), (-1, -1), cpu=False)
    for dtype, window in itertools.product((torch.float16, torch.bfloat16), ((64, 0), (100, 30))):
        yield maybe_gpu(dtype, 128, 300, 300, False, (4, 2), window, cpu=False)


@pytest.mark.parametrize("dtype,head_dim,seqlen_q,seqlen_k,causal,heads,window", list(_dense_params()))
def test_dropout_fwd_bwd(backend, device, dtype, head_dim, seqlen_q, seqlen_k, causal, heads, window):
    torch.manual_seed(seqlen_q * 7 + head_dim)
    batch, (nheads_q, nheads_k) = 2, heads
    q = torch.randn(batch, seqlen_q, nheads_q, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, seqlen_k, nheads_k, head_dim, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, seqlen_k, nheads_k, head_dim, device=device, dtype=dtype, requires_grad=True)
    out, lse, s_dmask = call(fk.flash_attn_func, q, k, v, dropout_p=P, causal=causal, window_size=window,
                             return_attn_probs=True)
    rows, cols = -(-seqlen_q // 128) * 128, -(-seqlen_k // 128) * 128
    assert s_dmask.shape == (batch, nheads_q, rows, cols) and s_dmask.dtype == dtype
    keep = _kept(s_dmask, seqlen_q, seqlen_k)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)

    ref_kwargs = dict(causal=causal, window=window, dropout_mask=keep, dropout_p=P)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out_ref, lse_ref = attention_ref(q32, k32, v32, **ref_kwargs)
    grads_ref = torch.autograd.grad(out_ref, (q32, k32, v32), g.float())
    out_pt, _ = attention_ref(q, k, v, upcast=False, **ref_kwargs)
    grads_pt = torch.autograd.grad(out_pt, (q, k, v), g)
    check_close("out", out, out_ref, out_pt, dtype)
    for name, ours, ref, pt in zip(("dq", "dk", "dv"), grads, grads_ref, grads_pt, strict=True):
        check_close(name, ours, ref, pt, dtype)
    # The lse is the softmax normaliser before dropout, as in flash_attn.
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isinf(lse), ~finite)
    assert (lse[finite] - lse_ref[finite]).abs().max().item() <= 1e-3 * max(1.0, lse_ref[finite].abs().max().item())

    # |S_dmask| is the softmax before dropout (same criterion); the padding past the sequences is 0.
    with torch.no_grad():
        _, _, probs_ref = attention_ref(q32, k32, v32, causal=causal, window=window, return_probs=True)
        _, _, probs_pt = attention_ref(q, k, v, causal=causal, window=window, upcast=False,
                                       return_probs=True)
    check_close("|S_dmask|", s_dmask[:, :, :seqlen_q, :seqlen_k].abs(), probs_ref, probs_pt, dtype)
    assert not s_dmask[:, :, seqlen_q:].any() and not s_dmask[:, :, :, seqlen_k:].any()
    visible = _visible(seqlen_q, seqlen_k, causal, window, device)

    # The mask is a fair coin of bias p over the visible entries (5 standard deviations).
    n = int(visible.sum().item()) * batch * nheads_q
    dropped = (~keep & visible).sum().item()
    assert abs(dropped - P * n) <= 5 * math.sqrt(n * P * (1 - P)) + 1, (dropped, n)


def _visible(seqlen_q, seqlen_k, causal, window, device):
    rows = torch.arange(seqlen_q, device=device)[:, None] + seqlen_k - seqlen_q
    cols = torch.arange(seqlen_k, device=device)[None, :]
    left, right = window
    if causal:
        right = 0
    ok = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= cols >= rows - left
    if right >= 0:
        ok &= cols <= rows + right
    return ok


def _varlen_params():
    yield maybe_gpu(torch.float16, 64, True, cpu=True)
    for dtype, causal in itertools.product((torch.float16, torch.bfloat16), (False, True)):
        yield maybe_gpu(dtype, 128, causal, cpu=False)


@pytest.mark.parametrize("dtype,head_dim,causal", list(_varlen_params()))
def test_dropout_varlen(backend, device, dtype, head_dim, causal):
    torch.manual_seed(head_dim + causal)
    seqlens_q, seqlens_k = [1, 70, 0, 37], [90, 70, 17, 1]
    cu_q = torch.tensor([0, *itertools.accumulate(seqlens_q)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *itertools.accumulate(seqlens_k)], dtype=torch.int32, device=device)
    q = torch.randn(sum(seqlens_q), 4, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(sum(seqlens_k), 2, head_dim, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(sum(seqlens_k), 2, head_dim, device=device, dtype=dtype, requires_grad=True)
    out, _, s_dmask = call(fk.flash_attn_varlen_func, q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                           dropout_p=P, causal=causal, return_attn_probs=True)
    assert s_dmask.shape == (len(seqlens_q), 4, 128, 128)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)

    def sequence(b, t, cu):
        return t[cu[b]:cu[b + 1]].unsqueeze(0)

    def kwargs(b):
        return dict(causal=causal, dropout_mask=_kept(s_dmask[b:b + 1], seqlens_q[b], seqlens_k[b]), dropout_p=P)

    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out_ref = torch.cat([attention_ref(sequence(b, q32, cu_q), sequence(b, k32, cu_k), sequence(b, v32, cu_k),
                                       **kwargs(b))[0][0] for b in range(len(seqlens_q))])
    grads_ref = torch.autograd.grad(out_ref, (q32, k32, v32), g.float())
    out_pt = torch.cat([attention_ref(sequence(b, q, cu_q), sequence(b, k, cu_k), sequence(b, v, cu_k), upcast=False,
                                      **kwargs(b))[0][0] for b in range(len(seqlens_q))])
    grads_pt = torch.autograd.grad(out_pt, (q, k, v), g)
    # Sequence 3 has one key: there autograd cancels exactly where FlashAttention's D = rowsum(dO * O)
    # rounds. The gradients' bound is twice the larger error of the two computations in low precision.
    per_seq = [attention_grads_rounded(sequence(b, q, cu_q).detach(), sequence(b, k, cu_k).detach(),
                                       sequence(b, v, cu_k).detach(), sequence(b, g, cu_q), **kwargs(b))
               for b in range(len(seqlens_q))]
    rounded = [torch.cat([gr[i][0] for gr in per_seq]) for i in range(3)]
    grads_pt = [max(pt, rd, key=lambda t, i=i: (t.float() - grads_ref[i]).abs().max().item())
                for i, (pt, rd) in enumerate(zip(grads_pt, rounded, strict=True))]
    check_close("out", out, out_ref, out_pt, dtype)
    for name, ours, ref, pt in zip(("dq", "dk", "dv"), grads, grads_ref, grads_pt, strict=True):
        check_close(name, ours, ref, pt, dtype)


def test_dropout_reproducible(backend, device):
    """The mask follows torch's generator: same seed, same bits; another seed, another mask."""
    q, k, v = (torch.randn(1, 70, 2, 64, device=device, dtype=torch.float16) for _ in range(3))

    def run(seed):
        torch.manual_seed(seed)
        return call(fk.flash_attn_func, q, k, v, dropout_p=0.3, return_attn_probs=True)

    out_a, _, s_a = run(11)
    out_b, _, s_b = run(11)
    out_c, _, s_c = run(12)
    assert torch.equal(out_a, out_b) and torch.equal(torch.signbit(s_a), torch.signbit(s_b))
    assert not torch.equal(torch.signbit(s_a), torch.signbit(s_c))
    assert not torch.equal(out_a, out_c)


@pytest.mark.gpu
def test_dropout_cuda_graph(backend, device):
    """Captured in a CUDA graph, each replay draws a new mask (the seed is a device tensor torch's
    generator refills), and each replay's output matches the reference built from that replay's
    own S_dmask: no host-side seed is baked into the graph."""
    torch.manual_seed(0)
    dtype = torch.bfloat16
    q, k, v = (torch.randn(2, 200, 4, 64, device=device, dtype=dtype) for _ in range(3))

    def step():
        return fk.flash_attn_func(q, k, v, dropout_p=P, causal=True, return_attn_probs=True)

    call(step)  # compile outside the capture (or skip when a forced backend cannot run it)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _, s_dmask = step()
    results = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        results.append((out.clone(), s_dmask.clone()))
    for out_r, s_r in results:
        keep = _kept(s_r, 200, 200)
        out_ref, _ = attention_ref(q, k, v, causal=True, dropout_mask=keep, dropout_p=P)
        out_pt, _ = attention_ref(q, k, v, causal=True, dropout_mask=keep, dropout_p=P, upcast=False)
        check_close("out", out_r, out_ref, out_pt, dtype)
    assert not torch.equal(torch.signbit(results[0][1]), torch.signbit(results[1][1])), \
        "two replays drew the same dropout mask"
