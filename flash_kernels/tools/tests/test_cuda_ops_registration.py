"""The built extension's registration, without a GPU: import, op schemas, fake (meta) kernels, reasons.

Skipped (with the import error as reason) where flash_kernels._C is not built or cannot load, e.g. in the
kit's venv without torch or with a torch other than the one the wheel was built for. Run where the
compiled wheel is installed:  python -m pytest flash_kernels/tools/tests/test_cuda_ops_registration.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2]))  # for `tools`

torch = pytest.importorskip("torch")
_cuda = pytest.importorskip("flash_kernels._cuda")
if not _cuda.is_built():
    pytest.skip(f"CUDA extension not built/loaded: {_cuda.import_error()}", allow_module_level=True)

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


def test_module_imports_normally():
    import flash_kernels._C as C

    assert C.__name__ == "flash_kernels._C"


def test_schemas():
    assert str(torch.ops.flash_kernels_cuda.fwd.default._schema) == (
        "flash_kernels_cuda::fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, "
        "int window_left, int window_right, float softcap) -> (Tensor, Tensor)")
    assert "bool deterministic" in str(torch.ops.flash_kernels_cuda.bwd.default._schema)
    assert str(torch.ops.flash_kernels_cuda.varlen_fwd.default._schema) == (
        "flash_kernels_cuda::varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, int window_left, "
        "int window_right, float softcap, Tensor? block_table=None) -> (Tensor, Tensor)")
    assert str(torch.ops.flash_kernels_cuda.kvcache_fwd.default._schema) == (
        "flash_kernels_cuda::kvcache_fwd(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, "
        "Tensor? block_table, Tensor? cache_batch_idx, Tensor? cache_leftpad, float softmax_scale, "
        "int window_left, int window_right, float softcap, int num_splits) -> (Tensor, Tensor)")
    assert "Tensor cu_seqlens_k" in str(torch.ops.flash_kernels_cuda.varlen_bwd.default._schema)
    assert str(torch.ops.flash_kernels_cuda.prepare_kernels.default._schema) == (
        "flash_kernels_cuda::prepare_kernels(int device) -> int")


def test_sm90_flag_is_registered():
    # True only in builds with 9.0a code (FLASH_KERNELS_SM90A); either way a plain bool, callable without a GPU.
    assert torch.ops.flash_kernels_cuda.sm90_compiled() in (True, False)


def test_compiled_head_dims_match_generator():
    from tools import generate_instantiations as gen

    assert _cuda.compiled_head_dims() == tuple(gen.HEAD_DIMS)


def test_fake_kernels_give_shapes_for_gqa():
    with FakeTensorMode():
        q = torch.empty(2, 100, 8, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 120, 2, 128, dtype=torch.bfloat16, device="cuda")
        out, lse = torch.ops.flash_kernels_cuda.fwd(q, k, k, 0.1, True, -1, -1, 0.0)
        assert out.shape == q.shape and lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        dq, dk, dv = torch.ops.flash_kernels_cuda.bwd(out, q, k, k, out, lse, 0.1, True, -1, -1, 0.0, False)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)


def test_fake_kernels_give_shapes_for_varlen():
    with FakeTensorMode():
        q = torch.empty(300, 8, 40, dtype=torch.float16, device="cuda")
        k = torch.empty(250, 2, 40, dtype=torch.float16, device="cuda")
        cu = torch.empty(4, dtype=torch.int32, device="cuda")
        out, lse = torch.ops.flash_kernels_cuda.varlen_fwd(q, k, k, cu, cu, 120, 100, 0.1, True, -1, -1, 0.0)
        assert out.shape == q.shape and lse.shape == (8, 300) and lse.dtype == torch.float32
        dq, dk, dv = torch.ops.flash_kernels_cuda.varlen_bwd(out, q, k, k, out, lse, cu, cu, 120, 100, 0.1, True,
                                                             -1, -1, 0.0, False)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)


def test_kvcache_head_dims_match_generator():
    from tools import generate_instantiations as gen

    assert _cuda.kvcache_head_dims() == tuple(gen.KVCACHE_HEAD_DIMS)


def test_fake_kernels_give_shapes_for_kvcache_and_paged_varlen():
    with FakeTensorMode():
        q = torch.empty(3, 2, 8, 128, dtype=torch.bfloat16, device="cuda")
        pages = torch.empty(40, 16, 2, 128, dtype=torch.bfloat16, device="cuda")
        table = torch.empty(3, 10, dtype=torch.int32, device="cuda")
        seqlens = torch.empty(3, dtype=torch.int32, device="cuda")
        out, lse = torch.ops.flash_kernels_cuda.kvcache_fwd(q, pages, pages, seqlens, table, None, None, 0.1, -1, 0,
                                                            0.0, 0)
        assert out.shape == q.shape and lse.shape == (3, 8, 2) and lse.dtype == torch.float32
        qv = torch.empty(300, 8, 128, dtype=torch.bfloat16, device="cuda")
        cu = torch.empty(4, dtype=torch.int32, device="cuda")
        out, lse = torch.ops.flash_kernels_cuda.varlen_fwd(qv, pages, pages, cu, cu, 120, 160, 0.1, True, -1, -1, 0.0,
                                                           table)
        assert out.shape == qv.shape and lse.shape == (8, 300)


def _kv_reason(**change):
    q = torch.zeros(2, 1, 8, 64, dtype=torch.float16)
    cache = torch.zeros(2, 100, 2, 64, dtype=torch.float16)
    kwargs = dict(block_table=None, cache_batch_idx=None, cache_leftpad=None, softcap=0.0, alibi_slopes=None,
                  window_left=-1, window_right=-1)
    args = {"q": q, "k_cache": cache, "v_cache": cache}
    for name in list(change):
        if name in args:
            args[name] = change.pop(name)
    kwargs.update(change)
    return _cuda.kvcache_unsupported_reason(args["q"], args["k_cache"], args["v_cache"], **kwargs)


def test_kvcache_reasons_name_the_problem():
    assert "ALiBi" in _kv_reason(alibi_slopes=torch.zeros(8))
    assert "not a CUDA GPU" in _kv_reason()  # CPU tensors: the remaining checks need a GPU
    assert "softcap" in _kv_reason(softcap=-1.0)


def test_kernel_head_dim_is_the_next_compiled_one():
    dims = _cuda.compiled_head_dims()
    assert _cuda.kernel_head_dim(dims[0]) == dims[0]
    assert _cuda.kernel_head_dim(dims[0] + 8) == dims[1]
    assert _cuda.kernel_head_dim(max(dims)) == max(dims)
    assert _cuda.kernel_head_dim(max(dims) + 8) is None
    assert _cuda.kernel_head_dim(36) is None  # not a multiple of 8


@pytest.mark.parametrize(
    "change,needle",
    [
        (dict(alibi_slopes=torch.zeros(2)), "ALiBi"),
        (dict(softcap=30.0), "softcap"),
        (dict(dropout_p=0.1), "dropout"),
    ],
)
def test_unsupported_reasons_name_the_feature(change, needle):
    q = torch.zeros(1, 4, 2, 64, dtype=torch.float16)
    kwargs = dict(causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                  is_varlen=False)
    kwargs.update(change)
    assert needle in _cuda.unsupported_reason(q, q, q, **kwargs)


def test_cpu_tensors_are_refused_with_reason():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.float16)
    reason = _cuda.unsupported_reason(q, q, q, causal=False, window_size=(-1, -1), softcap=0.0,
                                      alibi_slopes=None, dropout_p=0.0, is_varlen=False)
    assert "not a CUDA GPU" in reason
