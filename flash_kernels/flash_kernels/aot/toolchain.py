"""The installed triton and its backends: whether this tool can drive them, and the facts the report
records (the ptxas version, the HIP linker)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess

from ..targets import Target
from .ptxas import ptxas_path
from .specs import TRITON_IMPORT_ERROR, triton_tiles

TESTED_TRITON = ("3.3.1", "3.6.0", "3.9.0")
TRITON_RANGE = ((3, 3), (3, 9))  # major.minor inclusive: ASTSource(fn, signature, constexprs, attrs)


class UsageError(Exception):
    """Exit 2: the command line or the environment cannot produce a report."""


def triton_version() -> str:
    if triton_tiles is None:
        raise UsageError(f"triton cannot be imported ({TRITON_IMPORT_ERROR}); pip install triton")
    import triton

    return triton.__version__


def check_triton(version: str) -> None:
    parts = re.match(r"(\d+)\.(\d+)", version)
    minor = (int(parts.group(1)), int(parts.group(2))) if parts else (0, 0)
    if not TRITON_RANGE[0] <= minor <= TRITON_RANGE[1]:
        lo, hi = (".".join(map(str, v)) for v in TRITON_RANGE)
        raise UsageError(
            f"triton {version} is not supported by flash_kernels.aot: it drives triton.compile through "
            f"ASTSource(fn, signature, constexprs, attrs) with index-tuple keys, the API of triton "
            f"{lo}.x-{hi}.x (tested: {', '.join(TESTED_TRITON)}); older versions take an AttrsDescriptor, "
            f"newer ones are untried"
        )


def check_backends(chosen: list[Target]) -> dict:
    """Each target's backend is in this triton; returns the toolchain facts for the report."""
    from triton.backends import backends

    toolchain = {}
    for t in chosen:
        name = "amd" if t.is_hip else "nvidia"
        if name not in backends:
            raise UsageError(f"the installed triton has no {name} backend, needed for {t.name}")
        if t.is_hip:
            toolchain["hip_linker"] = _hip_linker()
        else:
            toolchain["ptxas"] = _ptxas_version(t.arch)
    return toolchain


def _hip_linker() -> str:
    """Triton before 3.4 links the hsaco with an external ld.lld; later ones link in process."""
    from triton._C.libtriton import amd
    from triton.backends.amd.compiler import HIPBackend

    if hasattr(amd, "link_hsaco"):
        return "built-in"
    with contextlib.suppress(Exception):
        return str(HIPBackend.path_to_rocm_lld())
    # A distribution's LLVM (Debian: apt-get install lld-19); code object v5 needs LLD >= 16.
    for version in range(22, 15, -1):
        path = f"/usr/lib/llvm-{version}/bin/ld.lld"
        if os.path.isfile(path):
            os.environ["TRITON_HIP_LLD_PATH"] = path
            return path
    raise UsageError(
        "this triton links HIP code objects with an external ld.lld and none was found (the PyPI wheel "
        "of triton < 3.4 bundles none; pytorch-triton-rocm does). Install LLVM's lld >= 16 (Debian: "
        "apt-get install lld-19) or set TRITON_HIP_LLD_PATH"
    )


def _ptxas_version(arch: int) -> str:
    out = subprocess.run([ptxas_path(arch), "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release (\S+), V(\S+)", out)
    return found.group(2) if found else out.strip().splitlines()[-1]
