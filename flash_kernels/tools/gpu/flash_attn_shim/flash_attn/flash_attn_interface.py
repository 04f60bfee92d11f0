"""flash_attn.flash_attn_interface shim (flash_kernels/tools/gpu/flash_attn_upstream.py).

Re-exports the public functions and the two helpers tests/test_flash_attn.py imports. flash_attn's
private C++ entry points (flash_attn_gpu, _flash_attn_forward, ...) are deliberately absent.
"""

import torch

import flash_attn
from flash_attn import SINGLE_KEY_BLOCK

globals().update({name: getattr(flash_attn, name) for name in flash_attn.__all__})
USE_TRITON_ROCM = getattr(torch.version, "hip", None) is not None


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """Key-block width of S_dmask's scaling: one block wider than any key length (see flash_attn/__init__.py)."""
    return SINGLE_KEY_BLOCK


__all__ = [*flash_attn.__all__, "USE_TRITON_ROCM", "_get_block_size_n"]
