"""Writing lockfiles: uv resolves each env's requirement sets against PyPI (network), for every Python.
The planner (flashkit.plan) only reads and checks lockfiles; this is the one part of locking that runs a tool."""
