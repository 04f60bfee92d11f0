"""Bad calls fail on the host, before any launch, with an exception that says what to change."""

from __future__ import annotations

import pytest
import torch

import flash_kernels as fk
from flash_kernels import dispatch
from flash_kernels.errors import (
    BackendUnavailableError,
    UnsupportedDeviceError,
    UnsupportedInputError,
)


def _qkv(device, dtype=torch.float16, shape=(1, 8, 2, 64), kshape=None):
    kshape = kshape or shape
    return (torch.randn(shape, device=device).to(dtype), torch.randn(kshape, device=device).to(dtype),
            torch.randn(kshape, device=device).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_bad_dtype(device, dtype):
    with pytest.raises(UnsupportedInputError, match="dtype"):
        fk.flash_attn_func(*_qkv(device, dtype))


def test_mixed_dtypes(device):
    q, k, v = _qkv(device)
    with pytest.raises(UnsupportedInputError, match="share one dtype"):
        fk.flash_attn_func(q, k.float(), v)


def test_head_dim_too_large(device):
    with pytest.raises(UnsupportedInputError, match="head dim must be between 1 and 256"):
        fk.flash_attn_func(*_qkv(device, shape=(1, 4, 1, 264)))


def test_head_dims_differ(device):
    q, k, v = _qkv(device)
    with pytest.raises(UnsupportedInputError, match="same head dim"):
        fk.flash_attn_func(q, k, v[..., :32])


def test_heads_not_multiple(device):
    with pytest.raises(UnsupportedInputError, match="multiple"):
        fk.flash_attn_func(*_qkv(device, shape=(1, 8, 3, 64), kshape=(1, 8, 2, 64)))


def test_wrong_rank(device):
    q, k, v = _qkv(device)
    with pytest.raises(UnsupportedInputError, match="4 dimensions"):
        fk.flash_attn_func(q[0], k[0], v[0])


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_bad_dropout(device, p):
    with pytest.raises(UnsupportedInputError, match="dropout_p"):
        fk.flash_attn_func(*_qkv(device), dropout_p=p)


def test_dropout_goes_to_triton_with_reason(device, monkeypatch):
    """The CUDA path has no dropout: auto routes it to Triton, a forced cuda names the reason."""
    q, k, v = _qkv(device)
    features = dispatch.Features(causal=False, window_size=(-1, -1), softcap=0.0,
                                 alibi_slopes=None, dropout_p=0.1, is_varlen=False)
    reason = dispatch.cuda_unsupported_reason(q, k, v, features)
    assert reason  # on every machine: no extension, no GPU, or no dropout in the CUDA kernels
    monkeypatch.setenv(dispatch.BACKEND_ENV, "auto")
    assert dispatch.choose_backend(q, k, v, features) == "triton"
    monkeypatch.setenv(dispatch.BACKEND_ENV, "cuda")
    with pytest.raises(BackendUnavailableError, match="cannot run this call"):
        fk.flash_attn_func(q, k, v, dropout_p=0.1)


def test_bad_window(device):
    with pytest.raises(UnsupportedInputError, match="window_size"):
        fk.flash_attn_func(*_qkv(device), window_size=3)


def test_bad_alibi(device):
    with pytest.raises(UnsupportedInputError, match="alibi_slopes"):
        fk.flash_attn_func(*_qkv(device), alibi_slopes=torch.ones(5, device=device))


def test_varlen_bad_cu_seqlens(device):
    q = torch.randn(10, 2, 64, device=device).half()
    cu = torch.tensor([0, 10], device=device)  # int64, not int32
    with pytest.raises(UnsupportedInputError, match="int32"):
        fk.flash_attn_varlen_func(q, q, q, cu, cu, 10, 10)


def test_kvcache_bad_rotary(device):
    q, k, v = _qkv(device, shape=(1, 1, 2, 64), kshape=(1, 16, 2, 64))
    kn = torch.randn(1, 1, 2, 64, device=device).half()
    cos = torch.ones(16, 16, device=device).half()
    with pytest.raises(UnsupportedInputError, match="need the new k and v"):
        fk.flash_attn_with_kvcache(q, k, v, rotary_cos=cos, rotary_sin=cos, cache_seqlens=3)
    with pytest.raises(UnsupportedInputError, match="together"):
        fk.flash_attn_with_kvcache(q, k, v, kn, kn, rotary_cos=cos, cache_seqlens=3)
    with pytest.raises(UnsupportedInputError, match="cover the cache"):
        fk.flash_attn_with_kvcache(q, k, v, kn, kn, rotary_cos=cos[:8], rotary_sin=cos[:8], cache_seqlens=3)
    wide = torch.ones(16, 40, device=device).half()
    with pytest.raises(UnsupportedInputError, match="rotary_dim"):
        fk.flash_attn_with_kvcache(q, k, v, kn, kn, rotary_cos=wide, rotary_sin=wide, cache_seqlens=3)


def test_kvcache_bad_paged_layout(device):
    q = torch.randn(2, 1, 4, 64, device=device).half()
    pool = torch.randn(6, 16, 2, 64, device=device).half()
    table = torch.zeros(2, 3, dtype=torch.int32, device=device)
    with pytest.raises(UnsupportedInputError, match="block_table must be a torch"):
        fk.flash_attn_with_kvcache(q, pool, pool, block_table=table.long())
    with pytest.raises(UnsupportedInputError, match="batch=2"):
        fk.flash_attn_with_kvcache(q, pool, pool, block_table=table[:1])
    odd = torch.randn(6, 24, 2, 64, device=device).half()
    with pytest.raises(UnsupportedInputError, match="multiple of 16"):
        fk.flash_attn_with_kvcache(q, odd, odd, block_table=table)
    with pytest.raises(UnsupportedInputError, match="cache_batch_idx cannot be combined"):
        fk.flash_attn_with_kvcache(q, pool, pool, block_table=table,
                                   cache_batch_idx=torch.zeros(2, dtype=torch.int32, device=device))
    with pytest.raises(UnsupportedInputError, match="cache_leftpad"):
        fk.flash_attn_with_kvcache(q, pool, pool, block_table=table,
                                   cache_leftpad=torch.zeros(2, dtype=torch.int64, device=device))


def test_kvcache_append_overflow(device):
    q, k, v = _qkv(device, shape=(1, 1, 2, 64), kshape=(1, 16, 2, 64))
    kn = torch.randn(1, 4, 2, 64, device=device).half()
    with pytest.raises(UnsupportedInputError, match="cache length"):
        fk.flash_attn_with_kvcache(q, k, v, kn, kn, cache_seqlens=14)


def test_unknown_backend_env(device, monkeypatch):
    monkeypatch.setenv(dispatch.BACKEND_ENV, "fastest")
    with pytest.raises(UnsupportedInputError, match="FLASH_KERNELS_BACKEND"):
        fk.flash_attn_func(*_qkv(device))


def test_forced_cuda_unavailable_names_reason(device, monkeypatch):
    # Head dim 36 is not a multiple of 8: the CUDA kernels (16-byte row copies) cannot take it anywhere.
    q, k, v = _qkv(device, shape=(1, 8, 2, 36))
    features = dispatch.Features(causal=False, window_size=(-1, -1), softcap=0.0,
                                 alibi_slopes=None, dropout_p=0.0, is_varlen=False)
    reason = dispatch.cuda_unsupported_reason(q, k, v, features)
    if reason is None:
        pytest.skip("the CUDA backend supports this call here, so forcing it cannot fail")
    monkeypatch.setenv(dispatch.BACKEND_ENV, "cuda")
    with pytest.raises(BackendUnavailableError, match="CUDA backend cannot run this call"):
        fk.flash_attn_func(q, k, v)


def test_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UnsupportedDeviceError, match="CPU"):
        fk.flash_attn_func(*_qkv(torch.device("cpu")))


def test_bf16_refused_by_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(UnsupportedDeviceError, match="bfloat16"):
        fk.flash_attn_func(*_qkv(torch.device("cpu"), torch.bfloat16))


def test_cuda_head_dim_rule(device, monkeypatch):
    """Every head dim that is a multiple of 8 up to the largest compiled one goes to the CUDA path (on the
    next larger compiled kernel); others fall back to Triton with a reason that says why."""
    if device.type != "cuda" or dispatch.cuda_backend() is None:
        pytest.skip("needs the CUDA extension and a CUDA GPU")
    cuda = dispatch.cuda_backend()
    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)  # auto
    features = dispatch.Features(causal=True, window_size=(-1, -1), softcap=0.0,
                                 alibi_slopes=None, dropout_p=0.0, is_varlen=False)
    largest = max(cuda.compiled_head_dims())
    for head_dim in range(8, largest + 1, 8):
        q, k, v = _qkv(device, shape=(1, 8, 2, head_dim))
        assert dispatch.cuda_unsupported_reason(q, k, v, features) is None, head_dim
        assert dispatch.choose_backend(q, k, v, features) == "cuda", head_dim
        assert cuda.kernel_head_dim(head_dim) >= head_dim
    for head_dim in (4, 36, 100, largest - 1):
        q, k, v = _qkv(device, shape=(1, 8, 2, head_dim))
        assert "multiple of 8" in dispatch.cuda_unsupported_reason(q, k, v, features), head_dim
        assert dispatch.choose_backend(q, k, v, features) == "triton", head_dim
