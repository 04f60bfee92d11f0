"""FlashAttention for PyTorch with flash_attn's API: Triton kernels everywhere, a CUDA C++ path
on NVIDIA sm_80+ when built. Change ``from flash_attn import ...`` to
``from flash_kernels import ...``; see interface.py for the few documented differences."""

from .errors import BackendUnavailableError, UnsupportedDeviceError, UnsupportedInputError
from .interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__all__ = [
    "BackendUnavailableError",
    "UnsupportedDeviceError",
    "UnsupportedInputError",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]
