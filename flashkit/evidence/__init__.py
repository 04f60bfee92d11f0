"""Standard-library-only evidence readers and the GPU-host tier runner (they run where flashkit is not installed)."""
