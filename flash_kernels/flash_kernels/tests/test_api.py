"""The public functions keep flash_attn's parameter names, order and defaults (flash_attn 2.x),
so that models switch by changing the import. Pure signature checks: no device needed."""

from __future__ import annotations

import inspect

import pytest

import flash_kernels as fk

COMMON = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
          ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
          ("return_attn_probs", False)]

EXPECTED = {
    "flash_attn_func": [("q",), ("k",), ("v",), *COMMON],
    "flash_attn_qkvpacked_func": [("qkv",), *COMMON],
    "flash_attn_kvpacked_func": [("q",), ("kv",), *COMMON],
    "flash_attn_varlen_func": [("q",), ("k",), ("v",), ("cu_seqlens_q",), ("cu_seqlens_k",),
                               ("max_seqlen_q",), ("max_seqlen_k",), *COMMON, ("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": [("qkv",), ("cu_seqlens",), ("max_seqlen",), *COMMON],
    "flash_attn_varlen_kvpacked_func": [("q",), ("kv",), ("cu_seqlens_q",), ("cu_seqlens_k",),
                                        ("max_seqlen_q",), ("max_seqlen_k",), *COMMON],
    "flash_attn_with_kvcache": [
        ("q",), ("k_cache",), ("v_cache",), ("k", None), ("v", None), ("rotary_cos", None),
        ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None),
        ("cache_leftpad", None), ("block_table", None), ("softmax_scale", None), ("causal", False),
        ("window_size", (-1, -1)), ("softcap", 0.0), ("rotary_interleaved", True),
        ("alibi_slopes", None), ("num_splits", 0), ("return_softmax_lse", False)],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_signature_matches_flash_attn(name):
    params = list(inspect.signature(getattr(fk, name)).parameters.values())
    got = [(p.name,) if p.default is inspect.Parameter.empty else (p.name, p.default) for p in params]
    assert got == EXPECTED[name]
