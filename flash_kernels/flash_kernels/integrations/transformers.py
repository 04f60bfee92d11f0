"""flash_kernels as an attention implementation of Hugging Face transformers (5.x).

    import flash_kernels.integrations.transformers as fk_tf   # registers ATTN_IMPLEMENTATION
    model = AutoModelForCausalLM.from_config(config, attn_implementation=fk_tf.ATTN_IMPLEMENTATION)

It registers, through transformers' public extension points, an attention function
(``AttentionInterface``) and its mask function (``AttentionMaskInterface``: the 2-D padding mask,
or None when nothing is padded). No package named ``flash_attn`` is installed or imitated.

The name is ``"fk_attention"``, not ``"flash_kernels"``: transformers routes every
implementation name that contains "flash" to its own flash-attn / Hub-kernel loader
(``is_flash_attention_requested`` in ``_check_and_adjust_attn_implementation``), which refuses
any name that is neither flash_attn nor a Hub repository, so a registered "flash_kernels"
cannot be selected. ``register(name)`` refuses such names for that reason.

Batches, as transformers' own flash-attention path handles them:
- a padding mask (left or right padding, also with a KV cache during generation): the tokens
  are unpadded and attended with ``flash_attn_varlen_func``, then padded back (padded query
  rows get 0);
- packed sequences (padding-free): ``cu_seq_lens_q/k`` and ``max_length_q/k`` from the data
  collator, or position_ids that restart at 0 in a batch of one;
- otherwise the dense ``flash_attn_func``.
Causal, sliding window (``sliding_window`` keys, as transformers' masks count it), softcap,
GQA/MQA, scaling and dropout go to the kernels; ``s_aux`` (attention sinks) raises.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import UnsupportedInputError
from ..interface import flash_attn_func, flash_attn_varlen_func

try:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as e:  # transformers is optional; this module is its only user
    raise ImportError(
        "flash_kernels.integrations.transformers needs Hugging Face transformers 5.x "
        f"(`pip install transformers`): {e}") from e

ATTN_IMPLEMENTATION = "fk_attention"


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                 kv_offset: int = 0, mask_function=None, attention_mask=None, **kwargs):
    """The mask transformers builds for this implementation: the 2-D (batch, kv_length) bool
    padding mask, right-aligned to the keys, or None when no key is padded (causal and window
    masks are the kernels' own)."""
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask.bool()


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None,
                      is_causal: bool | None = None, s_aux: torch.Tensor | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (b, hq, sq, d), key/value (b, hk, sk, d);
    returns ((b, sq, hq, d), None)."""
    if s_aux is not None:
        raise NotImplementedError("attention sinks (s_aux) are not implemented in flash_kernels")
    if kwargs.get("output_attentions"):
        raise NotImplementedError(
            "output_attentions=True: flash attention never forms the attention matrix; use "
            "attn_implementation='eager' for the weights")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    head_dim, v_head_dim = q.shape[-1], v.shape[-1]
    if v_head_dim != head_dim:  # e.g. MLA: the kernels want one head dim, so pad v and crop
        v = F.pad(v, (0, head_dim - v_head_dim))
    causal = bool(module.is_causal if is_causal is None else is_causal)
    kv_length = k.shape[1]
    window = (-1, -1)
    if sliding_window is not None and kv_length > sliding_window:
        # transformers' masks keep kv_idx > q_idx - sliding_window: sliding_window - 1 keys back.
        window = (sliding_window - 1, sliding_window - 1)
    options = dict(dropout_p=float(dropout), softmax_scale=scaling, causal=causal,
                   window_size=window, softcap=float(softcap or 0.0),
                   deterministic=bool(kwargs.get("deterministic") or False))
    out = _attend(q, k, v, attention_mask, kwargs, options)
    if v_head_dim != head_dim:
        out = out[..., :v_head_dim]
    return out, None


def _attend(q, k, v, attention_mask, kwargs, options) -> torch.Tensor:
    batch, seqlen_q = q.shape[:2]
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise UnsupportedInputError(
                f"{ATTN_IMPLEMENTATION} takes a 2-D padding mask (batch, kv_length); got shape "
                f"{tuple(attention_mask.shape)} (was the model's mask built for another implementation?)")
        return _padded(q, k, v, attention_mask.bool(), options)
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if cu_q is None and seqlen_q == k.shape[1]:
        packed = _cu_seqlens_from_position_ids(kwargs.get("position_ids"), batch, seqlen_q)
        if packed is not None:
            cu_q = cu_k = packed
            max_q = max_k = int((packed[1:] - packed[:-1]).max())
    if cu_q is not None and cu_k is not None:
        if max_q is None or max_k is None:
            max_q = int((cu_q[1:] - cu_q[:-1]).max())
            max_k = int((cu_k[1:] - cu_k[:-1]).max())
        out = flash_attn_varlen_func(_flat(q), _flat(k), _flat(v), cu_q.to(torch.int32),
                                     cu_k.to(torch.int32), int(max_q), int(max_k), **options)
        return out.view(batch, seqlen_q, *out.shape[1:])
    return flash_attn_func(q, k, v, **options)


def _flat(t):
    return t.reshape(-1, *t.shape[2:])


def _cu_seqlens_from_position_ids(position_ids, batch: int, seqlen: int):
    """Boundaries of packed sequences in a batch of one (positions restart at 0), else None."""
    if position_ids is None or batch != 1 or seqlen == 1:
        return None
    positions = position_ids.reshape(-1)
    if positions.numel() != seqlen:
        return None
    starts = torch.nonzero(positions == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0 or starts.numel() == 1:
        return None  # one sequence (or positions that do not start at 0): the dense path
    end = torch.tensor([seqlen], device=starts.device, dtype=starts.dtype)
    return torch.cat([starts, end]).to(torch.int32)


def _padded(q, k, v, mask, options) -> torch.Tensor:
    """Attention over the unpadded tokens of a padded batch (the mask covers the keys; the
    queries are its last seqlen_q columns), padded back with zeros."""
    batch, seqlen_q = q.shape[:2]
    mask_q = mask[:, -seqlen_q:]
    index_k, cu_k, max_k = _unpad_index(mask)
    index_q, cu_q, max_q = (index_k, cu_k, max_k) if mask_q.shape == mask.shape else _unpad_index(mask_q)
    out = flash_attn_varlen_func(_flat(q)[index_q], _flat(k)[index_k], _flat(v)[index_k],
                                 cu_q, cu_k, max_q, max_k, **options)
    padded = out.new_zeros(batch * seqlen_q, *out.shape[1:])
    padded = padded.index_copy(0, index_q, out)
    return padded.view(batch, seqlen_q, *out.shape[1:])


def _unpad_index(mask):
    """(flat indices of the kept tokens, int32 cu_seqlens, max length): one host sync."""
    lengths = mask.sum(dim=1, dtype=torch.int32)
    index = torch.nonzero(mask.reshape(-1)).flatten()
    cu = F.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    return index, cu, int(lengths.max())


def register(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register the attention and mask functions under ``name``; return the name."""
    if "flash" in name:
        raise ValueError(
            f"attention implementation name {name!r} contains 'flash': transformers sends such names "
            "to its flash-attn / Hub-kernel loader, which cannot load them; choose another name "
            f"(the default is {ATTN_IMPLEMENTATION!r})")
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_mask)
    return name


register()
