"""Exceptions raised on the host, before any kernel launches, so callers can tell bad input
(fix the call) from an unsupported machine (use another GPU or backend)."""


class UnsupportedInputError(ValueError):
    """A tensor's dtype, shape, layout or an argument is outside what the kernels handle."""


class UnsupportedDeviceError(RuntimeError):
    """The device (CPU without the Triton interpreter, or a GPU architecture) cannot run the call."""


class BackendUnavailableError(RuntimeError):
    """FLASH_KERNELS_BACKEND forces a backend that is not built or does not support this call."""


class CacheCapacityError(UnsupportedInputError, RuntimeError):
    """A KV-cache call's keys (cache_seqlens, plus the appended ones) do not fit the cache or the
    pages its block_table addresses. A RuntimeError too, as flash_attn raises it."""
