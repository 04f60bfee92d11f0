"""Reading compiled artifacts: ELF dynamic symbols, symbol versions, CUDA fatbins."""
