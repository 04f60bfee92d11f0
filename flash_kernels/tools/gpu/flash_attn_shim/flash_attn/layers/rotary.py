"""flash_attn.layers.rotary shim in plain torch (flash_kernels/tools/gpu/flash_attn_upstream.py)."""

import torch


def _positions(x, seqlen_offsets, cu_seqlens, seqlen_ro):
    """Rotary position of every token: (batch, seqlen) for the padded form, (total,) for cu_seqlens."""
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        steps = torch.arange(seqlen, device=x.device, dtype=torch.long)
        if isinstance(seqlen_offsets, torch.Tensor):
            if tuple(seqlen_offsets.shape) != (batch,):
                raise ValueError(f"seqlen_offsets must have shape ({batch},); got {tuple(seqlen_offsets.shape)}")
            return seqlen_offsets.to(device=x.device, dtype=torch.long)[:, None] + steps[None, :]
        if int(seqlen_offsets) + seqlen > seqlen_ro:
            raise ValueError(f"seqlen_offsets {int(seqlen_offsets)} + seqlen {seqlen} > rotary length {seqlen_ro}")
        return (steps + int(seqlen_offsets))[None, :].expand(batch, seqlen)
    total = x.shape[0]
    cu = cu_seqlens.to(device=x.device, dtype=torch.long)
    nseq = cu.numel() - 1
    token = torch.arange(total, device=x.device, dtype=torch.long)
    seq = torch.bucketize(token, cu[1:], right=True)  # sequence holding each token (nseq: past the end)
    inside = seq < nseq
    seq = seq.clamp(max=max(nseq - 1, 0))
    if isinstance(seqlen_offsets, torch.Tensor):
        offsets = seqlen_offsets.to(device=x.device, dtype=torch.long)[seq]
    else:
        offsets = int(seqlen_offsets)
    pos = token - cu[seq] + offsets
    # Tokens past cu_seqlens[-1] get an out-of-range position: they pass through unrotated.
    return torch.where(inside, pos, torch.full_like(pos, -1))


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """Rotary embedding on the first rotary_dim = 2 * cos.shape[-1] dims of x; the rest pass through.

    x: (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens (batch + 1,).
    cos, sin: (seqlen_ro, rotary_dim / 2). Token i of sequence b sits at position seqlen_offsets + i
    (seqlen_offsets an int or a (batch,) tensor). interleaved=True rotates the pairs (2j, 2j + 1)
    (GPT-J), False the halves (j, j + rotary_dim / 2) (GPT-NeoX), both by angle j of that position:
    (a, b) -> (a cos - b sin, a sin + b cos). Positions outside [0, seqlen_ro) are left unrotated
    (cos 1, sin 0), as flash_attn's kernel does. Math in float32; returns x's dtype (with inplace,
    writes into x and returns it). max_seqlen is accepted for the signature and unused.
    """
    if cos.dim() != 2 or tuple(sin.shape) != tuple(cos.shape):
        raise ValueError(f"cos and sin must both be (seqlen_ro, rotary_dim / 2); got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}")
    seqlen_ro, half = cos.shape
    rotary_dim = 2 * half
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} must be <= headdim {x.shape[-1]}")
    pos = _positions(x, seqlen_offsets, cu_seqlens, seqlen_ro)
    valid = ((pos >= 0) & (pos < seqlen_ro)).unsqueeze(-1)
    index = pos.clamp(0, max(seqlen_ro - 1, 0))
    cos_f = cos.to(device=x.device, dtype=torch.float32)[index]
    sin_f = sin.to(device=x.device, dtype=torch.float32)[index]
    cos_f = torch.where(valid, cos_f, torch.ones_like(cos_f)).unsqueeze(-2)  # broadcast over heads
    sin_f = torch.where(valid, sin_f, torch.zeros_like(sin_f)).unsqueeze(-2)
    xr = x[..., :rotary_dim].float()
    if interleaved:
        a, b = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack((a * cos_f - b * sin_f, a * sin_f + b * cos_f), dim=-1).flatten(-2)
    else:
        a, b = xr[..., :half], xr[..., half:]
        rotated = torch.cat((a * cos_f - b * sin_f, a * sin_f + b * cos_f), dim=-1)
    rotated = rotated.to(x.dtype)
    if inplace:
        x[..., :rotary_dim] = rotated
        return x
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


__all__ = ["apply_rotary_emb"]
