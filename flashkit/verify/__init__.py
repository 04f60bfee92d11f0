"""The verification tiers: what runs in a built image (build, abi, cpu, gpu) and the Triton ahead-of-time
compile (triton-aot), each giving an outcome that the ledger records."""
