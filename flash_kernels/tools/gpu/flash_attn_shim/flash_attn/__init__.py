"""flash_attn import shim over flash_kernels, written by flash_kernels/tools/gpu/flash_attn_upstream.py.

It lets flash-attention's own tests/test_flash_attn.py run unchanged against flash_kernels. The seven
public functions are flash_kernels'. The six non-kvcache ones, called with return_attn_probs=True,
return S_dmask rescaled from flash_kernels' convention to the one the upstream test helpers assume:

flash_attn documents S_dmask only as "the output of softmax (possibly with different scaling)".
flash_kernels returns the probabilities P (negated where dropout dropped the element, zeros in
padding; (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128)). The test's
normalize_flash_attn_S expects flash_attn's internal scaling, exp(S - m) per key block of
_get_block_size_n columns, and multiplies each block by exp(m - lse). This shim uses ONE key block:
flash_attn_interface._get_block_size_n returns SINGLE_KEY_BLOCK, wider than any key length, so m is
the row maximum of the scores, and S_dmask is returned as P / max_j |P| per row (= exp(S - m), since
max_j P = exp(m - lse)), computed in float32 and cast back to S_dmask's dtype; the sign is kept
(dropped entries stay negative) and all-zero rows (padding, fully masked rows) stay zero.
"""

import functools

import torch

import flash_kernels as _fk
from flash_kernels import flash_attn_with_kvcache  # noqa: F401 (exported as it is)

__version__ = "0+flash_kernels.shim"

# Key-block width reported by flash_attn_interface._get_block_size_n: wider than any key length.
SINGLE_KEY_BLOCK = 1 << 30


def _rescale_s_dmask(s_dmask):
    """P (sign = dropout keep/drop) -> P / max_j |P| per row, in float32, back to s_dmask's dtype."""
    with torch.no_grad():
        p = s_dmask.float()
        row_max = p.abs().amax(dim=-1, keepdim=True)
        nonzero = row_max > 0
        scaled = torch.where(nonzero, p / torch.where(nonzero, row_max, torch.ones_like(row_max)), p)
        return scaled.to(s_dmask.dtype)


def _with_single_block_s_dmask(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        result = fn(*args, **kwargs)
        if isinstance(result, tuple) and len(result) == 3 and isinstance(result[2], torch.Tensor):
            return (result[0], result[1], _rescale_s_dmask(result[2]))
        return result

    return wrapper


# flash_kernels' public functions; every one but flash_attn_with_kvcache (no S_dmask) gets the rescaling.
__all__ = [name for name in _fk.__all__ if name.startswith("flash_attn")]
for _name in __all__:
    if _name != "flash_attn_with_kvcache":
        globals()[_name] = _with_single_block_s_dmask(getattr(_fk, _name))
del _name
