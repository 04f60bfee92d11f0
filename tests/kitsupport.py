"""Helpers shared by the kit's tests (importable as `kitsupport`; a unique name, unlike `conftest`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A tiny stand-in for flash_kernels: the kit only hashes and COPYs these files, it never builds them.
FAKE_KERNELS = {
    "flash_kernels/pyproject.toml": '[project]\nname = "flash_kernels"\nversion = "0.0.0"\n',
    "flash_kernels/flash_kernels/__init__.py": '"""stand-in"""\n',
    "flash_kernels/csrc/kernel.cu": "// stand-in\n__global__ void k() {}\n",
}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with its content hash: to prove a failing command wrote nothing."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath, f)
            out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
