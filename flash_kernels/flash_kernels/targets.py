"""The GPU a kernel is launched on (or compiled for), as far as tile selection cares.

Tile choices depend on the backend (CUDA or HIP), the architecture, the warp size and how much
shared memory (LDS on AMD) one block may use. A ``Target`` carries exactly that, so the same
selection code serves the running device (``current()``) and a device this host does not have
(``parse("hip:gfx942")``, for ahead-of-time compilation). Imports neither torch nor triton: the
AOT compiler runs where only triton is installed.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Union

# Shared memory one block may use, in bytes: the opt-in maximum on NVIDIA (what a launch with
# the attribute raised gets; Triton raises it), the LDS per workgroup on AMD.
CUDA_SHARED_BYTES = {
    80: 166912,  # A100: 163 KB
    86: 101376,
    87: 166912,
    89: 101376,
    90: 232448,  # H100/H200: 227 KB
    100: 232448,
    120: 101376,
}
HIP_LDS_BYTES = {
    "gfx90a": 65536,  # MI200
    "gfx942": 65536,  # MI300
    "gfx950": 163840,  # MI350
}
HIP_WARP_SIZE = 64  # CDNA wavefronts
CUDA_WARP_SIZE = 32
BACKENDS = ("cuda", "hip", "interpreter")


@dataclass(frozen=True)
class Target:
    backend: str  # "cuda", "hip", or "interpreter" (TRITON_INTERPRET=1: the CPU interpreter)
    arch: Union[int, str]  # CUDA: 10 * major + minor (80, 90); HIP: the gfx name ("gfx942")
    warp_size: int
    shared_bytes: int  # shared memory (LDS) per block a kernel may use

    @property
    def is_hip(self) -> bool:
        return self.backend == "hip"

    @property
    def interpreted(self) -> bool:
        return self.backend == "interpreter"

    @property
    def cuda_major(self) -> int:
        """The compute capability's major number (0 off CUDA)."""
        return self.arch // 10 if self.backend == "cuda" else 0

    @property
    def name(self) -> str:
        return f"{self.backend}:{self.arch}"

    def triton_target(self):
        """Triton's GPUTarget, for triton.compile."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


# The interpreter runs on the CPU: no shared memory limit applies, no tile is ever pruned.
INTERPRETER = Target("interpreter", "cpu", 1, 1 << 62)


def known_names() -> list[str]:
    return [f"cuda:{a}" for a in sorted(CUDA_SHARED_BYTES)] + [f"hip:{a}" for a in sorted(HIP_LDS_BYTES)]


def parse(spec: str) -> Target:
    """``cuda:80``, ``cuda:90``, ``hip:gfx90a``, ``hip:gfx942`` ... (no GPU needed).

    Only architectures whose shared-memory size is known here are accepted: a guessed size
    would make tile pruning wrong without anything saying so.
    """
    backend, sep, arch = spec.strip().partition(":")
    if sep and backend == "cuda" and arch.isdigit() and int(arch) in CUDA_SHARED_BYTES:
        return Target("cuda", int(arch), CUDA_WARP_SIZE, CUDA_SHARED_BYTES[int(arch)])
    if sep and backend == "hip" and arch in HIP_LDS_BYTES:
        return Target("hip", arch, HIP_WARP_SIZE, HIP_LDS_BYTES[arch])
    raise ValueError(f"unknown target {spec!r}; known: {', '.join(known_names())}")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def current(device=None) -> Target:
    """The target of ``device`` (a torch device or index; default: the current GPU).

    Under TRITON_INTERPRET=1 this is INTERPRETER whatever GPU is present, since the kernels
    then run on the interpreter. Without a GPU, sm_80 (the minimum the kernels support).
    """
    if interpreting():
        return INTERPRETER
    import torch

    if not torch.cuda.is_available():
        return parse("cuda:80")
    index = torch.device(device).index if device is not None and not isinstance(device, int) else device
    if index is None:
        index = torch.cuda.current_device()
    return _device_target(index, torch.version.hip is not None)


@functools.cache
def _device_target(index: int, hip: bool) -> Target:
    import torch

    props = torch.cuda.get_device_properties(index)
    if hip:
        arch = getattr(props, "gcnArchName", "").split(":")[0]
        return Target("hip", arch, getattr(props, "warp_size", HIP_WARP_SIZE), HIP_LDS_BYTES.get(arch, 65536))
    cc = 10 * props.major + props.minor
    # The device's own opt-in limit where torch reports it; the table for older torch.
    shared = getattr(props, "shared_memory_per_block_optin", 0) or CUDA_SHARED_BYTES.get(cc, 101376)
    return Target("cuda", cc, CUDA_WARP_SIZE, shared)
