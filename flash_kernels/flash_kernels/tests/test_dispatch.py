"""The KV-cache / paged routing contract with the CUDA extension's Python side (_cuda.py), checked
against a stand-in module that records what dispatch asks: the routing logic needs no GPU, and the
real extension's answers are exercised by the numerics suites on a GPU."""

from __future__ import annotations

import types

import torch

from flash_kernels import dispatch


class FakeCuda(types.SimpleNamespace):
    """Answers like flash_kernels._cuda would, and keeps the arguments it was asked with."""

    def __init__(self, kvcache_reason=None, varlen_reason=None, with_kvcache=True):
        super().__init__(calls=[])
        self._kvcache_reason, self._varlen_reason = kvcache_reason, varlen_reason
        if with_kvcache:
            self.kvcache_fwd = lambda *args: None

    def kvcache_unsupported_reason(self, q, k_cache, v_cache, **kwargs):
        self.calls.append(("kvcache", tuple(q.shape), kwargs))
        return self._kvcache_reason

    def unsupported_reason(self, q, k, v, **kwargs):
        self.calls.append(("varlen", tuple(q.shape), kwargs))
        return self._varlen_reason


def _features(**cache):
    return dispatch.Features(causal=True, window_size=(-1, 0), softcap=0.0, alibi_slopes=None,
                             dropout_p=0.0, **cache)


def test_kvcache_reason_is_the_extensions():
    q = torch.zeros(2, 1, 4, 64)
    pool = torch.zeros(6, 16, 2, 64)
    table = torch.zeros(2, 3, dtype=torch.int32)
    leftpad = torch.zeros(2, dtype=torch.int32)
    fake = FakeCuda()
    features = _features(is_varlen=False, is_kvcache=True, block_table=table, cache_leftpad=leftpad)
    assert dispatch._cuda_cache_reason(fake, q, pool, pool, features) is None
    kind, shape, kwargs = fake.calls[-1]
    assert kind == "kvcache" and shape == (2, 1, 4, 64)
    assert kwargs == dict(block_table=table, cache_batch_idx=None, cache_leftpad=leftpad, softcap=0.0,
                          alibi_slopes=None, window_left=-1, window_right=0)
    fake = FakeCuda(kvcache_reason="page size 16 is not compiled")
    assert dispatch._cuda_cache_reason(fake, q, pool, pool, features) == "page size 16 is not compiled"


def test_paged_varlen_asks_the_varlen_check_with_the_block_table():
    q = torch.zeros(40, 4, 64)
    pool = torch.zeros(6, 16, 2, 64)
    table = torch.zeros(3, 3, dtype=torch.int32)
    fake = FakeCuda()
    features = _features(is_varlen=True, block_table=table)
    assert dispatch._cuda_cache_reason(fake, q, pool, pool, features) is None
    (kind, shape, kwargs), = fake.calls
    assert kind == "varlen" and shape == (40, 4, 64)
    assert kwargs["is_varlen"] is True and kwargs["block_table"] is table
    fake = FakeCuda(varlen_reason="head dim 36 is not a multiple of 8")
    assert dispatch._cuda_cache_reason(fake, q, pool, pool, features) == "head dim 36 is not a multiple of 8"


def test_no_kvcache_path_and_dropout_have_reasons():
    q = torch.zeros(2, 1, 4, 64)
    pool = torch.zeros(6, 16, 2, 64)
    features = _features(is_varlen=False, is_kvcache=True)
    assert "kvcache_fwd is missing" in dispatch._cuda_cache_reason(FakeCuda(with_kvcache=False), q, pool, pool,
                                                                   features)
    dropout = dispatch.Features(causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                dropout_p=0.1, is_varlen=True, block_table=torch.zeros(2, 3, dtype=torch.int32))
    assert "dropout" in dispatch._cuda_cache_reason(FakeCuda(), q[0], pool, pool, dropout)
