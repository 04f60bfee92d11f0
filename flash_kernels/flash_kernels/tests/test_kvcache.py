"""flash_attn_with_kvcache and paged varlen against the float32 reference (criterion: reference.py).

Every case builds the cache a sequence sees as one logical (capacity, heads, dim) row -- from a
dense cache row, a cache_batch_idx row or the pages of its block table -- and checks, after the
call: the output and lse against attention over that logical row, the appended keys (rotated)
and values in place, and every other slot and page untouched. Slots no sequence owns, slots
before cache_leftpad and unused pages hold NaN, so a kernel that reads one returns NaN.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import pytest
import torch

import flash_kernels as fk
from flash_kernels.errors import UnsupportedInputError

from .params import call, maybe_gpu
from .reference import HALF_ULP, attention_ref, check_close, rotary_ref

LENGTHS = (37, 0, 150)  # cached keys per sequence before the call
LEFTPAD = (5, 0, 77)
CACHE_LEN = 211  # dense cache length; paged capacity rounds it up to whole pages
SENTINEL = 7.0  # NaN slots compared as this value


@dataclass(frozen=True)
class CacheCase:
    layout: str = "dense"  # dense | batch_idx | paged
    page_size: int = 0
    seqlen_q: int = 1
    seqlen_new: int = 1
    heads: tuple = (8, 2)
    causal: bool = False
    window: tuple = (-1, -1)
    leftpad: bool = False
    rotary: str = ""  # "" | interleaved | neox
    rotary_half: bool = False  # rotary_dim = head_dim / 2 instead of head_dim
    softcap: float = 0.0
    alibi: bool = False
    num_splits: int = 0

    def __str__(self) -> str:
        parts = [self.layout + (str(self.page_size) if self.page_size else ""),
                 f"q{self.seqlen_q}", f"new{self.seqlen_new}", f"h{self.heads[0]}-{self.heads[1]}"]
        flags = [("causal", self.causal), (f"win{self.window[0]}-{self.window[1]}", self.window != (-1, -1)),
                 ("leftpad", self.leftpad), (f"rot-{self.rotary}{'-half' if self.rotary_half else ''}",
                                             bool(self.rotary)),
                 (f"softcap{self.softcap}", self.softcap > 0), ("alibi", self.alibi),
                 (f"splits{self.num_splits}", self.num_splits != 0)]
        return "-".join(parts + [name for name, on in flags if on])


CPU_CASES = [
    CacheCase(causal=True),
    CacheCase(layout="batch_idx", seqlen_q=4, seqlen_new=3, heads=(4, 4), num_splits=3),
    CacheCase(layout="paged", page_size=16, causal=True),
    CacheCase(layout="paged", page_size=64, seqlen_new=0),
    CacheCase(layout="paged", page_size=256, seqlen_q=23, seqlen_new=23, causal=True),
    CacheCase(layout="paged", page_size=16, seqlen_q=23, seqlen_new=23, window=(32, 0)),
    CacheCase(leftpad=True, causal=True),
    CacheCase(layout="paged", page_size=64, seqlen_new=2, seqlen_q=2, leftpad=True, causal=True),
    CacheCase(rotary="interleaved", causal=True),
    CacheCase(rotary="neox", rotary_half=True, seqlen_q=4, seqlen_new=4),
    CacheCase(layout="paged", page_size=16, seqlen_q=23, seqlen_new=23, causal=True, rotary="neox",
              rotary_half=True),
    CacheCase(layout="batch_idx", seqlen_q=2, seqlen_new=2, leftpad=True, causal=True,
              rotary="interleaved", rotary_half=True),
    CacheCase(softcap=2.5, causal=True),
    CacheCase(layout="paged", page_size=64, alibi=True, causal=True),
    CacheCase(window=(16, 0), num_splits=3),
    CacheCase(layout="paged", page_size=16, heads=(4, 1), num_splits=1, seqlen_new=0),
]
GPU_EXTRA = [
    CacheCase(layout="paged", page_size=128, seqlen_q=1, seqlen_new=1, heads=(32, 8), causal=True,
              rotary="neox"),
    CacheCase(layout="paged", page_size=32, seqlen_q=64, seqlen_new=64, causal=True, leftpad=True,
              rotary="interleaved", softcap=5.0),
    CacheCase(layout="batch_idx", seqlen_q=5, seqlen_new=0, window=(40, 3), alibi=True),
    CacheCase(layout="paged", page_size=48, seqlen_q=3, seqlen_new=3, causal=True, num_splits=4),
]


def _kvcache_params():
    for case in CPU_CASES:
        yield maybe_gpu(case, torch.float16, 64, cpu=True, id=f"{case}-fp16-64")
    gpu = [(case, dtype, head_dim) for case, dtype, head_dim in
           itertools.product(CPU_CASES + GPU_EXTRA, (torch.float16, torch.bfloat16), (64, 128))
           if not (dtype == torch.float16 and head_dim == 64 and case in CPU_CASES)]
    # Head dims off the power-of-2 tiles and the largest one, on the GPU-only cases.
    gpu += [(case, torch.bfloat16, head_dim) for case in GPU_EXTRA for head_dim in (80, 256)]
    for case, dtype, head_dim in gpu:
        yield maybe_gpu(case, dtype, head_dim, cpu=False, id=f"{case}-{str(dtype)[6:]}-{head_dim}")
    yield maybe_gpu(CacheCase(layout="paged", page_size=16, causal=True, rotary="neox"), torch.float16,
                    40, cpu=True, id="paged16-hd40-rot")


class Cache:
    """A KV cache in one of the three layouts, with its logical (batch, capacity, h, d) view."""

    def __init__(self, case: CacheCase, batch: int, nheads_k: int, head_dim: int, dtype, device):
        self.case = case
        self.batch = batch
        nan = float("nan")
        if case.layout == "paged":
            pages_per_seq = -(-CACHE_LEN // case.page_size)
            self.capacity = pages_per_seq * case.page_size
            num_pages = batch * pages_per_seq + 3  # spare pages nobody owns
            self.k = torch.full((num_pages, case.page_size, nheads_k, head_dim), nan, dtype=dtype, device=device)
            perm = torch.randperm(num_pages, device=device)[:batch * pages_per_seq]
            self.block_table = perm.view(batch, pages_per_seq).to(torch.int32)
            self.batch_idx = None
        else:
            self.capacity = CACHE_LEN
            rows = batch + 1 if case.layout == "batch_idx" else batch  # + a row nobody owns
            self.k = torch.full((rows, CACHE_LEN, nheads_k, head_dim), nan, dtype=dtype, device=device)
            self.block_table = None
            self.batch_idx = (torch.tensor([2, 0, 3], dtype=torch.int32, device=device)
                              if case.layout == "batch_idx" else None)
        self.v = self.k.clone()

    def logical(self, t):
        """(batch, capacity, h, d) view of a cache tensor, as each sequence sees it (a copy)."""
        if self.block_table is not None:
            pages = t[self.block_table.long()]  # (batch, pages, page_size, h, d)
            return pages.flatten(1, 2)
        if self.batch_idx is not None:
            return t[self.batch_idx.long()]
        return t[: self.batch].clone()

    def write(self, t, b, start, values):
        """Write values (n, h, d) at logical positions start.. of sequence b."""
        for j in range(values.shape[0]):
            p = start + j
            if self.block_table is not None:
                page = int(self.block_table[b, p // self.case.page_size])
                t[page, p % self.case.page_size] = values[j]
            else:
                row = int(self.batch_idx[b]) if self.batch_idx is not None else b
                t[row, p] = values[j]


def _same(a, b):
    return torch.equal(a.nan_to_num(SENTINEL), b.nan_to_num(SENTINEL))


@pytest.mark.parametrize("case,dtype,head_dim", list(_kvcache_params()))
def test_kvcache(backend, device, case, dtype, head_dim):
    torch.manual_seed(len(str(case)) * 31 + head_dim)
    batch = 3
    nheads_q, nheads_k = case.heads
    cache = Cache(case, batch, nheads_k, head_dim, dtype, device)
    lengths = torch.tensor(LENGTHS, dtype=torch.int32, device=device)
    leftpad = torch.tensor(LEFTPAD, dtype=torch.int32, device=device) if case.leftpad else None
    for b in range(batch):
        lo = LEFTPAD[b] if case.leftpad else 0
        n = LENGTHS[b] - lo
        cache.write(cache.k, b, lo, torch.randn(n, nheads_k, head_dim, device=device, dtype=dtype))
        cache.write(cache.v, b, lo, torch.randn(n, nheads_k, head_dim, device=device, dtype=dtype))
    q = torch.randn(batch, case.seqlen_q, nheads_q, head_dim, device=device, dtype=dtype)
    k_new = v_new = None
    if case.seqlen_new:
        k_new = torch.randn(batch, case.seqlen_new, nheads_k, head_dim, device=device, dtype=dtype)
        v_new = torch.randn(batch, case.seqlen_new, nheads_k, head_dim, device=device, dtype=dtype)
    cos = sin = None
    if case.rotary:
        rotary_dim = head_dim // 2 if case.rotary_half else head_dim
        rotary_dim -= rotary_dim % 2
        angle = torch.rand(cache.capacity, rotary_dim // 2, device=device) * 2 * torch.pi
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
    alibi = torch.rand(batch, nheads_q, device=device) * 0.3 if case.alibi else None

    # The expected cache (logical view), and the inputs of the two references: rotary in fp32
    # unrounded (ref32) and in the test dtype throughout (pt), so that the criterion covers rotary
    # and attention as one computation, as flash-attention's criterion asks.
    interleaved = case.rotary == "interleaved"
    k_expect, v_expect = cache.logical(cache.k).clone(), cache.logical(cache.v).clone()
    k_pool_before, v_pool_before = cache.k.clone(), cache.v.clone()
    local = case.causal or case.window != (-1, -1)
    q_ref = q_pt = q
    if case.rotary:
        offsets = torch.arange(case.seqlen_q, device=device) if local else torch.zeros(
            case.seqlen_q, dtype=torch.long, device=device)
        q_positions = lengths.long()[:, None] + offsets
        q_ref = rotary_ref(q, cos, sin, q_positions, interleaved)
        q_pt = rotary_ref(q, cos, sin, q_positions, interleaved, upcast=False)
    k_ref_expect, k_pt_expect = k_expect.float(), k_expect.clone()
    if k_new is not None:
        positions = lengths.long()[:, None] + torch.arange(case.seqlen_new, device=device)
        k_rot32 = rotary_ref(k_new, cos, sin, positions, interleaved) if case.rotary else k_new.float()
        k_rot_pt = (rotary_ref(k_new, cos, sin, positions, interleaved, upcast=False) if case.rotary
                    else k_new)
        for b in range(batch):
            n = LENGTHS[b]
            k_expect[b, n:n + case.seqlen_new] = k_rot32[b].to(dtype)
            k_ref_expect[b, n:n + case.seqlen_new] = k_rot32[b]
            k_pt_expect[b, n:n + case.seqlen_new] = k_rot_pt[b]
            v_expect[b, n:n + case.seqlen_new] = v_new[b]

    out, lse = call(fk.flash_attn_with_kvcache, q, cache.k, cache.v, k_new, v_new, rotary_cos=cos,
                    rotary_sin=sin, cache_seqlens=lengths, cache_batch_idx=cache.batch_idx,
                    cache_leftpad=leftpad, block_table=cache.block_table, causal=case.causal,
                    window_size=case.window, softcap=case.softcap, rotary_interleaved=interleaved,
                    alibi_slopes=alibi, num_splits=case.num_splits, return_softmax_lse=True)

    k_after, v_after = cache.logical(cache.k), cache.logical(cache.v)
    if case.rotary:
        # fp32 arithmetic rounded once on both sides; FMA contraction may move the last bit.
        torch.testing.assert_close(k_after.nan_to_num(SENTINEL), k_expect.nan_to_num(SENTINEL),
                                   rtol=4 * HALF_ULP[dtype], atol=HALF_ULP[dtype],
                                   msg="rotated k not appended")
    else:
        assert _same(k_after, k_expect), "k not appended in place (or other slots changed)"
    assert _same(v_after, v_expect), "v not appended in place (or other slots changed)"
    owned = torch.zeros(cache.k.shape[0], dtype=torch.bool, device=device)
    owned[(cache.block_table if cache.block_table is not None else
           cache.batch_idx if cache.batch_idx is not None else torch.arange(batch, device=device)).long()
          .flatten()] = True
    assert _same(cache.k[~owned], k_pool_before[~owned]), "a cache row/page nobody owns changed"
    assert _same(cache.v[~owned], v_pool_before[~owned]), "a cache row/page nobody owns changed"

    seqlens_k = lengths + case.seqlen_new
    ref_kwargs = dict(causal=case.causal, window=case.window, softcap=case.softcap,
                      alibi_slopes=alibi, seqlens_k=seqlens_k, key_leftpad=leftpad)
    v_ref = v_expect.nan_to_num(0.0)
    out_ref, lse_ref = attention_ref(q_ref, k_ref_expect.nan_to_num(0.0), v_ref, **ref_kwargs)
    out_pt, lse_pt = attention_ref(q_pt, k_pt_expect.nan_to_num(0.0), v_ref, upcast=False, **ref_kwargs)
    check_close("out", out, out_ref, out_pt, dtype)
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isinf(lse), ~finite), "lse: +inf must mark exactly the empty rows"
    # The same criterion as the output: q and the appended k are rotated and rounded to the input
    # dtype before the scores, so the lse carries that rounding on every backend (and on torch's).
    check_close("lse", lse[finite], lse_ref[finite], lse_pt[finite], dtype)


def test_kvcache_seqlens_past_cache_end(backend, device):
    """Without an append, a cache_seqlens past the cache end reads as the cache length."""
    torch.manual_seed(5)
    q = torch.randn(2, 1, 4, 64, device=device, dtype=torch.float16)
    k_cache = torch.randn(2, 150, 2, 64, device=device, dtype=torch.float16)
    v_cache = torch.randn(2, 150, 2, 64, device=device, dtype=torch.float16)
    too_long = torch.tensor([150, 999], dtype=torch.int32, device=device)
    out = call(fk.flash_attn_with_kvcache, q, k_cache, v_cache, cache_seqlens=too_long)
    out_ref, _ = attention_ref(q, k_cache, v_cache)
    out_pt, _ = attention_ref(q, k_cache, v_cache, upcast=False)
    check_close("out", out, out_ref, out_pt, torch.float16)


def _paged_pools(keys, values, page_size, device):
    """Scatter per-sequence keys and values (lists of (n_b, h, d)) into shuffled pools of NaN
    pages under one block table (with a spare column and spare pages nobody reads)."""
    pages = [-(-k.shape[0] // page_size) for k in keys]
    num_pages = sum(pages) + 2
    h, d = keys[0].shape[1:]
    k_pool = torch.full((num_pages, page_size, h, d), float("nan"), dtype=keys[0].dtype, device=device)
    v_pool = k_pool.clone()
    order = torch.randperm(num_pages).tolist()
    table = torch.full((len(keys), max(pages) + 1), -1, dtype=torch.int32, device=device)
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        for p in range(pages[b]):
            page = order.pop()
            table[b, p] = page
            rows = slice(p * page_size, (p + 1) * page_size)
            k_pool[page, :k[rows].shape[0]] = k[rows]
            v_pool[page, :v[rows].shape[0]] = v[rows]
    return k_pool, v_pool, table


def _paged_varlen_params():
    yield maybe_gpu(torch.float16, 64, 16, True, (4, 2), cpu=True)
    yield maybe_gpu(torch.float16, 64, 64, False, (2, 2), cpu=True)
    for head_dim, page in itertools.product((64, 128, 256), (16, 64, 256)):
        yield maybe_gpu(torch.bfloat16, head_dim, page, True, (8, 2), cpu=False)
    yield maybe_gpu(torch.float16, 128, 32, False, (8, 8), cpu=False)


@pytest.mark.parametrize("dtype,head_dim,page_size,causal,heads", list(_paged_varlen_params()))
def test_paged_varlen(backend, device, dtype, head_dim, page_size, causal, heads):
    torch.manual_seed(page_size + head_dim)
    seqlens_q = [1, 113, 0, 37, 5]
    seqlens_k = [239, 130, 17, 37, 1]
    nheads_q, nheads_k = heads
    cu_q = torch.tensor([0, *itertools.accumulate(seqlens_q)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *itertools.accumulate(seqlens_k)], dtype=torch.int32, device=device)
    q = torch.randn(sum(seqlens_q), nheads_q, head_dim, device=device, dtype=dtype)
    keys = [torch.randn(n, nheads_k, head_dim, device=device, dtype=dtype) for n in seqlens_k]
    values = [torch.randn(n, nheads_k, head_dim, device=device, dtype=dtype) for n in seqlens_k]
    k_pool, v_pool, table = _paged_pools(keys, values, page_size, device)

    with torch.no_grad():
        out, lse, _ = call(fk.flash_attn_varlen_func, q, k_pool, v_pool, cu_q, cu_k, max(seqlens_q),
                           max(seqlens_k), causal=causal, return_attn_probs=True, block_table=table)
    assert lse.shape == (nheads_q, sum(seqlens_q))

    def per_sequence(upcast):
        outs = []
        for b in range(len(seqlens_q)):
            qs = q[cu_q[b]:cu_q[b + 1]].unsqueeze(0)
            outs.append(attention_ref(qs, keys[b].unsqueeze(0), values[b].unsqueeze(0), causal=causal,
                                      upcast=upcast)[0][0])
        return torch.cat(outs)

    check_close("out", out, per_sequence(True), per_sequence(False), dtype)


def test_paged_varlen_grad_inputs(backend, device):
    """As in flash_attn: the paged forward runs on inputs that require grad (evaluation inside a
    training loop) and gives the no-grad output; only a backward through it raises."""
    torch.manual_seed(3)
    q = torch.randn(5, 4, 64, device=device, dtype=torch.float16)
    pool = torch.randn(3, 16, 2, 64, device=device, dtype=torch.float16)
    cu_q = torch.tensor([0, 5], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 40], dtype=torch.int32, device=device)
    table = torch.tensor([[2, 0, 1]], dtype=torch.int32, device=device)
    with torch.no_grad():
        want = fk.flash_attn_varlen_func(q, pool, pool, cu_q, cu_k, 5, 40, block_table=table)
    q_grad, pool_grad = q.clone().requires_grad_(), pool.clone().requires_grad_()
    out = fk.flash_attn_varlen_func(q_grad, pool_grad, pool_grad, cu_q, cu_k, 5, 40, block_table=table)
    assert out.requires_grad
    assert torch.equal(out.detach(), want)
    with pytest.raises(NotImplementedError, match="no backward"):
        out.sum().backward()


@pytest.mark.parametrize("append", [False, True])
def test_kvcache_paged_block_table_bound(backend, device, append):
    """flash_attn #2711: keys past the pages block_table addresses raise a RuntimeError naming
    block_table (and what to allocate), before any kernel runs; exactly at capacity is fine."""
    torch.manual_seed(4)
    page, heads, d = 16, 2, 64
    pool_k = torch.randn(4, page, heads, d, device=device, dtype=torch.float16)
    pool_v = torch.randn_like(pool_k)
    table = torch.zeros(1, 1, dtype=torch.int32, device=device)  # one column: 16 keys
    q = torch.randn(1, 1, heads, d, device=device, dtype=torch.float16)
    new = dict(k=torch.randn(1, 1, heads, d, device=device, dtype=torch.float16),
               v=torch.randn(1, 1, heads, d, device=device, dtype=torch.float16)) if append else {}
    too_many = torch.tensor([page if append else page + 1], dtype=torch.int32, device=device)
    before = pool_k.clone(), pool_v.clone()
    with pytest.raises(RuntimeError, match="block_table") as raised:
        fk.flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=too_many, block_table=table, **new)
    assert isinstance(raised.value, fk.CacheCapacityError)
    assert isinstance(raised.value, UnsupportedInputError)
    assert "allocate at least 2 columns" in str(raised.value)
    assert torch.equal(pool_k, before[0]) and torch.equal(pool_v, before[1]), "refused call wrote the cache"
    at_capacity = torch.tensor([page], dtype=torch.int32, device=device)
    out = fk.flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=at_capacity, block_table=table)
    assert out.shape == q.shape and not out.isnan().any()


def test_kvcache_bad_page_id(backend, device):
    """Decode with an out-of-range page id (not checked on the host: that would cost a sync per step).
    Both backends read nothing outside the page pool and leave the other sequences bit-for-bit
    unchanged; the bad sequence's output is NaN on Triton and computed with zeros for the missing
    page on CUDA (README: "Out-of-range page ids"). Appending through a bad page is an error."""
    torch.manual_seed(9)
    page, pages_per_seq, batch = 16, 4, 2
    pool_k = torch.randn(batch * pages_per_seq, page, 2, 64, device=device, dtype=torch.float16)
    pool_v = torch.randn_like(pool_k)
    table = torch.arange(batch * pages_per_seq, dtype=torch.int32, device=device).view(batch, pages_per_seq)
    bad_table = table.clone()
    bad_table[1, 1] = 10_000
    lengths = torch.tensor([50, 50], dtype=torch.int32, device=device)
    q = torch.randn(batch, 1, 4, 64, device=device, dtype=torch.float16)
    good = call(fk.flash_attn_with_kvcache, q, pool_k, pool_v, cache_seqlens=lengths, block_table=table)
    bad = call(fk.flash_attn_with_kvcache, q, pool_k, pool_v, cache_seqlens=lengths, block_table=bad_table)
    assert torch.equal(bad[0], good[0])
    if backend == "triton":
        assert torch.isnan(bad[1]).all()
    else:
        assert torch.isfinite(bad[1]).all() and not torch.equal(bad[1], good[1])
    k_new = torch.randn(batch, 1, 2, 64, device=device, dtype=torch.float16)
    with pytest.raises(UnsupportedInputError, match="page id"):
        fk.flash_attn_with_kvcache(q, pool_k, pool_v, k_new, k_new, cache_seqlens=lengths,
                                   block_table=bad_table)


@pytest.mark.parametrize("case", [
    maybe_gpu(replace(CPU_CASES[2], seqlen_q=1), cpu=True, id="paged16"),
])
def test_kvcache_graph_capture(device, case):
    """Decode with append and rotary inside a CUDA graph: no host sync on the way, and each
    replay appends at the lengths found on the device at replay time."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a CUDA GPU")
    torch.manual_seed(4)
    dtype, page = torch.float16, case.page_size
    pool_k = torch.randn(8, page, 2, 64, device=device, dtype=dtype)
    pool_v = torch.randn_like(pool_k)
    table = torch.arange(8, dtype=torch.int32, device=device).view(2, 4)
    lengths = torch.tensor([3, 20], dtype=torch.int32, device=device)
    q = torch.randn(2, 1, 4, 64, device=device, dtype=dtype)
    k_new = torch.randn(2, 1, 2, 64, device=device, dtype=dtype)
    v_new = torch.randn_like(k_new)
    angle = torch.rand(64, 32, device=device)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)

    def step():
        return fk.flash_attn_with_kvcache(q, pool_k, pool_v, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=lengths, block_table=table, causal=True)

    step()  # compile outside the capture
    pool_k_eager, pool_v_eager = pool_k.clone(), pool_v.clone()
    lengths += 1
    eager = fk.flash_attn_with_kvcache(q, pool_k_eager, pool_v_eager, k_new, v_new, rotary_cos=cos,
                                       rotary_sin=sin, cache_seqlens=lengths, block_table=table,
                                       causal=True)
    lengths -= 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    lengths += 1
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert torch.equal(pool_k, pool_k_eager) and torch.equal(pool_v, pool_v_eager)
