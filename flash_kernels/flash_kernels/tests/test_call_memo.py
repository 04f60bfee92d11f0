"""The host checks run once per call signature, and skipping them changes nothing a caller sees.

Each test makes the checks fail if they run again (or counts them), so a memo that stopped serving
or served the wrong signature fails here; the numerics of the cached path are the suite's other
tests, which all go through it.
"""

from __future__ import annotations

import pytest
import torch

import flash_kernels as fk
from flash_kernels import call_memo, dispatch, ops
from flash_kernels.errors import UnsupportedInputError


@pytest.fixture(autouse=True)
def fresh_memo():
    call_memo.clear()
    yield
    call_memo.clear()


@pytest.fixture
def counted_checks(monkeypatch):
    """How many times check_qkv ran (the first check of every entry point)."""
    calls = []
    real = dispatch.check_qkv

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "check_qkv", counting)
    return calls


def _qkv(device, b=2, s=33, h=4, hk=2, d=64, dtype=torch.float16):
    torch.manual_seed(0)
    return (torch.randn(b, s, h, d, device=device, dtype=dtype),
            torch.randn(b, s, hk, d, device=device, dtype=dtype),
            torch.randn(b, s, hk, d, device=device, dtype=dtype))


def test_repeated_call_skips_checks(device, monkeypatch):
    q, k, v = _qkv(device)
    first = fk.flash_attn_func(q, k, v, causal=True)

    def must_not_run(*args, **kwargs):
        raise AssertionError("a check ran for a signature already seen")

    for name in ("check_qkv", "check_options", "choose_backend"):
        monkeypatch.setattr(dispatch, name, must_not_run)
    q2, k2, v2 = (t.clone() for t in (q, k, v))  # new storage, same signature
    assert torch.equal(fk.flash_attn_func(q2, k2, v2, causal=True), first)
    with pytest.raises(AssertionError, match="already seen"):
        fk.flash_attn_func(q, k, v, causal=False)  # another option: checked again


def test_kvcache_and_varlen_repeat_skip_checks(device, counted_checks):
    q, _k, _v = _qkv(device, s=1)
    cache_k, cache_v = (torch.randn(2, 40, 2, 64, device=device, dtype=torch.float16) for _ in range(2))
    lengths = torch.tensor([7, 30], dtype=torch.int32, device=device)
    for _ in range(3):
        fk.flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=lengths)
    assert len(counted_checks) == 1
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    qv, kv, vv = (t[0, :1].expand(12, -1, -1).contiguous() for t in _qkv(device))
    for _ in range(3):
        fk.flash_attn_varlen_func(qv, kv, vv, cu, cu, 7, 7)
    assert len(counted_checks) == 2


def test_failed_check_is_not_remembered(device):
    q, k, v = _qkv(device)
    for _ in range(2):
        with pytest.raises(UnsupportedInputError, match="window_size"):
            fk.flash_attn_func(q, k, v, window_size=(1, 2, 3))
    with pytest.raises(UnsupportedInputError, match="dropout_p"):
        fk.flash_attn_func(q, k, v, dropout_p=1.5)
    assert not call_memo._plans


def test_backend_variable_is_part_of_the_signature(device, monkeypatch):
    q, k, v = _qkv(device)
    monkeypatch.setenv("FLASH_KERNELS_BACKEND", "triton")
    fk.flash_attn_func(q, k, v)
    monkeypatch.setenv("FLASH_KERNELS_BACKEND", "no-such-backend")
    with pytest.raises(UnsupportedInputError, match="FLASH_KERNELS_BACKEND"):
        fk.flash_attn_func(q, k, v)


def test_layout_is_part_of_the_signature(device, counted_checks):
    q, k, v = _qkv(device)
    fk.flash_attn_func(q, k, v)
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides
    out = fk.flash_attn_func(strided, k, v)
    assert len(counted_checks) == 2
    assert torch.equal(out, fk.flash_attn_func(q, k, v))
    assert len(counted_checks) == 2


def test_unkeyable_calls_are_checked_every_time(device, counted_checks):
    class Marked(torch.Tensor):
        pass

    np = pytest.importorskip("numpy")
    q, k, v = _qkv(device)
    want = fk.flash_attn_func(q, k, v, window_size=(8, 0))
    for _ in range(2):
        assert torch.equal(fk.flash_attn_func(q, k, v, window_size=[8, 0]), want)  # a list
        assert torch.equal(fk.flash_attn_func(q, k, v, window_size=(8, 0), softcap=np.float64(0)), want)
    assert len(counted_checks) == 5  # the first call once, then every unkeyable call
    assert call_memo.signature("func", (q.as_subclass(Marked), k, v), ()) is None
    assert call_memo.signature("func", (q, k, v), (torch.tensor(1.0),)) is None


def test_memo_is_bounded(device, monkeypatch):
    monkeypatch.setattr(call_memo, "LIMIT", 3)
    for s in range(5, 12):
        fk.flash_attn_func(*_qkv(device, s=s))
        assert 1 <= len(call_memo._plans) <= 3


def test_grad_and_no_grad_outputs_equal(device):
    q, k, v = _qkv(device)
    with torch.no_grad():
        want = fk.flash_attn_func(q, k, v, causal=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fk.flash_attn_func(*leaves, causal=True)
    assert out.requires_grad and torch.equal(out.detach(), want)


@pytest.mark.parametrize("form", ["dense", "varlen"])
def test_eager_gradients_equal_the_registered_ops(device, form):
    """The eager autograd Functions and the torch.library ops share their bodies and backward
    formula: outputs and every gradient agree bit for bit."""
    q, k, v = _qkv(device)
    dout = torch.randn_like(q)
    scale = 64 ** -0.5
    if form == "varlen":
        q, k, v, dout = (t.flatten(0, 1) for t in (q, k, v, dout))
        cu = torch.tensor([0, 33, 66], dtype=torch.int32, device=device)
        tail = (scale, -1, 0, 0.0, None, 0.0, None, False, "triton")
        registered = lambda *t: ops.attn_varlen_fwd(*t, cu, cu, 33, 33, *tail)  # noqa: E731
        eager = lambda *t: ops.VarlenAttention.apply(*t, cu, cu, 33, 33, *tail)  # noqa: E731
    else:
        tail = (scale, -1, 0, 0.0, None, 0.0, None, False, "triton")
        registered = lambda *t: ops.attn_fwd(*t, *tail)  # noqa: E731
        eager = lambda *t: ops.DenseAttention.apply(*t, *tail)  # noqa: E731
    results = []
    for run in (registered, eager):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = run(*leaves)
        out.backward(dout)
        results.append([out.detach(), lse] + [t.grad for t in leaves])
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(a, b), name


def test_strided_last_dim_runs_on_every_backend(backend, device):
    """A last dim with a stride is copied before the kernels; the backend is judged on that copy,
    so a forced CUDA backend takes the call instead of refusing the strided original."""
    q, k, v = _qkv(device)
    wide = [torch.stack((t, torch.full_like(t, float("nan"))), dim=-1).flatten(-2) for t in (q, k, v)]
    strided = [t[..., ::2] for t in wide]
    assert strided[0].stride(-1) == 2 and torch.equal(strided[0], q)
    want = fk.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(fk.flash_attn_func(*strided, causal=True), want)
