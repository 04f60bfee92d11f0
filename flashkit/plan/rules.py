"""Compatibility rules as data. Each rule has an id, the reason it exists and a fix; checking an env
gives one verdict per rule: Accepted (with a note saying why it holds or does not apply) or
Rejected(rule, reason, fix). The rules read only the spec and the tables in flashkit.plan.compat.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import Version

from flashkit.core.errors import RuleRejected
from flashkit.plan import compat
from flashkit.plan.spec import EnvSpec

# A check returns (ok, detail): detail explains the verdict in terms of this env's values.
Check = Callable[[EnvSpec], tuple[bool, str]]


@dataclass(frozen=True)
class Rule:
    id: str
    reason: str  # why the rule exists
    fix: str  # what to change when it fails
    check: Check


@dataclass(frozen=True)
class Accepted:
    rule: Rule
    note: str

    ok = True


@dataclass(frozen=True)
class Rejected:
    rule: Rule
    reason: str
    fix: str

    ok = False


Verdict = Accepted | Rejected


def _cc(target: str) -> tuple[str, str | None]:
    m = re.match(r"^([0-9]+\.[0-9])([af])?", target)
    assert m, target
    return m[1], m[2]


def _python_supported(s: EnvSpec) -> tuple[bool, str]:
    pythons = compat.TORCH_PYTHONS.get(s.torch_series)
    if pythons is None:
        return False, f"no Python support data for torch {s.torch_series} (known: {', '.join(compat.TORCH_PYTHONS)})"
    if s.python not in pythons:
        return False, f"torch {s.torch_series} has wheels for Python {', '.join(pythons)}, not {s.python}"
    return True, f"torch {s.torch_series} supports Python {s.python}"


def _cuda_major(s: EnvSpec) -> tuple[bool, str]:
    if s.accelerator.kind != "cuda":
        return True, "not a CUDA env"
    if s.torch_source != "pypi":
        return True, f"torch comes from the {s.base.flavor} base image, built with that image's CUDA"
    torch_cuda = compat.TORCH_DEFAULT_CUDA.get(s.torch_series)
    if torch_cuda is None:
        return (
            False,
            f"no data on which CUDA the PyPI torch {s.torch_series} wheels use (known: {', '.join(compat.TORCH_DEFAULT_CUDA)})",
        )
    if Version(torch_cuda).major != s.accelerator.major:
        return (
            False,
            f"PyPI torch {s.torch} is built with CUDA {torch_cuda} but the kernels would be compiled with CUDA {s.accelerator.version}",
        )
    note = f"compile CUDA {s.accelerator.version} and torch's CUDA {torch_cuda} share major {s.accelerator.major}"
    if torch_cuda != s.accelerator.version:
        note += " (minor differs: cpp_extension only warns)"
    return True, note


def _abi(s: EnvSpec) -> tuple[bool, str]:
    if s.torch_source != "pypi":
        return (
            True,
            f"torch comes from the {s.base.flavor} base image; `flashkit doctor` checks its ABI inside the image",
        )
    want = s.torch_version >= compat.PYPI_CXX11_ABI_FROM
    if s.cxx11_abi != want:
        return (
            False,
            f"PyPI torch {s.torch} uses the {'cxx11' if want else 'pre-cxx11'} ABI but the spec says cxx11_abi: {str(s.cxx11_abi).lower()}",
        )
    return True, f"PyPI torch {s.torch} uses the {'cxx11' if want else 'pre-cxx11'} ABI, as declared"


def _arch_min_cuda(s: EnvSpec) -> tuple[bool, str]:
    if s.accelerator.kind != "cuda":
        return True, "not a CUDA env"
    cuda = s.accelerator.parsed
    problems = []
    for t in s.gpu_targets:
        cc, suffix = _cc(t)
        info = compat.CUDA_ARCHS[cc]
        need = max(info.min_cuda, compat.ARCH_SUFFIX_MIN_CUDA[suffix]) if suffix else info.min_cuda
        if cuda < need:
            problems.append(f"sm_{cc.replace('.', '')}{suffix or ''} needs CUDA >= {need}")
        if info.dropped_in_major is not None and cuda.major >= info.dropped_in_major:
            problems.append(f"sm_{cc.replace('.', '')} was dropped in CUDA {info.dropped_in_major}")
    if problems:
        return False, f"CUDA {s.accelerator.version}: " + "; ".join(problems)
    return True, f"CUDA {s.accelerator.version} can target {', '.join(s.gpu_targets)}"


def _kernels_min_sm(s: EnvSpec) -> tuple[bool, str]:
    if "cuda" not in s.backends or s.accelerator.kind != "cuda":
        return True, "the CUDA backend is not built for an NVIDIA target"
    low = [t for t in s.gpu_targets if Version(_cc(t)[0]) < compat.KERNELS_MIN_SM]
    if low:
        return False, f"targets {', '.join(low)} are below sm_80, which the CUDA kernels need"
    return True, "every target is sm_80 or newer"


def _cuda13_torch(s: EnvSpec) -> tuple[bool, str]:
    if s.accelerator.kind != "cuda" or s.accelerator.major < 13:
        return True, "not CUDA 13 or newer"
    if s.torch_version < compat.CUDA13_MIN_TORCH:
        return (
            False,
            f"CUDA {s.accelerator.version} with torch {s.torch}: CUDA 13 builds of torch start at {compat.CUDA13_MIN_TORCH}",
        )
    return True, f"torch {s.torch} supports CUDA 13"


def _backends(s: EnvSpec) -> tuple[bool, str]:
    if s.accelerator.kind == "rocm" and "cuda" in s.backends:
        return False, "the CUDA C++ kernels are not ported to HIP; a ROCm env builds the Triton backend only"
    return True, f"backends {', '.join(s.backends)} fit {s.accelerator}"


def _triton_for_python(s: EnvSpec) -> tuple[bool, str]:
    if "triton" not in s.backends or s.torch_source != "pypi":
        return True, "no PyPI torch's triton needed"
    pythons = compat.TORCH_TRITON_PYTHONS.get(s.torch_series)
    if pythons is not None and s.python not in pythons:
        return (
            False,
            f"PyPI torch {s.torch_series} requires triton only on Python {', '.join(pythons)}: on {s.python} it has none, "
            "so neither the Triton backend nor the kernel suite's CPU tier (Triton's interpreter) can run",
        )
    return True, f"torch {s.torch_series} brings triton on Python {s.python}"


def _rocm(s: EnvSpec) -> tuple[bool, str]:
    if s.accelerator.kind != "rocm":
        if s.base.flavor == "rocm":
            return False, "a rocm/pytorch base image carries ROCm torch, but the spec's accelerator is CUDA"
        return True, "not a ROCm env"
    if s.base.flavor != "rocm":
        return (
            False,
            f"PyPI torch wheels are CUDA builds; a ROCm env needs the rocm flavor (torch from the image), not {s.base.flavor}",
        )
    rocm = s.accelerator.parsed
    low = [f"{t} needs ROCm >= {compat.ROCM_GFX[t]}" for t in s.gpu_targets if rocm < compat.ROCM_GFX[t]]
    if low:
        return False, f"ROCm {s.accelerator.version}: " + "; ".join(low)
    # AMD's tags spell out the combination: rocm6.4.4_ubuntu24.04_py3.12_pytorch_release_2.7.1.
    m = re.match(
        r"^rocm(?P<rocm>[0-9.]+)_ubuntu[0-9.]+_py(?P<py>3\.[0-9]+)_pytorch_(?:release_)?(?P<torch>[0-9.]+)$", s.base.tag
    )
    if not m:
        return False, f"cannot read the ROCm/Python/torch combination from the tag {s.base.tag!r}"
    problems = []
    if m["rocm"] != s.accelerator.version and not m["rocm"].startswith(s.accelerator.version + "."):
        problems.append(f"tag has ROCm {m['rocm']}, spec {s.accelerator.version}")
    if m["py"] != s.python:
        problems.append(f"tag has Python {m['py']}, spec {s.python}")
    if m["torch"] != s.torch:
        problems.append(f"tag has torch {m['torch']}, spec {s.torch}")
    if problems:
        return False, "the rocm/pytorch tag disagrees with the spec: " + "; ".join(problems)
    return True, f"rocm/pytorch {s.base.tag} provides ROCm {m['rocm']}, Python {s.python}, torch {s.torch}"


def _compiler_exists(s: EnvSpec) -> tuple[bool, str]:
    src, flavor = s.compiler.source, s.base.flavor
    if src == "debian":
        if flavor != "debian":
            return False, f"compiler source 'debian' needs the debian flavor, not {flavor}"
        suite = compat.DEBIAN_SUITES[s.base.suite]
        if suite.cuda != s.accelerator.version:
            return (
                False,
                f"Debian {s.base.suite}'s nvidia-cuda-toolkit is CUDA {suite.cuda}, not {s.accelerator.version}",
            )
        if suite.toolkit_version != s.compiler.version:
            return (
                False,
                f"Debian {s.base.suite} has nvidia-cuda-toolkit {suite.toolkit_version}, not {s.compiler.version}",
            )
        return (
            True,
            f"Debian {s.base.suite} non-free ships nvidia-cuda-toolkit {suite.toolkit_version} (CUDA {suite.cuda})",
        )
    if src == "pypi":
        if s.accelerator.kind != "cuda":
            return False, "PyPI nvcc wheels are CUDA compilers; a ROCm env takes its compiler from the base image"
        if s.accelerator.major < compat.PYPI_NVCC_MIN_MAJOR:
            return (
                False,
                f"PyPI has no nvcc driver for CUDA {s.accelerator.major} (nvidia-cuda-nvcc-cu12 carries ptxas and libnvvm only); CUDA 13 or a Debian/base-image compiler is needed",
            )
        if compat.series(s.compiler.version) != s.accelerator.version:
            return False, f"nvidia-cuda-nvcc {s.compiler.version} is not CUDA {s.accelerator.version}"
        return True, f"nvidia-cuda-nvcc {s.compiler.version} (+ nvvm, crt at the same version, cccl) from PyPI"
    # base-image
    if flavor == "debian":
        return (
            False,
            "a Debian base made here (mmdebstrap) has no CUDA compiler of its own; use compiler source 'debian' or 'pypi'",
        )
    if flavor == "cuda" and "-devel-" not in s.base.ref and not s.base.ref.split(":")[1].startswith("devel"):
        return False, f"{s.base.ref} is not a -devel image, so it has no nvcc"
    return True, f"the {flavor} base image carries the compiler"


def _base_contents(s: EnvSpec) -> tuple[bool, str]:
    flavor = s.base.flavor
    if flavor == "debian":
        suite = compat.DEBIAN_SUITES[s.base.suite]
        if suite.python != s.python:
            return False, f"Debian {s.base.suite} provides Python {suite.python}, not {s.python}"
        return True, f"Debian {s.base.suite} provides Python {s.python}"
    if flavor == "cuda":
        m = re.match(r"^(?P<cuda>[0-9]+\.[0-9]+)(?:\.[0-9]+)?-.*ubuntu(?P<ubuntu>[0-9]+\.[0-9]+)$", s.base.tag)
        if not m:
            return False, f"cannot read CUDA and Ubuntu versions from the tag {s.base.tag!r}"
        problems = []
        if m["cuda"] != s.accelerator.version:
            problems.append(f"tag has CUDA {m['cuda']}, spec {s.accelerator.version}")
        py = compat.UBUNTU_PYTHON.get(m["ubuntu"])
        if py != s.python:
            problems.append(f"Ubuntu {m['ubuntu']} provides Python {py or 'unknown'}, spec {s.python}")
        if problems:
            return False, "; ".join(problems)
        return True, f"{s.base.ref} has CUDA {m['cuda']} and Ubuntu {m['ubuntu']}'s Python {py}"
    if flavor == "ngc":
        m = re.match(r"^(?P<rel>[0-9]{2}\.[0-9]{2})-py3$", s.base.tag)
        rel = compat.NGC_RELEASES.get(m["rel"]) if m else None
        if rel is None:
            return (
                False,
                f"no release-notes data for NGC tag {s.base.tag!r} (known: {', '.join(f'{k}-py3' for k in compat.NGC_RELEASES)})",
            )
        problems = [
            f"{name}: release has {have}, spec {want}"
            for name, have, want in (
                ("torch", rel.torch, s.torch),
                ("CUDA", rel.cuda, s.accelerator.version),
                ("Python", rel.python, s.python),
            )
            if have != want
        ]
        if problems:
            return False, f"NGC {m['rel']} disagrees with the spec: " + "; ".join(problems)
        return True, f"NGC {m['rel']}: torch {rel.torch}, CUDA {rel.cuda}, Python {rel.python} ({rel.source})"
    return True, "checked by rocm-combination"


RULES: tuple[Rule, ...] = (
    Rule(
        "python-supported-by-torch",
        "torch publishes wheels for a fixed set of Python versions per release",
        "pick a Python listed for this torch series, or another torch",
        _python_supported,
    ),
    Rule(
        "torch-cuda-major",
        "an extension must be compiled with the CUDA major version torch was built with",
        "use a compiler of torch's CUDA major, or a torch built for this CUDA",
        _cuda_major,
    ),
    Rule(
        "pypi-torch-abi",
        "PyPI torch >= 2.7 uses the cxx11 ABI and older PyPI torch does not; a mismatched extension fails to load",
        "set cxx11_abi to what this torch uses",
        _abi,
    ),
    Rule(
        "sm-arch-min-cuda",
        "nvcc can only target compute capabilities its release knows (sm_90 >= 11.8, sm_100/sm_120 >= 12.8)",
        "drop the target or use a newer CUDA",
        _arch_min_cuda,
    ),
    Rule(
        "kernels-min-sm",
        "flash_kernels' CUDA path uses Ampere (sm_80) features",
        "remove targets below 8.0 or build only the triton backend",
        _kernels_min_sm,
    ),
    Rule(
        "cuda13-needs-torch29",
        "torch publishes CUDA 13 builds from 2.9 on",
        "use torch >= 2.9 or a CUDA 12 toolchain",
        _cuda13_torch,
    ),
    Rule(
        "torch-triton-python",
        "the Triton backend and the CPU tier need the triton that torch requires, and some torch releases require "
        "it only on some Pythons (torch 2.5: below 3.13)",
        "use a Python torch brings triton for, or a newer torch (2.6 has triton for Python 3.13)",
        _triton_for_python,
    ),
    Rule(
        "backends-fit-accelerator",
        "the CUDA C++ kernels exist only for NVIDIA GPUs",
        "list only the triton backend for ROCm",
        _backends,
    ),
    Rule(
        "rocm-combination",
        "ROCm torch comes only from AMD's rocm/pytorch images, whose tag fixes ROCm, Python and torch",
        "use a rocm/pytorch tag whose ROCm/Python/torch match the spec, and gfx targets that ROCm release supports",
        _rocm,
    ),
    Rule(
        "compiler-source-exists",
        "the compiler must really exist for this base (Debian trixie: CUDA 12.4, bookworm: 11.8; PyPI nvcc: CUDA 13 only)",
        "choose a compiler source that provides this CUDA version on this base",
        _compiler_exists,
    ),
    Rule(
        "base-provides-python-and-cuda",
        "the base image decides which Python (and for vendor images which CUDA and torch) is available",
        "match python/accelerator/torch to what the base image provides, or change the base",
        _base_contents,
    ),
)


def check(spec: EnvSpec, rules: tuple[Rule, ...] = RULES) -> list[Verdict]:
    """One verdict per rule, in rule order."""
    out: list[Verdict] = []
    for rule in rules:
        ok, detail = rule.check(spec)
        out.append(Accepted(rule, detail) if ok else Rejected(rule, detail, rule.fix))
    return out


def rejections(spec: EnvSpec) -> list[Rejected]:
    return [v for v in check(spec) if isinstance(v, Rejected)]


def format_rejection(spec: EnvSpec, v: Rejected) -> str:
    return f"{spec.id}: rejected by rule {v.rule.id}: {v.reason}. Why: {v.rule.reason}. Fix: {v.fix}."


def require_accepted(spec: EnvSpec) -> None:
    """Raise RuleRejected naming every rule that refuses this env."""
    bad = rejections(spec)
    if bad:
        raise RuleRejected("\n".join(format_rejection(spec, v) for v in bad))
