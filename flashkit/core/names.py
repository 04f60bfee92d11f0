"""Names shared by every layer: the verification tiers, what each one judges, and the label namespace."""

from __future__ import annotations

import enum

LABEL_PREFIX = "io.flashkit."


def label(name: str) -> str:
    """``io.flashkit.<name>``: the one namespace of every image label flashkit writes or reads."""
    return LABEL_PREFIX + name


class Subject(enum.StrEnum):
    """The kind of artifact a tier judges; a verdict names one digest of this kind."""

    IMAGE = "image"  # the runtime image's id (sha256 of its config)
    WHEEL = "wheel"  # the exported flash_kernels wheel's sha256
    # The kernel package's source files: sha256 over their sorted (path, mode, sha256), the same list the input
    # hash covers. What a compile-only tier judges, where no image of the env can be built here (ROCm, NGC).
    SOURCE = "source"


class Tier(enum.StrEnum):
    """The verification tiers, in the order they run and are shown."""

    BUILD = "build"  # the wheel's compiled objects hold exactly the spec's CUDA code
    ABI = "abi"  # every undefined symbol resolves inside the runtime image
    CPU = "cpu"  # the kernel suite's CPU tier inside the runtime container
    GPU = "gpu"  # the suite's GPU tier inside the container with --gpus all
    ARTIFACT_GPU = "artifact-gpu"  # the exported wheel's GPU suite on a GPU host without docker
    TRITON_AOT = "triton-aot"  # every Triton specialisation compiled ahead of time for targets never run here

    @property
    def subject(self) -> Subject:
        if self is Tier.TRITON_AOT:
            return Subject.SOURCE
        return Subject.WHEEL if self in (Tier.BUILD, Tier.ARTIFACT_GPU) else Subject.IMAGE

    @property
    def runs_a_suite(self) -> bool:
        """Tiers whose counts come from a test suite (tests/passed/failed/errors/skipped)."""
        return self in (Tier.CPU, Tier.GPU, Tier.ARTIFACT_GPU)

    @classmethod
    def parse_list(cls, text: str) -> tuple[Tier, ...]:
        """``"build,abi"`` -> (Tier.BUILD, Tier.ABI); an unknown name raises ValueError naming the choices."""
        out = []
        for name in (t.strip() for t in text.split(",")):
            if not name:
                continue
            try:
                out.append(cls(name))
            except ValueError:
                raise ValueError(f"unknown tier {name!r}; tiers are {', '.join(t.value for t in cls)}") from None
        return tuple(dict.fromkeys(out))


TIER_ORDER = tuple(Tier)
REQUIRED_ON_BUILD_HOST = (Tier.BUILD, Tier.ABI, Tier.CPU)


class Verdict(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    NOT_RUN = "not-run"  # could not run here; the reasons say why. Never counted as passed.
    ERROR = "error"  # the tier itself broke
