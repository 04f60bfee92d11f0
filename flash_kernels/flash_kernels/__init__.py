"""FlashAttention for PyTorch with flash_attn's API: Triton kernels everywhere, a CUDA C++ path
on NVIDIA sm_80+ when built. Change ``from flash_attn import ...`` to
``from flash_kernels import ...``; see interface.py for the few documented differences."""

from importlib.util import find_spec as _find_spec

from .errors import (
    BackendUnavailableError,
    CacheCapacityError,
    UnsupportedDeviceError,
    UnsupportedInputError,
)

if _find_spec("torch") is not None:
    from .interface import (
        flash_attn_func,
        flash_attn_kvpacked_func,
        flash_attn_qkvpacked_func,
        flash_attn_varlen_func,
        flash_attn_varlen_kvpacked_func,
        flash_attn_varlen_qkvpacked_func,
        flash_attn_with_kvcache,
    )
    from .out_of_memory import prepare_kernels
else:
    # Without torch only the ahead-of-time compiler (python -m flash_kernels.aot, which needs
    # triton alone) can work; the API says why it is missing instead of a bare NameError.
    def __getattr__(name):
        if name.startswith("flash_attn"):
            raise ImportError(f"flash_kernels.{name} needs torch, which is not installed")
        raise AttributeError(f"module 'flash_kernels' has no attribute {name!r}")

__all__ = [
    "BackendUnavailableError",
    "CacheCapacityError",
    "UnsupportedDeviceError",
    "UnsupportedInputError",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "prepare_kernels",
]
