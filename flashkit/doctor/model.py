"""The values doctor works with: findings, the target the modules must run on, recommendations."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from flashkit.binary.torch_abi import STABLE_LABEL
from flashkit.core.errors import EXIT_DOCTOR_PROBLEMS as EXIT_PROBLEMS
from flashkit.core.errors import EXIT_DOCTOR_UNINSPECTED as EXIT_UNINSPECTED

EXIT_HEALTHY = 0
SCHEMA_VERSION = 1
SEVERITIES = ("error", "warning", "info", "uninspected")
TORCH_LIBS = re.compile(r"^lib(c10|torch|shm|caffe2)[\w.-]*\.so")
# Minimum Linux driver for each CUDA major under minor-version compatibility
# (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions").
MIN_DRIVER_FOR_CUDA = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def vkey(text: str) -> tuple[int, ...]:
    """A version's numbers, for ordering: "580.65.06" -> (580, 65, 6). A number longer than any version's is
    taken as the largest (int() of one over 4300 digits raises, and takes quadratic time below that)."""
    return tuple(int(x) if len(x) <= 30 else 10**30 for x in re.findall(r"\d+", text))


def capability(text: str) -> tuple[int, int]:
    """ "9.0" -> (9, 0); ValueError for anything else."""
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


@dataclasses.dataclass(frozen=True)
class BuildLabel:
    """The torch/CUDA a wheel says it was built for, from its local version label.

    flash_kernels (``0.1.0+cu130torch2.11cxx11abitrue``) and flash-attn's release
    wheels (``+cu12torch2.6cxx11abiFALSE``) spell it the same way: bound to that torch minor.
    A stable-ABI wheel (``+cu13stable2.10``, ``stable`` True) names the oldest torch it fits
    instead: it fits that torch and every later one of its CUDA major.
    """

    torch: str  # "2.11"; for a stable wheel the oldest torch it fits, "2.10"
    cuda: str | None = None  # "13.0", or "12" when the label names only the major
    rocm: str | None = None
    cxx11_abi: bool | None = None  # None for a stable wheel: only C symbols cross into libtorch
    stable: bool = False

    def fits_torch(self, version: str) -> bool:
        """Whether a torch of ``version`` ("2.13.0+cu130") is one this label's torch part fits."""
        here = ".".join(re.findall(r"\d+", version)[:2])
        return vkey(here) >= vkey(self.torch) if self.stable else here == self.torch


_BUILD_LABEL = re.compile(
    r"(?:cu(?P<cu>\d+)|rocm(?P<rocm>\d+(?:\.\d+)*))?torch(?P<torch>\d+\.\d+)(?:cxx11abi(?P<abi>true|false))?",
    re.IGNORECASE,
)


def _cuda_of_label(digits: str) -> str:
    """cu130 -> "13.0"; cu12 -> "12" (the major only)."""
    return digits if len(digits) <= 2 else f"{digits[:-1]}.{digits[-1]}"


def build_label(version: str) -> BuildLabel | None:
    if "+" not in version:
        return None
    local = version.split("+", 1)[1]
    stable = STABLE_LABEL.search(local)
    if stable:
        torch = f"{stable.group('major')}.{stable.group('minor')}"
        return BuildLabel(torch, _cuda_of_label(stable.group("cu")), stable=True)
    m = _BUILD_LABEL.search(local)
    if not m:
        return None
    cuda = _cuda_of_label(m.group("cu")) if m.group("cu") else None
    abi = m.group("abi")
    return BuildLabel(m.group("torch"), cuda, m.group("rocm"), None if abi is None else abi.lower() == "true")


@dataclasses.dataclass(frozen=True)
class Verification:
    """What an env's ledger says at its current input hash, as doctor shows it."""

    status: str  # one line: each tier's verdict, or why there is none
    verified: bool  # the latest build passes the publish policy asked for (default: full)
    published: tuple[str, ...] = ()  # REPOSITORY@DIGEST and REPOSITORY:TAG of publications at the input hash
    input_hash: str | None = None
    why_not: tuple[str, ...] = ()  # the gate's reasons when not verified
    evidence: tuple[str, ...] = ()  # how the GPU verdict that passed reaches the build (own, wheel_from, device code)


@dataclasses.dataclass(frozen=True)
class Finding:
    severity: str
    code: str
    subject: str
    what: str
    cause: str | None = None
    fix: str | None = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")


@dataclasses.dataclass(frozen=True)
class Target:
    """What the modules must run on: derived from the facts, or stated (a policy, a GPU to come)."""

    python: tuple[int, int] | None = None
    glibc: str | None = None
    glibc_policy: str | None = None  # "manylinux_2_28": check modules against it too
    torch_version: str | None = None
    torch_cxx11_abi: bool | None = None
    torch_cuda: str | None = None  # torch.version.cuda
    capabilities: tuple[str, ...] = ()  # GPU compute capabilities "9.0"


@dataclasses.dataclass(frozen=True)
class Candidate:
    env: str
    score: int
    matches: tuple[str, ...]
    differences: tuple[str, ...]  # for people
    mismatched: tuple[str, ...] = ()  # the spec fields that differ: "torch", "python", "gpu_targets", ...
    blocking: tuple[str, ...] = ()  # the differences that rule the env's build out (not a patch, a CUDA minor)


@dataclasses.dataclass(frozen=True)
class Query:
    """What an env is matched against: an inspected environment (doctor) or a user's words (resolve)."""

    accelerator: str | None = None  # "cuda" | "rocm"
    torch: str | None = None  # "2.9.1", "2.7.1+cu126"
    accel_version: str | None = None  # torch's CUDA or HIP version, "12.8"
    cxx11_abi: bool | None = None
    python: str | None = None  # "3.12"
    driver: str | None = None  # without a torch: the GPU driver decides what CUDA runs
    capabilities: tuple[str, ...] = ()  # GPU compute capabilities "9.0"


@dataclasses.dataclass(frozen=True)
class Recommendation:
    env: str | None
    exact: bool
    reason: str
    differences: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()
    verification: str = "not verified"
    lockfile: str | None = None  # the env's requirements for the inspected Python (else its merged file)
    install: tuple[str, ...] = ()  # the exact pip and uv commands for the inspected Python
    python_note: str | None = None  # why the env's requirements do not cover the inspected Python
    publication_note: str | None = None  # covered, but nothing of the env is published: no command to give
    publish_tags: tuple[str, ...] = ()
    add_spec: str | None = None
    candidates: tuple[Candidate, ...] = ()


@dataclasses.dataclass(frozen=True)
class RepoProblem:
    """Why no env could be recommended (the checkout or flashkit's dependencies are missing)."""

    what: str
    fix: str


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    findings: tuple[Finding, ...]
    recommendation: Recommendation | None

    @property
    def exit_code(self) -> int:
        severities = {f.severity for f in self.findings}
        if "error" in severities:
            return EXIT_PROBLEMS
        if "uninspected" in severities:
            return EXIT_UNINSPECTED
        return EXIT_HEALTHY

    @property
    def status(self) -> str:
        return {EXIT_HEALTHY: "healthy", EXIT_PROBLEMS: "problems", EXIT_UNINSPECTED: "uninspected"}[self.exit_code]


# ---------------------------------------------------------------------------
