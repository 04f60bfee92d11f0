"""What this project's hosts can do with an env, derived from measured host facts (listed below).

The statement is computed, not hand-written per env, so it stays true when an env changes. Facts:
- Build host: no GPU; reaches PyPI and Debian's mirror only (no Docker Hub, nvcr.io, quay); base
  images can only be made locally with mmdebstrap (Debian bookworm/trixie).
- GPU host: one H200 (sm_90), Python 3.12, torch 2.11.0+cu130, no docker and no network: a wheel built
  for that torch, or a stable-ABI wheel for an older torch of the stable ABI (2.10+), travels there and can
  be tested on the GPU; a CUDA 12 wheel runs there with its env's pinned CUDA 12 runtime wheel beside
  torch's (measured 2026-12-04). A version-bound wheel for another torch cannot load there: its env can
  still get GPU evidence through identical device code (``gpu_evidence: [..., device-code]``).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

GPU_HOST_TORCH_SERIES = "2.11"
GPU_HOST_CUDA_MAJOR = 13
GPU_HOST_SM = "9.0"
_UNREACHABLE = {
    "ngc": "nvcr.io is unreachable from the build host",
    "cuda": "Docker Hub (nvidia/cuda) is unreachable from the build host",
    "rocm": "Docker Hub (rocm/pytorch) is unreachable from the build host",
}


@dataclass(frozen=True)
class HostSupport:
    render: bool
    lock: bool
    build: bool
    cpu_tier: bool
    gpu_tier: bool
    why: tuple[str, ...]

    def summary(self) -> str:
        """Short form for tables: what can be done with this env on this project's hosts."""
        if not self.build:
            return "render+lock only"
        return "build, cpu+gpu tests" if self.gpu_tier else "build, cpu tests"

    def explain(self) -> str:
        return f"here: {self.summary()}; " + "; ".join(self.why)


def support(spec) -> HostSupport:
    why: list[str] = []
    flavor = spec.base.flavor
    if flavor == "debian":
        build = True
        why.append(f"base made locally with mmdebstrap ({spec.base.suite}, locked), toolchain from Debian/PyPI")
    else:
        build = False
        why.append(f"image not buildable here: {_UNREACHABLE[flavor]}")

    sm90 = any(t.split("+")[0].rstrip("af") == GPU_HOST_SM for t in spec.gpu_targets)
    cuda = build and spec.accelerator.kind == "cuda" and sm90
    same_torch = spec.torch_series == GPU_HOST_TORCH_SERIES and spec.accelerator.major == GPU_HOST_CUDA_MAJOR
    stable = spec.torch_abi == "stable" and Version(spec.torch_series) <= Version(GPU_HOST_TORCH_SERIES)
    gpu = cuda and (same_torch or stable)
    if gpu and same_torch:
        why.append("the wheel can be tested on the H200 host (same torch 2.11 + CUDA 13, sm_90 built)")
    elif gpu:
        why.append(
            f"the stable-ABI wheel can be tested on the H200 host under its torch {GPU_HOST_TORCH_SERIES}"
            + (
                ""
                if spec.accelerator.major == GPU_HOST_CUDA_MAJOR
                else ", with the env's CUDA runtime wheel beside torch's"
            )
        )
    elif spec.accelerator.kind == "rocm":
        why.append("no AMD GPU on this project's hosts")
    elif cuda and "device-code" in spec.gpu_evidence:
        why.append(
            f"its wheel cannot load on the H200 host's torch {GPU_HOST_TORCH_SERIES}: GPU evidence through "
            "identical device code (a GPU run of another env's wheel with the same cubins and PTX)"
        )
    else:
        why.append(
            f"GPU tests not possible here: the H200 host runs torch {GPU_HOST_TORCH_SERIES}+cu130 without "
            "docker, so only a wheel built for that torch can be run there"
        )
    return HostSupport(render=True, lock=True, build=build, cpu_tier=build, gpu_tier=gpu, why=tuple(why))
