"""The attention operators: plain bodies for eager calls, registered with torch.library so
torch.compile can trace through them.

Each op receives the backend the caller chose ("triton" or "cuda") as a string argument, so a
compiled graph records which implementation it runs; a traced caller passes "auto" and the op
chooses on the real tensors (see _resolve). Fake (meta) implementations give
torch.compile the output shapes; the autograd formulas call the backward ops. DenseAttention and
VarlenAttention are the same forward and backward as autograd Functions, for eager calls that
need a gradient.
Causal attention arrives here folded into the window (right bound 0), as flash_attn does.
No ``from __future__ import annotations`` here: torch.library reads the annotations to build
each op's schema, and older torch (2.4-2.6) does not evaluate string annotations.
"""

from typing import Optional

import torch
from torch import Tensor

from . import dispatch
from .dispatch import cuda_backend
from .out_of_memory import raise_if_out_of_memory


def _triton():
    """The Triton kernels, imported on first use so that `import flash_kernels` works without triton."""
    try:
        from . import triton_attention
    except ImportError as e:
        raise RuntimeError(
            f"the Triton backend needs the `triton` package, which failed to import ({e}); install "
            "the triton that matches your torch (CUDA wheels of torch bring it), or "
            "`pip install flash_kernels[triton]` on a CPU-only torch") from e
    return triton_attention


def _cuda():
    module = cuda_backend()
    if module is None:  # dispatch checked this; kept for ops called directly
        raise RuntimeError("flash_kernels::* got backend='cuda' but the CUDA extension is not built")
    return module


def _is_causal(window_left: int, window_right: int) -> bool:
    return window_right == 0 and window_left < 0


def _dropout(dropout_p: float, rng_seed: Optional[Tensor]):
    """The Triton kernels' dropout argument (None when there is none)."""
    if dropout_p <= 0.0:
        return None
    if rng_seed is None:  # the API always draws one; kept for ops called directly
        raise RuntimeError("dropout_p > 0 needs rng_seed (a device int64 tensor)")
    return _triton().Dropout(dropout_p, rng_seed)


def _resolve(backend: str, q: Tensor, k: Tensor, v: Tensor, window_left: int, window_right: int,
             softcap: float, alibi_slopes, dropout_p: float = 0.0, **cache) -> str:
    """The backend for "auto": chosen here, on real tensors, when the caller was being traced.

    Under torch.compile the Python API sees fake tensors, and the CUDA path's support checks read
    data pointers and device properties, so the API passes "auto" and the op decides at run time.
    An eager call arrives with its backend chosen, and pays for nothing here.
    """
    if backend != "auto":
        return backend
    features = dispatch.Features(causal=_is_causal(window_left, window_right),
                                 window_size=(window_left, window_right), softcap=softcap,
                                 alibi_slopes=alibi_slopes, dropout_p=dropout_p, **cache)
    return dispatch.choose_backend(q, k, v, features)


# ----------------------------------------------------------------------------- dense
# Each op's body is a plain function: eager calls run it directly (interface.py), skipping
# torch.library's dispatch, which costs more host time than a decode kernel takes on the GPU.
# The registered ops wrap the same bodies, for torch.compile.
def dense_fwd(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, dropout_p,
              rng_seed, deterministic, backend):
    try:
        backend = _resolve(backend, q, k, v, window_left, window_right, softcap, alibi_slopes,
                           dropout_p, is_varlen=False)
        if backend == "cuda":
            return _cuda().fwd(q, k, v, softmax_scale, _is_causal(window_left, window_right),
                               window_left, window_right, softcap)
        return _triton().attention_forward(q, k, v, softmax_scale, window_left, window_right,
                                           softcap, alibi_slopes,
                                           dropout=_dropout(dropout_p, rng_seed))
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_kernels attention forward")
        raise


@torch.library.custom_op("flash_kernels::fwd", mutates_args=())
def attn_fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, window_left: int,
             window_right: int, softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float,
             rng_seed: Optional[Tensor], deterministic: bool,
             backend: str) -> tuple[Tensor, Tensor]:
    return dense_fwd(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                     dropout_p, rng_seed, deterministic, backend)


@attn_fwd.register_fake
def _(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, dropout_p,
      rng_seed, deterministic, backend):
    batch, seqlen_q, nheads_q, _ = q.shape
    return torch.empty_like(q), q.new_empty((batch, nheads_q, seqlen_q), dtype=torch.float32)


def dense_bwd(dout, q, k, v, out, lse, softmax_scale, window_left, window_right, softcap,
              alibi_slopes, dropout_p, rng_seed, deterministic, backend):
    try:
        backend = _resolve(backend, q, k, v, window_left, window_right, softcap, alibi_slopes,
                           dropout_p, is_varlen=False)
        if backend == "cuda":
            return _cuda().bwd(dout, q, k, v, out, lse, softmax_scale,
                               _is_causal(window_left, window_right), window_left, window_right,
                               softcap, deterministic)
        return _triton().attention_backward(dout, q, k, v, out, lse, softmax_scale,
                                            window_left, window_right, softcap, alibi_slopes,
                                            dropout=_dropout(dropout_p, rng_seed))
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_kernels attention backward")
        raise


@torch.library.custom_op("flash_kernels::bwd", mutates_args=())
def attn_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             softmax_scale: float, window_left: int, window_right: int, softcap: float,
             alibi_slopes: Optional[Tensor], dropout_p: float, rng_seed: Optional[Tensor],
             deterministic: bool, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    return dense_bwd(dout, q, k, v, out, lse, softmax_scale, window_left, window_right, softcap,
                     alibi_slopes, dropout_p, rng_seed, deterministic, backend)


@attn_bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, window_left, window_right, softcap, alibi_slopes,
      dropout_p, rng_seed, deterministic, backend):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _dense_grads(bwd, saved, args, dout):
    """(dq, dk, dv) of the dense forward; ``bwd`` is the registered op (traced) or its body (eager).

    Like flash_attn, the gradient flows through ``out`` only: lse is an auxiliary output.
    """
    q, k, v, out, lse, alibi_slopes, rng_seed = saved
    softmax_scale, window_left, window_right, softcap, dropout_p, deterministic, backend = args
    return bwd(dout, q, k, v, out, lse, softmax_scale, window_left, window_right, softcap,
               alibi_slopes, dropout_p, rng_seed, deterministic, backend)


def _fwd_setup(ctx, inputs, output):
    (q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, dropout_p,
     rng_seed, deterministic, backend) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_seed)
    ctx.args = (softmax_scale, window_left, window_right, softcap, dropout_p, deterministic,
                backend)


def _fwd_backward(ctx, dout, dlse):
    return _dense_grads(attn_bwd, ctx.saved_tensors, ctx.args, dout) + (None,) * 9


attn_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)


class DenseAttention(torch.autograd.Function):
    """The eager form of flash_kernels::fwd with its autograd: the same bodies and backward formula,
    without torch.library's per-call dispatch."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                dropout_p, rng_seed, deterministic, backend):
        out, lse = dense_fwd(q, k, v, softmax_scale, window_left, window_right, softcap,
                             alibi_slopes, dropout_p, rng_seed, deterministic, backend)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_seed)
        ctx.args = (softmax_scale, window_left, window_right, softcap, dropout_p, deterministic,
                    backend)
        # lse's gradient is never used: autograd need not make (allocate and fill) a zero one.
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        saved = ctx.saved_tensors
        if dout is None:  # only lse was differentiated: the gradient through out is zero
            dout = torch.zeros_like(saved[3])
        return _dense_grads(dense_bwd, saved, ctx.args, dout) + (None,) * 9


# ----------------------------------------------------------------------------- varlen
def varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
               window_left, window_right, softcap, alibi_slopes, dropout_p, rng_seed,
               deterministic, backend):
    try:
        backend = _resolve(backend, q, k, v, window_left, window_right, softcap, alibi_slopes,
                           dropout_p, is_varlen=True)
        if backend == "cuda":
            return _cuda().varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      softmax_scale, _is_causal(window_left, window_right),
                                      window_left, window_right, softcap)
        return _triton().attention_forward(
            q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            dropout=_dropout(dropout_p, rng_seed))
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_kernels varlen attention forward")
        raise


@torch.library.custom_op("flash_kernels::varlen_fwd", mutates_args=())
def attn_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                    window_left: int, window_right: int, softcap: float,
                    alibi_slopes: Optional[Tensor], dropout_p: float, rng_seed: Optional[Tensor],
                    deterministic: bool, backend: str) -> tuple[Tensor, Tensor]:
    return varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      softmax_scale, window_left, window_right, softcap, alibi_slopes, dropout_p,
                      rng_seed, deterministic, backend)


@attn_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      window_left, window_right, softcap, alibi_slopes, dropout_p, rng_seed, deterministic,
      backend):
    total_q, nheads_q, _ = q.shape
    return torch.empty_like(q), q.new_empty((nheads_q, total_q), dtype=torch.float32)


def varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               softmax_scale, window_left, window_right, softcap, alibi_slopes, dropout_p,
               rng_seed, deterministic, backend):
    try:
        backend = _resolve(backend, q, k, v, window_left, window_right, softcap, alibi_slopes,
                           dropout_p, is_varlen=True)
        if backend == "cuda":
            return _cuda().varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                      max_seqlen_q, max_seqlen_k, softmax_scale,
                                      _is_causal(window_left, window_right), window_left,
                                      window_right, softcap, deterministic)
        return _triton().attention_backward(
            dout, q, k, v, out, lse, softmax_scale, window_left, window_right, softcap, alibi_slopes,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            dropout=_dropout(dropout_p, rng_seed))
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_kernels varlen attention backward")
        raise


@torch.library.custom_op("flash_kernels::varlen_bwd", mutates_args=())
def attn_varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                    max_seqlen_k: int, softmax_scale: float, window_left: int,
                    window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                    dropout_p: float, rng_seed: Optional[Tensor], deterministic: bool,
                    backend: str) -> tuple[Tensor, Tensor, Tensor]:
    return varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                      max_seqlen_k, softmax_scale, window_left, window_right, softcap,
                      alibi_slopes, dropout_p, rng_seed, deterministic, backend)


@attn_varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_seed,
      deterministic, backend):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _varlen_grads(bwd, saved, args, dout):
    q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_seed = saved
    (max_sq, max_sk, softmax_scale, window_left, window_right, softcap, dropout_p, deterministic,
     backend) = args
    return bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_sq, max_sk, softmax_scale, window_left,
               window_right, softcap, alibi_slopes, dropout_p, rng_seed, deterministic, backend)


def _varlen_setup(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_sq, max_sk, softmax_scale, window_left, window_right, softcap,
     alibi_slopes, dropout_p, rng_seed, deterministic, backend) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_seed)
    ctx.args = (max_sq, max_sk, softmax_scale, window_left, window_right, softcap, dropout_p,
                deterministic, backend)


def _varlen_backward(ctx, dout, dlse):
    return _varlen_grads(attn_varlen_bwd, ctx.saved_tensors, ctx.args, dout) + (None,) * 13


attn_varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup)


class VarlenAttention(torch.autograd.Function):
    """The eager form of flash_kernels::varlen_fwd with its autograd (see DenseAttention)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_sq, max_sk, softmax_scale, window_left,
                window_right, softcap, alibi_slopes, dropout_p, rng_seed, deterministic, backend):
        out, lse = varlen_fwd(q, k, v, cu_q, cu_k, max_sq, max_sk, softmax_scale, window_left,
                              window_right, softcap, alibi_slopes, dropout_p, rng_seed,
                              deterministic, backend)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_seed)
        ctx.args = (max_sq, max_sk, softmax_scale, window_left, window_right, softcap, dropout_p,
                    deterministic, backend)
        ctx.set_materialize_grads(False)  # as DenseAttention
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        saved = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(saved[3])
        return _varlen_grads(varlen_bwd, saved, ctx.args, dout) + (None,) * 13


def paged_varlen_fwd(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     block_table, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                     dropout_p, rng_seed, backend):
    """Varlen forward over a paged KV cache."""
    try:
        backend = _resolve(backend, q, k_cache, v_cache, window_left, window_right, softcap,
                           alibi_slopes, dropout_p, is_varlen=True, block_table=block_table)
        if backend == "cuda":
            return _cuda().varlen_fwd(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      max_seqlen_k, softmax_scale,
                                      _is_causal(window_left, window_right), window_left,
                                      window_right, softcap, block_table=block_table)
        return _triton().attention_forward(
            q, k_cache, v_cache, softmax_scale, window_left, window_right, softcap, alibi_slopes,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k, block_table=block_table,
            dropout=_dropout(dropout_p, rng_seed))
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_kernels paged varlen attention forward")
        raise


@torch.library.custom_op("flash_kernels::paged_varlen_fwd", mutates_args=())
def attn_paged_varlen_fwd(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                          block_table: Tensor, softmax_scale: float, window_left: int,
                          window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                          dropout_p: float, rng_seed: Optional[Tensor],
                          backend: str) -> tuple[Tensor, Tensor]:
    return paged_varlen_fwd(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, block_table, softmax_scale, window_left, window_right,
                            softcap, alibi_slopes, dropout_p, rng_seed, backend)


def _paged_no_backward(ctx, dout, dlse):
    # flash_attn runs this forward on inputs that require grad (evaluation inside a training
    # loop) and has no paged backward: only asking for the gradient is an error.
    raise NotImplementedError(
        "flash_attn_varlen_func with block_table (paged KV) has no backward, as in flash_attn; "
        "the forward ran, but a gradient through it cannot be computed. Use the dense or varlen "
        "form (without block_table) for training")


def _paged_no_context(ctx, inputs, output):
    return None


attn_paged_varlen_fwd.register_autograd(_paged_no_backward, setup_context=_paged_no_context)


@attn_paged_varlen_fwd.register_fake
def _(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
      softmax_scale, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_seed,
      backend):
    total_q, nheads_q, _ = q.shape
    return torch.empty_like(q), q.new_empty((nheads_q, total_q), dtype=torch.float32)


# ----------------------------------------------------------------------------- S_dmask
def probs(q, k, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
          window_left, window_right, softcap, alibi_slopes, dropout_p, rng_seed):
    """flash_attn's S_dmask for a forward that used dropout (Triton: dropout runs there only)."""
    try:
        return _triton().attention_probs(
            q, k, lse, softmax_scale, window_left, window_right, softcap, alibi_slopes,
            _dropout(dropout_p, rng_seed), cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_kernels attention probabilities (S_dmask)")
        raise


@torch.library.custom_op("flash_kernels::attn_probs", mutates_args=())
def attn_probs(q: Tensor, k: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
               cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
               softmax_scale: float, window_left: int, window_right: int, softcap: float,
               alibi_slopes: Optional[Tensor], dropout_p: float, rng_seed: Tensor) -> Tensor:
    return probs(q, k, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 softmax_scale, window_left, window_right, softcap, alibi_slopes, dropout_p,
                 rng_seed)


@attn_probs.register_fake
def _(q, k, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      window_left, window_right, softcap, alibi_slopes, dropout_p, rng_seed):
    if cu_seqlens_q is None:
        batch, sq, nheads, _ = q.shape
        sk = k.shape[1]
    else:
        batch, nheads, sq, sk = cu_seqlens_q.shape[0] - 1, q.shape[1], max_seqlen_q, max_seqlen_k

    def rounded(x):
        return (x + 127) // 128 * 128
    return q.new_empty((batch, nheads, rounded(sq), rounded(sk)))


# ----------------------------------------------------------------------------- kv cache
def kvcache_fwd(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx, cache_leftpad,
                block_table, rotary_cos, rotary_sin, rotary_interleaved, softmax_scale,
                window_left, window_right, softcap, alibi_slopes, num_splits, backend):
    """Rotary on q and the new k, the in-place append, then attention over the cache.

    The first two steps are Triton kernels whichever backend attends: the CUDA kernel receives
    q already rotated, the cache already appended and cache_seqlens counting the new keys.
    """
    try:
        batch, seqlen_q, nheads_q, _ = q.shape
        backend = _resolve(backend, q, k_cache, v_cache, window_left, window_right, softcap,
                           alibi_slopes, is_varlen=False, is_kvcache=True, block_table=block_table,
                           cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad)
        if cache_seqlens.dtype != torch.int32 or not cache_seqlens.is_contiguous():
            cache_seqlens = cache_seqlens.to(torch.int32).contiguous()
        if rotary_cos is not None:
            # flash_attn: causal or local queries sit at cache_seqlens + i; otherwise all at cache_seqlens.
            per_row = window_left >= 0 or window_right >= 0
            q = _triton().rotary_q(q, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved,
                                    per_row)
        seqlens_k = cache_seqlens
        if k_new is not None:
            _triton().append_kv(k_new, v_new, k_cache, v_cache, cache_seqlens, cache_batch_idx,
                                 block_table, rotary_cos, rotary_sin, rotary_interleaved)
            seqlens_k = cache_seqlens + k_new.shape[1]
        if backend == "cuda":
            return _cuda().kvcache_fwd(q, k_cache, v_cache, seqlens_k, block_table, cache_batch_idx,
                                       cache_leftpad, softmax_scale, window_left, window_right,
                                       softcap, num_splits)
        triton_ops = _triton()
        nheads_k = k_cache.shape[2]
        group = nheads_q // nheads_k
        pack_gqa = group > 1 and seqlen_q * group <= 128
        capacity = (block_table.shape[1] * k_cache.shape[1] if block_table is not None
                    else k_cache.shape[1])
        splits = num_splits
        if splits <= 0:
            splits = triton_ops.decode_num_splits(
                batch, nheads_k if pack_gqa else nheads_q, seqlen_q * (group if pack_gqa else 1),
                capacity)
        else:
            # The combine kernel wants a power of 2.
            splits = min(1 << (splits - 1).bit_length(), triton_ops.MAX_SPLITS)
        return triton_ops.attention_forward(
            q, k_cache, v_cache, softmax_scale, window_left, window_right, softcap, alibi_slopes,
            seqlens_k=seqlens_k,
            batch_idx=None if cache_batch_idx is None else cache_batch_idx.to(torch.int32).contiguous(),
            num_splits=splits, pack_gqa=pack_gqa, block_table=block_table,
            leftpad=cache_leftpad)
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, "flash_kernels KV-cache attention")
        raise


@torch.library.custom_op("flash_kernels::kvcache_fwd", mutates_args=("k_cache", "v_cache"))
def attn_kvcache_fwd(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_new: Optional[Tensor],
                     v_new: Optional[Tensor], cache_seqlens: Tensor,
                     cache_batch_idx: Optional[Tensor], cache_leftpad: Optional[Tensor],
                     block_table: Optional[Tensor], rotary_cos: Optional[Tensor],
                     rotary_sin: Optional[Tensor], rotary_interleaved: bool,
                     softmax_scale: float, window_left: int, window_right: int, softcap: float,
                     alibi_slopes: Optional[Tensor], num_splits: int,
                     backend: str) -> tuple[Tensor, Tensor]:
    return kvcache_fwd(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx,
                       cache_leftpad, block_table, rotary_cos, rotary_sin, rotary_interleaved,
                       softmax_scale, window_left, window_right, softcap, alibi_slopes,
                       num_splits, backend)


@attn_kvcache_fwd.register_fake
def _(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx, cache_leftpad,
      block_table, rotary_cos, rotary_sin, rotary_interleaved, softmax_scale, window_left,
      window_right, softcap, alibi_slopes, num_splits, backend):
    batch, seqlen_q, nheads_q, _ = q.shape
    return torch.empty_like(q), q.new_empty((batch, nheads_q, seqlen_q), dtype=torch.float32)
