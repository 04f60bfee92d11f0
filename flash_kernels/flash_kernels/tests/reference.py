"""Plain PyTorch attention: the float32 reference and the same computation in the input dtype.

The acceptance criterion (flash-attention's): for the output and each gradient,
    max|ours - ref32| <= 2 * max|torch_in_dtype - ref32| + slack,
where ref32 is this function on float32-upcast inputs, torch_in_dtype is this function on the
inputs as given (matmuls and softmax in fp16/bf16), and the slack is half a unit in the last
place of the input dtype at the reference's largest magnitude (fp16 2^-11, bf16 2^-8,
fp32 2^-24 relative) plus an absolute 1e-4 (fp16/bf16; a tenth of an fp16 ulp at 1.0) or
1e-5 (fp32). The slack covers results that torch happens to compute exactly (seqlen_k = 1:
out = v and dk = 0 exactly) while a correct kernel still rounds, or cancels to ~1e-6.
"""

from __future__ import annotations

import math

import torch

HALF_ULP = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
ABS_SLACK = {torch.float16: 1e-4, torch.bfloat16: 1e-4, torch.float32: 1e-5}


def attention_ref(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
                  softmax_scale=None, seqlens_k=None, key_leftpad=None, dropout_mask=None,
                  dropout_p=0.0, upcast=True, return_probs=False):
    """q (b, sq, hq, d); k, v (b, sk, hk, d). Returns (out, lse) with out in q's dtype
    (float32 when upcast). seqlens_k (b,) limits the keys of each batch row (KV cache);
    key_leftpad (b,) masks the keys before it (a left-padded cache, positions unchanged).
    dropout_mask (b, hq, sq, sk) bool keeps the probabilities where True, scaled by 1/(1-p);
    the lse is that of the probabilities before dropout. return_probs adds the probabilities
    (b, hq, sq, sk) before dropout as a third result."""
    dtype = torch.float32 if upcast else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    batch, seqlen_q, nheads_q, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    group = nheads_q // nheads_k
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if seqlens_k is None:
        seqlens_k = torch.full((batch,), seqlen_k, dtype=torch.long, device=q.device)
    sk_b = seqlens_k.long().view(batch, 1, 1, 1)
    rows = torch.arange(seqlen_q, device=q.device).view(1, 1, -1, 1)
    cols = torch.arange(seqlen_k, device=q.device).view(1, 1, 1, -1)
    key_pos = rows + sk_b - seqlen_q  # bottom-right alignment
    keep = cols < sk_b
    if key_leftpad is not None:
        keep = keep & (cols >= key_leftpad.long().view(batch, 1, 1, 1))
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        keep = keep & (cols >= key_pos - left)
    if right >= 0:
        keep = keep & (cols <= key_pos + right)
    if alibi_slopes is not None:
        slopes = alibi_slopes.float()
        slopes = slopes.view(1, nheads_q, 1, 1) if slopes.dim() == 1 else slopes.view(batch, nheads_q, 1, 1)
        scores = scores + (-slopes * (key_pos - cols).abs()).to(scores.dtype)
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores.float(), dim=-1)
    attn = torch.softmax(scores, dim=-1).to(v.dtype)
    attn = attn.masked_fill(~keep.any(dim=-1, keepdim=True), 0.0)  # rows that see no key
    probs = attn
    if dropout_mask is not None:
        attn = attn.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", attn, v)
    return (out, lse, probs) if return_probs else (out, lse)


def attention_grads_rounded(q, k, v, dout, **kwargs):
    """(dq, dk, dv) of the FlashAttention backward with its roundings and nothing else: float32
    arithmetic on the input-dtype values, the output rounded to the input dtype before
    D = rowsum(dO * O), dS and the dropped probabilities rounded before the matmuls that take them.
    torch's autograd never forms D, so where D's rounding does not cancel (a query with one visible
    key under dropout, where dq = dk = 0 exactly) it alone computes exactly; the criterion then
    allows twice the error of this computation (check_close's ``pt``)."""
    assert not kwargs.get("softcap"), "softcap's derivative is not modelled here"
    dtype = q.dtype
    out32, _, probs = attention_ref(q, k, v, return_probs=True, **kwargs)  # float32 from dtype values
    out = out32.to(dtype).float()
    q, k, v, dout = (t.float() for t in (q, k, v, dout))
    batch, _, nheads_q, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    group = nheads_q // nheads_k
    kk, vv = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scale = kwargs.get("softmax_scale") or 1.0 / math.sqrt(head_dim)
    mask, p = kwargs.get("dropout_mask"), kwargs.get("dropout_p", 0.0)
    kept = probs if mask is None else probs.masked_fill(~mask, 0.0) / (1.0 - p)
    dv = torch.einsum("bhqk,bqhd->bkhd", kept.to(dtype).float(), dout)
    dp = torch.einsum("bqhd,bkhd->bhqk", dout, vv)
    if mask is not None:
        dp = dp.masked_fill(~mask, 0.0) / (1.0 - p)
    delta = (dout * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, q, 1)
    ds = (probs * (dp - delta)).to(dtype).float()
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    fold = (batch, seqlen_k, nheads_k, group, head_dim)
    return tuple(t.to(dtype) for t in (dq, dk.reshape(fold).sum(3), dv.reshape(fold).sum(3)))


def slack(ref: torch.Tensor, dtype: torch.dtype) -> float:
    return HALF_ULP[dtype] * ref.abs().max().item() + ABS_SLACK[dtype]


def check_close(name: str, ours: torch.Tensor, ref: torch.Tensor, pt: torch.Tensor,
                dtype: torch.dtype) -> None:
    """Raise AssertionError unless ours meets the criterion described in the module docstring."""
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(ours).any(), f"{name}: NaN in the result (unwritten or bad element)"
    err = (ours.float() - ref.float()).abs().max().item()
    pt_err = (pt.float() - ref.float()).abs().max().item()
    bound = 2 * pt_err + slack(ref, dtype)
    assert err <= bound, (f"{name}: max error {err:.3e} > bound {bound:.3e} "
                          f"(2 x torch-in-{dtype} error {pt_err:.3e} + slack)")


def rotary_ref(x, cos, sin, positions, interleaved: bool, upcast: bool = True):
    """x (b, s, h, d) rotated at positions (b, s) (long) by cos/sin (seqlen_ro, rotary_dim / 2),
    in float32 (round to x's dtype to compare with a kernel that rounds once), or with upcast
    False in x's dtype throughout (the "same computation in the input dtype"). Positions past
    the table are left unrotated, as the kernels do."""
    half = cos.shape[1]
    rot = 2 * half
    dtype = torch.float32 if upcast else x.dtype
    x32 = x.to(dtype)
    in_range = (positions < cos.shape[0]).unsqueeze(-1)
    idx = positions.clamp(max=cos.shape[0] - 1)
    c = torch.where(in_range, cos.to(dtype)[idx], 1.0).unsqueeze(2)  # (b, s, 1, half)
    s_ = torch.where(in_range, sin.to(dtype)[idx], 0.0).unsqueeze(2)
    xr = x32[..., :rot]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * c - x2 * s_, x2 * c + x1 * s_), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        out = torch.cat((x1 * c - x2 * s_, x2 * c + x1 * s_), dim=-1)
    return torch.cat((out, x32[..., rot:]), dim=-1)
