"""Env specs: the typed value of ``envs/<id>.yaml``, and loading it from the repository.

The values are frozen dataclasses; :mod:`flashkit.plan.specfile` builds them from the YAML text and
reports every problem with its line and field. ``normalized()`` is the canonical plain-data form that
the input hash covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from flashkit.core import paths
from flashkit.plan import compat
from flashkit.plan.envid import EnvId

SCHEMA_VERSION = 1

ACCEL_KINDS = ("cuda", "rocm")
COMPILER_SOURCES = ("base-image", "debian", "pypi")
BACKENDS = ("cuda", "triton")
FLAVORS = ("ngc", "cuda", "rocm", "debian")


@dataclass(frozen=True)
class Accelerator:
    kind: str  # "cuda" | "rocm"
    version: str  # "12.4"

    @property
    def parsed(self) -> Version:
        return Version(self.version)

    @property
    def major(self) -> int:
        return self.parsed.major

    def __str__(self) -> str:
        return f"{'CUDA' if self.kind == 'cuda' else 'ROCm'} {self.version}"


@dataclass(frozen=True)
class Compiler:
    source: str  # "base-image" | "debian" | "pypi"
    version: str | None  # exact Debian package version, exact PyPI nvcc version, or None (base image)


@dataclass(frozen=True)
class Base:
    flavor: str  # "ngc" | "cuda" | "rocm" | "debian"
    ref: str  # readable reference with tag, e.g. "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
    digest: str | None  # "sha256:..." or None when no digest can be had (then digest_note says why)
    digest_note: str | None
    suite: str | None  # Debian suite for the debian flavor ("trixie")
    runtime_ref: str | None = None  # a different (compiler-free) image for the runtime stage
    runtime_digest: str | None = None

    @property
    def pinned(self) -> bool:
        return self.digest is not None and (self.runtime_ref is None or self.runtime_digest is not None)

    @property
    def pin_state(self) -> str:
        """ "pinned" (registry digest), "local" (made here by mmdebstrap at the base lock's versions; its id follows from the lock)
        or "unpinned" (a registry image without a known digest)."""
        if self.flavor == "debian":
            return "local"
        return "pinned" if self.pinned else "unpinned"

    @property
    def image(self) -> str:
        """The FROM reference of the builder stage: pinned by digest when one is known."""
        return f"{self.ref}@{self.digest}" if self.digest else self.ref

    @property
    def runtime_image(self) -> str:
        if self.runtime_ref is None:
            return self.image
        return f"{self.runtime_ref}@{self.runtime_digest}" if self.runtime_digest else self.runtime_ref

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


GPU_EVIDENCE = ("own", "wheel-from", "device-code")


def default_gpu_evidence(wheel_from: str | None) -> tuple[str, ...]:
    """What an env accepts when its spec does not say: its own verdicts, and its wheel source's."""
    return ("own", "wheel-from") if wheel_from else ("own",)


@dataclass(frozen=True)
class EnvSpec:
    id: EnvId
    source: Path  # repo-relative path of the YAML file
    python: str
    torch: str
    cxx11_abi: bool
    accelerator: Accelerator
    compiler: Compiler
    gpu_targets: tuple[str, ...]
    backends: tuple[str, ...]
    base: Base
    publish_tags: tuple[str, ...]
    lock_exclude_newer: str  # RFC 3339 instant given to the resolver so re-locking is reproducible
    kernel_source: str = paths.KERNELS_DIR
    notes: str | None = None
    # Another env whose builder's wheel this env installs instead of compiling its own (a stable-ABI wheel
    # serves every torch >= 2.10 of its CUDA major); checked against that env by flashkit.plan.plan.
    wheel_from: str | None = None
    # Which GPU evidence this env's publish gate accepts (`gpu_evidence:`). A verification policy, not a
    # build input: it is left out of the input hash, so declaring it never voids a build or its verdicts.
    #   own          a gpu or artifact-gpu verdict on this env's own image or wheel;
    #   wheel-from   the source env's artifact-gpu on the very wheel this image installs (wheel_from);
    #   device-code  another env's artifact-gpu on a wheel whose device code is identical to this wheel's.
    gpu_evidence: tuple[str, ...] = ("own",)
    schema: int = SCHEMA_VERSION

    @property
    def torch_source(self) -> str:
        """Where torch comes from: the base image (NGC, ROCm) or PyPI wheels pinned in the lockfile."""
        return "base-image" if self.base.flavor in ("ngc", "rocm") else "pypi"

    @property
    def torch_version(self) -> Version:
        return Version(self.torch)

    @property
    def torch_abi(self) -> str:
        """How flash_kernels' extension binds to torch (FLASH_KERNELS_TORCH_ABI): "stable" (torch's stable
        C ABI: one wheel for this torch and every later one) where the env's torch has it, else "version"."""
        cuda = self.accelerator.kind == "cuda" and "cuda" in self.backends
        return "stable" if cuda and self.torch_version >= compat.STABLE_ABI_MIN_TORCH else "version"

    @property
    def torch_series(self) -> str:
        return compat.series(self.torch)

    def normalized(self) -> dict[str, Any]:
        """Canonical plain-data form: what the input hash covers (not the YAML bytes, so comments
        and key order do not change an image's identity)."""
        return {
            "schema": self.schema,
            "id": str(self.id),
            "python": self.python,
            "torch": self.torch,
            "cxx11_abi": self.cxx11_abi,
            "accelerator": {"kind": self.accelerator.kind, "version": self.accelerator.version},
            "compiler": {"source": self.compiler.source, "version": self.compiler.version},
            "gpu_targets": list(self.gpu_targets),
            "backends": list(self.backends),
            "base": {
                "flavor": self.base.flavor,
                "ref": self.base.ref,
                "digest": self.base.digest,
                "suite": self.base.suite,
                "runtime_ref": self.base.runtime_ref,
                "runtime_digest": self.base.runtime_digest,
            },
            "publish_tags": list(self.publish_tags),
            "lock_exclude_newer": self.lock_exclude_newer,
            "kernel_source": self.kernel_source,
            # Only when set, so an env without it keeps the hash it had before the field existed.
            **({"wheel_from": self.wheel_from} if self.wheel_from else {}),
        }


__all__ = ["Accelerator", "Base", "Compiler", "EnvSpec"]
