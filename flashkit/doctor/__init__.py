"""`flashkit doctor`: probe an existing Python environment and diagnose it against the envs."""
