"""The ptxas -v log of a CUDA compile: registers, spills and stack frame are read from it."""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import tempfile


def ptxas_path(arch: int) -> str:
    """The ptxas triton's NVIDIA backend runs for ``arch`` (the one bundled in the wheel unless overridden)."""
    from triton.backends.nvidia import compiler as nv

    # triton 3.3 and 3.6+ pick the ptxas per arch (get_ptxas(arch)); 3.4 and 3.5 take no argument.
    takes_arch = bool(inspect.signature(nv.get_ptxas).parameters)
    tool = nv.get_ptxas(arch) if takes_arch else nv.get_ptxas()
    return tool[0] if isinstance(tool, tuple) else tool.path


class _PtxasTap:
    """Stands in for the subprocess module inside triton's NVIDIA backend to keep the log of
    the ptxas -v it runs for the cubin: the registers and spills of the very compile reported."""

    def __init__(self):
        self.logs: list[str] = []

    def __getattr__(self, name):
        return getattr(subprocess, name)

    def run(self, cmd, *args, **kwargs):
        result = subprocess.run(cmd, *args, **kwargs)
        log = kwargs.get("stderr")
        if "-v" in cmd and hasattr(log, "name"):
            with open(log.name) as f:
                self.logs.append(f.read())
        return result


@contextlib.contextmanager
def ptxas_tap():
    from triton.backends.nvidia import compiler as nv

    tap = _PtxasTap()
    saved = nv.subprocess
    nv.subprocess = tap
    try:
        yield tap
    finally:
        nv.subprocess = saved


def ptxas_rerun(ptx: str, arch: int) -> str:
    """ptxas -v on the PTX, for a cubin that came from Triton's cache (no log to tap)."""
    from triton.backends.nvidia import compiler as nv

    gpu = nv.sm_arch_from_capability(arch)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run(
            [ptxas_path(arch), "-v", f"--gpu-name={gpu}", src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        )
    return done.stderr + done.stdout
