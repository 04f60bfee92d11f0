"""The kernel test suite shipped with flash_kernels; run it with ``python -m flash_kernels.selftest``."""
