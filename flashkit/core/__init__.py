"""Foundations every layer uses: errors and exit codes, atomic writes, repository paths, host memory."""
