"""Findings about the environment as a whole: interpreter, torch, its CUDA, nvcc, and packages built for another torch."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flashkit.binary import fatbin
from flashkit.binary.torch_abi import TORCH_NAMESPACES, is_shim_symbol
from flashkit.doctor import probe
from flashkit.doctor.model import (
    MIN_DRIVER_FOR_CUDA,
    BuildLabel,
    Finding,
    Verification,
    build_label,
    capability,
    vkey,
)
from flashkit.doctor.recommend import verification_line

# ---------------------------------------------------------------------------
# The environment


def environment_findings(facts: probe.Facts) -> list[Finding]:
    """Findings about the environment as a whole: probe steps that failed, tools, torch, nvcc, package imports."""
    return [
        *_probe_error_findings(facts),
        *_pyelftools_findings(facts),
        *_torch_findings(facts),
        *_nvcc_findings(facts),
        *_package_import_findings(facts),
        *_flash_package_findings(facts),
    ]


def _probe_error_findings(facts: probe.Facts) -> list[Finding]:
    out: list[Finding] = []
    for err in facts.errors:
        if err.step == "interpreter":
            out.append(
                Finding(
                    "uninspected",
                    "interpreter-unavailable",
                    "python",
                    f"could not inspect the interpreter: {err.message}",
                    fix="pass --python PATH to a working interpreter",
                )
            )
        elif err.step == "nvcc":
            out.append(Finding("warning", "nvcc-unusable", "nvcc", f"nvcc does not work: {err.message}"))
        elif err.step == "nvidia-smi":
            out.append(
                Finding(
                    "warning",
                    "nvidia-smi-failed",
                    "gpu",
                    f"nvidia-smi failed: {err.message}",
                    cause="the NVIDIA driver is installed but not working (driver/library mismatch, or no device)",
                    fix="check `nvidia-smi` by hand; reboot after a driver update",
                )
            )
        else:
            out.append(Finding("uninspected", "probe-step-failed", err.step, f"{err.step}: {err.message}"))
    return out


def _pyelftools_findings(facts: probe.Facts) -> list[Finding]:
    if facts.tools.pyelftools:
        return []
    return [
        Finding(
            "uninspected" if facts.modules else "info",
            "pyelftools-missing",
            "flashkit",
            "pyelftools not installed: symbol checks skipped",
            fix="pip install pyelftools into the interpreter that runs flashkit",
        )
    ]


def _torch_findings(facts: probe.Facts) -> list[Finding]:
    """torch missing, failing to import, or (imported) at odds with the driver and GPUs."""
    torch = facts.torch
    if facts.interpreter is not None and torch is None:
        return [
            Finding(
                "error",
                "torch-missing",
                "torch",
                f"torch is not installed for {facts.interpreter.executable}",
                cause="flash-attention kernels need torch",
                fix="install the lockfile of the recommended env: pip install -r lockfiles/<env>.txt",
            )
        ]
    if torch is not None and torch.imported is False:
        last = (torch.import_error or "").strip().splitlines()[-1:] or ["(no message)"]
        return [
            Finding(
                "error",
                "torch-import-failed",
                "torch",
                f"import torch fails: {last[0]}",
                cause=_torch_import_cause(torch.import_error or ""),
                fix="reinstall torch from the recommended env's lockfile "
                "(pip install --force-reinstall -r lockfiles/<env>.txt)",
                details={"error": torch.import_error},
            )
        ]
    if torch is not None and torch.imported:
        return _torch_runtime_findings(facts, torch)
    return []


def _package_import_findings(facts: probe.Facts) -> list[Finding]:
    out: list[Finding] = []
    for check in facts.imports:
        if not check.error:
            continue
        last = check.error.strip().splitlines()[-1]
        out.append(
            Finding(
                "error",
                "import-failed",
                check.name,
                f"import {check.name} fails after `import torch`: {last}",
                cause=_package_import_cause(check, facts),
                fix=_package_import_fix(check),
                details={"error": check.error},
            )
        )
    return out


def _flash_package_findings(facts: probe.Facts) -> list[Finding]:
    flash = [d for d in facts.distributions if d.name.lower().replace("-", "_") in ("flash_kernels", "flash_attn")]
    if flash or facts.modules or facts.interpreter is None:
        return []
    return [
        Finding(
            "info",
            "no-flash-package",
            "flash_kernels",
            "neither flash_kernels nor flash_attn is installed",
            fix="install the flash_kernels wheel of the recommended env",
        )
    ]


def _package_import_cause(check: probe.ImportCheck, facts: probe.Facts) -> str | None:
    """Point at the compiled module that fails to load, when the package's error is its error."""
    for m in facts.modules:
        if m.package == check.name and m.import_error and m.path in (check.error or ""):
            return f"its compiled module {os.path.basename(m.path)} does not load (see its findings)"
    if "No module named" in (check.error or ""):
        return "a Python dependency of the package is not installed"
    return None


def _package_import_fix(check: probe.ImportCheck) -> str | None:
    missing = re.search(r"No module named '([\w.]+)'", check.error or "")
    if missing:
        top = missing.group(1).split(".")[0]
        return f"install {top} (the recommended env's lockfile pins it: pip install -r lockfiles/<env>.txt)"
    return None


def _torch_import_cause(error: str) -> str:
    if "undefined symbol" in error:
        return (
            "torch's own libraries do not match each other "
            "(a mix of two torch installs, or a foreign libtorch on LD_LIBRARY_PATH)"
        )
    if "cannot open shared object file" in error:
        lib = re.search(r"(lib[\w.+-]+\.so[\w.]*)", error)
        return (
            f"a library torch needs is missing ({lib.group(1) if lib else 'see the message'}): "
            "its CUDA/nvidia packages are incomplete"
        )
    if "GLIBC" in error:
        return "glibc too old for this torch build"
    if "did not answer" in error or "signal" in error:
        return "import torch hung or crashed the interpreter"
    return "torch is installed but broken"


def _torch_runtime_findings(facts: probe.Facts, torch: probe.TorchFacts) -> list[Finding]:
    out: list[Finding] = []
    if torch.cuda and facts.gpus:
        driver = facts.gpus[0].driver
        major = int(torch.cuda.split(".")[0])
        need = MIN_DRIVER_FOR_CUDA.get(major)
        if driver and need and vkey(driver) < vkey(need):
            out.append(
                Finding(
                    "error",
                    "driver-too-old",
                    "gpu",
                    f"driver {driver} is older than {need}, "
                    f"the minimum for CUDA {major}.x that torch {torch.version} uses",
                    cause="the NVIDIA driver is too old for this torch's CUDA",
                    fix=f"update the driver to >= {need}, or use an env with an older CUDA (see the recommendation)",
                    details={"driver": driver, "cuda": torch.cuda},
                )
            )
        elif torch.cuda_available is False:
            out.append(
                Finding(
                    "error",
                    "cuda-unavailable",
                    "torch",
                    f"nvidia-smi sees {len(facts.gpus)} GPU(s) but torch.cuda.is_available() is False",
                    cause="torch cannot initialise CUDA "
                    "(container without GPU access, CUDA_VISIBLE_DEVICES, or driver issue)",
                    fix="run with GPU access (docker --gpus all) and check CUDA_VISIBLE_DEVICES",
                )
            )
    if torch.cuda and not facts.gpus and not torch.devices:
        out.append(
            Finding(
                "info",
                "no-gpu",
                "gpu",
                f"torch {torch.version} is built for CUDA {torch.cuda} but no NVIDIA GPU is visible",
                cause="no GPU on this machine (or no driver): only CPU and Triton-interpreter paths can run",
            )
        )
    # a GPU newer than torch's own kernels
    caps = [d.capability for d in torch.devices] if torch.cuda else []
    if torch.arch_list and caps:
        for cap in dict.fromkeys(caps):
            code = fatbin.CudaCode(
                tuple(a for a in torch.arch_list if a.startswith("sm_")),
                tuple(a for a in torch.arch_list if a.startswith("compute_")),
                "torch",
            )
            try:
                fits = code.runs_on(capability(cap))
            except ValueError:
                continue
            if fits is None:
                out.append(
                    Finding(
                        "error",
                        "torch-no-gpu-code",
                        "torch",
                        f"torch {torch.version} has no kernels for this GPU (sm_{cap.replace('.', '')}); "
                        f"its arch list is {list(torch.arch_list)}",
                        cause="the torch build predates this GPU",
                        fix="install a torch built for this GPU (a newer CUDA env)",
                    )
                )
    return out


def _nvcc_findings(facts: probe.Facts) -> list[Finding]:
    torch = facts.torch
    if facts.nvcc is None:
        if torch is not None and torch.cuda:
            return [
                Finding(
                    "info",
                    "nvcc-missing",
                    "nvcc",
                    "no nvcc found (CUDA_HOME, PATH, /usr/local/cuda)",
                    cause="only needed to build CUDA extensions from source; prebuilt wheels do not need it",
                    fix=f"to build from source, install a CUDA {torch.cuda.split('.')[0]}.x toolkit",
                )
            ]
        return []
    if torch is None or not torch.cuda or not facts.nvcc.version:
        return []
    t_major = torch.cuda.split(".")[0]
    n_major = facts.nvcc.version.split(".")[0]
    if t_major != n_major:
        return [
            Finding(
                "warning",
                "nvcc-torch-mismatch",
                "nvcc",
                f"nvcc {facts.nvcc.version} ({facts.nvcc.path}) but torch is built with CUDA {torch.cuda}",
                cause="torch.utils.cpp_extension refuses to build when the CUDA major versions differ",
                fix=f"point CUDA_HOME at a CUDA {t_major}.x toolkit before building extensions",
            )
        ]
    if facts.nvcc.version != torch.cuda:
        return [
            Finding(
                "info",
                "nvcc-minor-differs",
                "nvcc",
                f"nvcc {facts.nvcc.version} and torch's CUDA {torch.cuda} differ in the minor version",
                cause="cpp_extension only warns about this; builds work",
            )
        ]
    return []


# ---------------------------------------------------------------------------
# What a flash-attention wheel was built for


def _minor(version: str) -> str:
    return ".".join(re.findall(r"\d+", version)[:2])


def _env_line(env: str, specs_by_id: Mapping[str, Any], verification, lockfiles) -> str:
    spec = specs_by_id[env]
    parts = [verification_line(env, verification)]
    if lockfiles.get(env):
        parts.append(f"lockfile {lockfiles[env]}")
    if spec.publish_tags:
        parts.append(f"image tag {spec.publish_tags[0]}")
    return f"env {env} ({'; '.join(parts)})"


def built_for_findings(
    facts: probe.Facts,
    findings: Sequence[Finding],
    specs: Sequence[Any] | None,
    verification: Mapping[str, Verification],
    lockfiles: Mapping[str, str | None],
    recommended: str | None,
) -> list[Finding]:
    """One finding per flash package built for another torch/CUDA than the one here, with both ways out.

    The evidence is the wheel's version label, the CUDA runtime its modules
    link (``libcudart.so.13``) and the module findings already made; it is an
    error when those findings hold an error, a warning otherwise. A stable-ABI
    wheel (``+cu13stable2.10``) fits every torch from its target on with its CUDA
    major: one that does gets an info finding saying so, not this one.
    """
    torch = facts.torch
    if torch is None or not torch.imported or not torch.version:
        return []
    out = []
    by_id = {str(s.id): s for s in specs or ()}
    describe = functools.partial(_env_line, specs_by_id=by_id, verification=verification, lockfiles=lockfiles)
    for dist in facts.distributions:
        if dist.name.lower().replace("-", "_") not in probe.MODULE_PACKAGES:
            continue
        mods = [m for m in facts.modules if m.distribution == dist.name]
        built = _built_for(dist, mods)
        paths = {m.path for m in mods}
        errors = [f for f in findings if f.severity == "error" and f.details.get("module") in paths]
        here = f"torch {torch.version}" + (f" with CUDA {torch.cuda}" if torch.cuda else "")
        if not built.differs_from(torch):
            if built.stable and torch.cuda and not errors:
                out.append(_stable_fits_finding(dist, built, here))
            continue
        symbols = [
            f.details["demangled"]
            for f in errors
            if f.code in ("undefined-symbol", "cxx-abi-mismatch")
            and str(f.details.get("demangled", "")).startswith(TORCH_NAMESPACES)
        ]
        shim = [
            f.details["symbol"]
            for f in errors
            if f.code == "undefined-symbol" and is_shim_symbol(str(f.details.get("symbol", "")))
        ]
        evidence = _built_for_evidence(dist, built, symbols, shim, torch)
        origin = _envs_built_for(built, specs)
        keep_torch = recommended in by_id and _minor(by_id[recommended].torch) == _minor(torch.version)
        ways = _ways_out(dist, torch, built, recommended if keep_torch else None, origin, describe)
        cause = "a wheel built for another torch/CUDA combination"
        if built.stable:
            cause = _stable_misfit(built, torch)
        out.append(
            Finding(
                "error" if errors else "warning",
                "built-for-another-torch",
                dist.name,
                f"{dist.name} {dist.version} was built for {built.text}; this environment has {here}",
                cause=cause + (": " + "; ".join(evidence) if evidence else ""),
                fix="; ".join(ways),
                details={
                    "distribution": dist.name,
                    "version": dist.version,
                    "built_for": {"torch": built.torch, "cuda": built.cuda, "stable_abi": built.stable},
                    "here": {"torch": torch.version, "cuda": torch.cuda},
                    "symbols": symbols + shim,
                    "envs": {"recommended": recommended, "built_for": origin[0] if origin else None},
                },
            )
        )
    return out


def _stable_fits_finding(dist: probe.Distribution, built: _Built, here: str) -> Finding:
    """Why a wheel built with another torch than this one fits it: it is on torch's stable ABI."""
    major = built.cuda_major
    return Finding(
        "info",
        "stable-abi-wheel",
        dist.name,
        f"{dist.name} {dist.version} is a stable-ABI wheel: it fits torch {built.torch} and every later torch "
        f"with CUDA {major}, so this environment's {here} too",
        cause=f"built on torch's stable C ABI (TORCH_TARGET_VERSION {built.torch}): its compiled module takes "
        "only torch's C shim (aoti_torch_*, torch_*) from libtorch, no C++ symbol bound to one torch minor",
        details={
            "distribution": dist.name,
            "version": dist.version,
            "built_for": {"torch": built.torch, "cuda": built.cuda, "stable_abi": True},
        },
    )


def _stable_misfit(built: _Built, torch: probe.TorchFacts) -> str:
    """Why a stable-ABI wheel does not fit this torch: too old, or another CUDA major."""
    t, major = built.torch, built.cuda_major
    if built.label is not None and not built.label.fits_torch(torch.version or ""):
        return f"this stable-ABI wheel needs torch >= {t} (it fits torch {t} and every later torch with CUDA {major})"
    return (
        f"this stable-ABI wheel fits torch {t} and every later torch, but only those built with CUDA {major} "
        f"(this one has CUDA {torch.cuda})"
    )


@dataclasses.dataclass(frozen=True)
class _Built:
    """What a flash wheel was built for, from its version label or else the one CUDA runtime its modules link."""

    label: BuildLabel | None
    cudart: tuple[str, ...]  # N of each libcudart.so.N its modules need, sorted
    torch: str | None  # "2.6"; for a stable-ABI wheel the oldest torch it fits
    cuda: str | None  # "12.8", or "12"

    @property
    def stable(self) -> bool:
        return self.label is not None and self.label.stable

    @property
    def cuda_major(self) -> str | None:
        return self.cuda.split(".")[0] if self.cuda else None

    def differs_from(self, torch: probe.TorchFacts) -> bool:
        """Whether torch here has another minor version (for a stable-ABI wheel: an older one than its target),
        or another CUDA major, than the wheel's."""
        if self.label is not None and self.stable:
            torch_differs = not self.label.fits_torch(torch.version or "")
        else:
            torch_differs = self.torch is not None and self.torch != _minor(torch.version or "")
        cuda_differs = self.cuda is not None and torch.cuda is not None and self.cuda_major != torch.cuda.split(".")[0]
        return torch_differs or cuda_differs

    @property
    def text(self) -> str:
        """What it was built for, as the messages say it ("torch 2.6 with CUDA 12"); "" when unknown."""
        if self.stable:
            return f"the stable ABI of torch >= {self.torch} with CUDA {self.cuda_major}"
        parts = (f"torch {self.torch}" if self.torch else None, f"CUDA {self.cuda}" if self.cuda else None)
        return " with ".join(x for x in parts if x)


def _built_for(dist: probe.Distribution, mods: Sequence[probe.ModuleFacts]) -> _Built:
    label = build_label(dist.version)
    cudart = sorted({x.group(1) for m in mods for n in m.needed if (x := re.match(r"libcudart\.so\.(\d+)$", n))})
    built_torch = label.torch if label else None
    built_cuda = label.cuda if label and label.cuda else (cudart[0] if len(cudart) == 1 else None)
    return _Built(label, tuple(cudart), built_torch, built_cuda)


def _built_for_evidence(
    dist: probe.Distribution, built: _Built, symbols: Sequence[str], shim: Sequence[str], torch: probe.TorchFacts
) -> list[str]:
    """Why the wheel is taken to be built for another torch: its label, the CUDA runtime it links, torch symbols."""
    evidence = []
    if built.label:
        evidence.append(f"its version label +{dist.version.split('+', 1)[1]}")
    missing_rt = [f"libcudart.so.{n}" for n in built.cudart if torch.cuda and n != torch.cuda.split(".")[0]]
    if missing_rt:
        evidence.append(f"its modules link {', '.join(missing_rt)} (CUDA {built.cudart[0]})")
    if symbols:
        evidence.append(
            f"{len(symbols)} torch C++ symbol(s) that torch {torch.version} does not define, e.g. `{symbols[0]}`"
        )
    if shim:
        evidence.append(
            f"{len(shim)} function(s) of torch's stable C shim that torch {torch.version} does not export, "
            f"e.g. `{shim[0]}`"
        )
    return evidence


def _ways_out(
    dist: probe.Distribution,
    torch: probe.TorchFacts,
    built: _Built,
    recommended: str | None,
    origin: Sequence[str],
    describe: Callable[[str], str],
) -> list[str]:
    """Keep this torch (the ``recommended`` env's wheel when its torch is this one, else a rebuild), or keep the wheel."""
    if recommended is not None:
        ways = [f"keep torch {torch.version}: install the {dist.name} wheel (or the image) of " + describe(recommended)]
    else:
        ways = [f"rebuild {dist.name} against torch {torch.version}"]
    if built.stable:
        any_torch = f"any torch >= {built.torch} built with CUDA {built.cuda_major}"
        ways.append(f"or keep this wheel: install {any_torch}" + (", e.g. " + describe(origin[0]) if origin else ""))
    elif origin:
        ways.append("or keep this wheel: use the combination it was built for, " + describe(origin[0]))
    elif built.text:
        ways.append(f"or install the torch it was built for ({built.text})")
    return ways


def _envs_built_for(built: _Built, specs: Sequence[Any] | None) -> list[str]:
    """The env ids with the torch minor (a stable-ABI wheel: any torch from its target on) and, when known,
    the CUDA major the wheel was built for."""
    return [
        str(s.id)
        for s in specs or ()
        if built.torch
        and (built.label.fits_torch(s.torch) if built.label and built.stable else _minor(s.torch) == built.torch)
        and (
            built.cuda is None
            or (s.accelerator.kind == "cuda" and s.accelerator.major == int(built.cuda.split(".")[0]))
        )
    ]
