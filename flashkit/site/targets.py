"""What each env's build runs on, from its spec, and whether it is verified: for the page's matrix and the
"Runs on" lines beside the selector.

Every build is for one platform (``compat.PLATFORM_FLOOR``, which the abi tier holds every build to). The GPU
code is what the spec's ``gpu_targets`` ask for, as the build tier checks it in the wheel (cubins, PTX); the
GPUs it runs on follow by the driver's rule (:meth:`flashkit.binary.fatbin.CudaCode.runs_on`) over the compute
capabilities nvcc knows (:data:`flashkit.plan.compat.CUDA_ARCHS`), from the kernels' floor up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from packaging.version import Version

from flashkit.binary import fatbin
from flashkit.doctor.repo import RepoFacts
from flashkit.plan import compat
from flashkit.plan.production import PLATFORM_TEXT


@dataclasses.dataclass(frozen=True)
class EnvTargets:
    env: str
    kind: str  # cuda | rocm
    verified: bool  # its latest build at its current input hash passes the policy
    code: str  # "sm_80, sm_90a; no PTX", "gfx90a, gfx942"
    runs_on: str  # "compute capability 8.0, 8.6, 8.7, 8.9, 9.0", "gfx90a, gfx942"


def _cuda(targets: tuple[str, ...]) -> tuple[str, str]:
    cubins, ptx = fatbin.target_code(targets)
    cubin_text = ", ".join(sorted(cubins, key=_arch_key))
    ptx_text = "PTX " + ", ".join(sorted(ptx, key=_arch_key)) if ptx else "no PTX"
    floor = compat.KERNELS_MIN_SM
    caps = [cc for cc in compat.CUDA_ARCHS if Version(cc) >= floor and fatbin.targets_cover(targets, cc)]
    return f"{cubin_text}; {ptx_text}", "compute capability " + (", ".join(caps) or "none")


def _arch_key(arch: str) -> tuple[int, ...]:
    digits = arch.split("_", 1)[1].rstrip("af")
    return (int(digits[:-1]), int(digits[-1]))


def env_targets(facts: RepoFacts) -> dict[str, EnvTargets]:
    """Every env whose spec validates, by id."""
    out = {}
    for spec in facts.specs or []:
        env = str(spec.id)
        v = facts.verification.get(env)
        kind = spec.accelerator.kind
        if kind == "cuda":
            code, runs_on = _cuda(tuple(spec.gpu_targets))
        else:
            code = runs_on = ", ".join(spec.gpu_targets)
        out[env] = EnvTargets(env, kind, bool(v and v.verified), code, runs_on)
    return out


def summary(targets: Mapping[str, EnvTargets]) -> tuple[str, list[str]]:
    """The platform, and one line per distinct GPU code among the verified envs (which envs, what it runs on)."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for t in targets.values():
        if t.verified:
            groups.setdefault((t.kind, t.code, t.runs_on), []).append(t.env)
    lines = []
    for (kind, code, runs_on), envs in sorted(groups.items()):
        who = "every verified env" if len(groups) == 1 else ", ".join(sorted(envs))
        vendor = "NVIDIA" if kind == "cuda" else "AMD"
        lines.append(f"{vendor} GPU code {code}: runs on {runs_on} ({who})")
    return PLATFORM_TEXT, lines or ["no env is verified under this policy"]
