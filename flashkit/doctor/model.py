"""The values doctor works with: findings, the target the modules must run on, recommendations."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from flashkit.core.errors import EXIT_DOCTOR_PROBLEMS as EXIT_PROBLEMS
from flashkit.core.errors import EXIT_DOCTOR_UNINSPECTED as EXIT_UNINSPECTED

EXIT_HEALTHY = 0
SCHEMA_VERSION = 1
SEVERITIES = ("error", "warning", "info", "uninspected")
# C++ namespaces of torch's own API: an undefined symbol in them means "built for another torch".
TORCH_NAMESPACES = ("c10::", "at::", "torch::", "caffe2::")
TORCH_LIBS = re.compile(r"^lib(c10|torch|shm|caffe2)[\w.-]*\.so")
# Minimum Linux driver for each CUDA major under minor-version compatibility
# (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions").
MIN_DRIVER_FOR_CUDA = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def vkey(text: str) -> tuple[int, ...]:
    """A version's numbers, for ordering: "580.65.06" -> (580, 65, 6)."""
    return tuple(int(x) for x in re.findall(r"\d+", text))


def capability(text: str) -> tuple[int, int]:
    """ "9.0" -> (9, 0); ValueError for anything else."""
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


@dataclasses.dataclass(frozen=True)
class Verification:
    """What an env's ledger says at its current input hash, as doctor shows it."""

    status: str  # one line: each tier's verdict, or why there is none
    verified: bool  # the latest build passes the publish policy asked for (default: full)
    published: tuple[str, ...] = ()  # REPOSITORY@DIGEST and REPOSITORY:TAG of publications at the input hash
    input_hash: str | None = None
    why_not: tuple[str, ...] = ()  # the gate's reasons when not verified


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
