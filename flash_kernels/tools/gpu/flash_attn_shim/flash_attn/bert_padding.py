"""flash_attn.bert_padding shim in plain torch (flash_kernels/tools/gpu/flash_attn_upstream.py).

Same semantics as flash_attn's: gradients flow through both functions (index_select / index_put).
"""

import torch


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen) bool/int (nonzero = valid),
    unused_mask (batch, seqlen) (nonzero = allocated but unused, also kept).

    Returns (hidden_states[selected] (total, ...), indices int64 into the flattened (batch * seqlen)
    positions, cu_seqlens int32 (batch + 1,), max_seqlen_in_batch int, seqused int32 (batch,) = number
    of valid tokens of attention_mask alone).
    """
    used = attention_mask != 0
    selected = used if unused_mask is None else torch.logical_or(used, unused_mask != 0)
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    seqused = used.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    max_seqlen_in_batch = int(seqlens.max().item()) if seqlens.numel() > 0 else 0
    cu_seqlens = torch.zeros(seqlens.numel() + 1, dtype=torch.int32, device=seqlens.device)
    cu_seqlens[1:] = torch.cumsum(seqlens, dim=0)
    batch, seqlen = hidden_states.shape[0], hidden_states.shape[1]
    flat = hidden_states.reshape(batch * seqlen, *hidden_states.shape[2:])
    return flat.index_select(0, indices), indices, cu_seqlens, max_seqlen_in_batch, seqused


def pad_input(hidden_states, indices, batch, seqlen):
    """hidden_states (total, ...) placed at the flattened positions indices of a zero (batch, seqlen, ...)."""
    rest = tuple(hidden_states.shape[1:])
    out = hidden_states.new_zeros((batch * seqlen, *rest))
    out = out.index_put((indices.long(),), hidden_states)
    return out.reshape(batch, seqlen, *rest)


__all__ = ["pad_input", "unpad_input"]
