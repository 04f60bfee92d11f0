"""flash_attn.layers shim (flash_kernels/tools/gpu/flash_attn_upstream.py): only rotary."""
