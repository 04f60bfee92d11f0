"""``flashkit doctor``: why does my flash-attention import fail, and which env fits this machine?

Pure diagnosis: :func:`diagnose` takes the facts :mod:`flashkit.doctor.probe`
gathered (plain values) and the env specs, and returns findings, each with a
severity, what was seen, the likely cause and the fix, plus the closest env
in ``envs/`` with its verification status. Nothing here runs a process, and
torch is never imported in this process (the probe asks the target
interpreter in child processes).

Exit codes of ``flashkit doctor``:
  0   healthy: no problem found
  20  problems found (at least one finding of severity "error")
  21  could not inspect: no errors, but something that matters could not be
     checked (the interpreter did not answer, a compiled module could not be
     read, pyelftools missing while there are modules to check), an
     unreadable --facts file, or a failure of doctor itself
  2   usage error (a bad command line), as for every flashkit command

They sit in the CLI's doctor range (20-29) so that neither can be mistaken
for the CLI's own 1 (internal error) or 2 (usage error).

``--json`` prints one object with ``schema_version`` (:data:`SCHEMA_VERSION`),
``status`` ("healthy" | "problems" | "uninspected"), ``exit_code``,
``findings`` (severity, code, subject, what, cause, fix, details),
``recommendation`` and the raw ``facts``. Finding codes are stable strings;
new ones may be added, existing ones keep their meaning.

``python -m flashkit.doctor.report`` runs the same command without the rest of the
CLI (whose other subcommands need jinja2, docker, ...). ``--facts FILE``
diagnoses facts probed elsewhere (``python -m flashkit.doctor.probe``), ``--root DIR``
reads their compiled modules from a mounted image filesystem.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flashkit.binary import elf
from flashkit.doctor import probe

SCHEMA_VERSION = 1
SEVERITIES = ("error", "warning", "info", "uninspected")
EXIT_HEALTHY, EXIT_PROBLEMS, EXIT_UNINSPECTED = 0, 20, 21
EXIT_USAGE = 2  # the CLI's usage-error code

# Minimum Linux driver for each CUDA major under minor-version compatibility
# (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions").
MIN_DRIVER_FOR_CUDA = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

_TORCH_NAMESPACES = ("c10::", "at::", "torch::", "caffe2::")
_TORCH_LIBS = re.compile(r"^lib(c10|torch|shm|caffe2)[\w.-]*\.so")


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


@dataclasses.dataclass(frozen=True)
class Recommendation:
    env: str | None
    exact: bool
    reason: str
    differences: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()
    verification: str = "not verified"
    lockfile: str | None = None
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
# Compiled modules


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def _base(path: str) -> str:
    return os.path.basename(path)


def _rebuild_fix(m: probe.ModuleFacts, target: Target) -> str:
    dist = m.distribution or m.package
    torch = f"torch {target.torch_version}" if target.torch_version else "the installed torch"
    return (
        f"rebuild {dist} against {torch} "
        f"(pip install --no-build-isolation --no-deps --force-reinstall {dist}), "
        "or install the wheel/image of the flashkit env that matches this torch (see the recommendation)"
    )


def symbol_finding(u: elf.UnresolvedSymbol, m: probe.ModuleFacts, target: Target) -> Finding:
    """Name the likely cause of one undefined symbol, from its name and its near misses."""
    shown = u.demangled if u.demangled != u.name else u.name
    ver = f"@{u.version}" if u.version else ""
    what = f"undefined symbol: {u.name}{ver} ({shown})" if shown != u.name else f"undefined symbol: {u.name}{ver}"
    details: dict[str, Any] = {
        "module": m.path,
        "symbol": u.name,
        "demangled": u.demangled,
        "version": u.version,
        "near_misses": [dataclasses.asdict(n) for n in u.near_misses],
    }
    abi = [n for n in u.near_misses if n.abi_only]
    if abi:
        near = abi[0]
        module_new = "__cxx11" in u.name or "cxx11" in u.demangled
        mod_flag, prov_flag = (1, 0) if module_new else (0, 1)
        torch_note = ""
        if target.torch_cxx11_abi is not None:
            torch_note = f"; this torch uses _GLIBCXX_USE_CXX11_ABI={int(target.torch_cxx11_abi)}"
        return Finding(
            "error",
            "cxx-abi-mismatch",
            m.path,
            what,
            cause=(
                f"C++ ABI mismatch: the module was built with _GLIBCXX_USE_CXX11_ABI={mod_flag}, "
                f"but {_base(near.provider)} was built with ={prov_flag} and defines `{near.demangled}` "
                f"(differs only in the std::string ABI){torch_note}"
            ),
            fix=(
                f"rebuild the module with -D_GLIBCXX_USE_CXX11_ABI={prov_flag} "
                "(torch's cpp_extension sets it "
                "to match the torch it builds against), or use an env whose cxx11_abi matches"
            ),
            details=details,
        )
    if u.near_misses:
        near = u.near_misses[0]
        from_torch = bool(_TORCH_LIBS.match(_base(near.provider))) or shown.startswith(_TORCH_NAMESPACES)
        built = "another torch version" if from_torch else f"another version of {_base(near.provider)}"
        return Finding(
            "error",
            "undefined-symbol",
            m.path,
            what,
            cause=(
                f"built against {built}: the loaded {_base(near.provider)} defines `{near.demangled}` "
                f"instead of `{shown}`"
                + (f" (torch here is {target.torch_version})" if from_torch and target.torch_version else "")
            ),
            fix=_rebuild_fix(m, target),
            details=details,
        )
    if shown.startswith(_TORCH_NAMESPACES) or u.name.startswith(("aoti_torch_", "THP")):
        return Finding(
            "error",
            "undefined-symbol",
            m.path,
            what,
            cause=(
                "built against another torch version: no loaded torch library defines it"
                + (f" (torch here is {target.torch_version})" if target.torch_version else "")
            ),
            fix=_rebuild_fix(m, target),
            details=details,
        )
    if u.name.startswith(("Py", "_Py")):
        return Finding(
            "error",
            "undefined-symbol",
            m.path,
            what,
            cause="built for another Python version or interpreter: this interpreter does not define it",
            fix=f"rebuild {m.distribution or m.package} for this Python, or install the wheel built for it",
            details=details,
        )
    if u.version:
        return Finding(
            "error",
            "undefined-symbol",
            m.path,
            what,
            cause=f"needs version {u.version} of {u.version_file or 'a system library'}, which the loaded one lacks",
            fix="use a system (or image) whose libraries are at least as new as the build machine's",
            details=details,
        )
    return Finding(
        "error",
        "undefined-symbol",
        m.path,
        what,
        cause="no library in the load scope defines it: a library it was built against is missing or different",
        fix=_rebuild_fix(m, target),
        details=details,
    )


def _glibc_findings(m: probe.ModuleFacts, target: Target) -> list[Finding]:
    out = []
    need = m.glibc_required
    if not need:
        return out
    for limit, where in ((target.glibc, "this system's glibc"), (_policy_glibc(target.glibc_policy), None)):
        if not limit or _vkey(need) <= _vkey(limit):
            continue
        where = where or f"policy {target.glibc_policy}, which guarantees only glibc"
        out.append(
            Finding(
                "error",
                "glibc-too-old",
                m.path,
                f"requires glibc {need} (GLIBC_{need} symbol versions), but {where} {limit}",
                cause="glibc too old: the module was built on a system with a newer glibc than the one it must run on",
                fix=(
                    f"build on a base with glibc <= {limit} (a manylinux_2_{limit.split('.')[1]} image), "
                    f"or run on a system with glibc >= {need}"
                ),
                details={
                    "module": m.path,
                    "required": need,
                    "available": limit,
                    "policy": target.glibc_policy,
                },
            )
        )
    return out


def _policy_glibc(policy: str | None) -> str | None:
    return elf.glibc_of_policy(policy) if policy else None


def _vkey(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def module_findings(m: probe.ModuleFacts, target: Target) -> list[Finding]:
    """Everything wrong (or unknown) about one compiled module."""
    out: list[Finding] = []
    if not m.elf_read and not m.errors:
        out.append(
            Finding(
                "uninspected",
                "module-uninspected",
                m.path,
                "its ELF facts were not read (probed with --no-elf)",
                fix="run `flashkit doctor --facts FILE --root DIR` with that filesystem mounted at DIR",
                details={"module": m.path},
            )
        )
    for err in m.errors:
        out.append(
            Finding(
                "uninspected",
                "module-uninspected",
                m.path,
                f"could not {err.step}: {err.message}",
                fix="install pyelftools (and abi3info) next to flashkit" if "not installed" in err.message else None,
                details={"module": m.path, "step": err.step},
            )
        )

    # Python tag: a cpython-311 file is not even looked for by CPython 3.12
    if m.extension is not False and m.tag.kind == "cpython" and target.python and m.tag.python != target.python:
        built = f"{m.tag.python[0]}.{m.tag.python[1]}"
        here = f"{target.python[0]}.{target.python[1]}"
        out.append(
            Finding(
                "error",
                "python-tag-mismatch",
                m.path,
                f"built for CPython {built} ({m.tag.label}); this interpreter is Python {here}",
                cause=f"Python tag mismatch: CPython {here} only imports "
                f"*.cpython-{target.python[0]}{target.python[1]}-*.so, "
                "*.abi3.so or untagged modules, so this file is ignored or fails to load",
                fix=f"install the {m.distribution or m.package} wheel built for "
                f"cp{target.python[0]}{target.python[1]} "
                "(or an abi3 wheel), or rebuild it with this interpreter",
                details={"module": m.path, "built_for": built, "python": here},
            )
        )

    if m.import_error and m.extension is not False:
        out.append(
            Finding(
                "error",
                "import-failed",
                m.path,
                f"loading it after `import torch` fails: {m.import_error.splitlines()[-1]}",
                cause="see the findings for this module below" if m.resolution and not m.resolution.ok else None,
                details={"module": m.path, "error": m.import_error},
            )
        )

    res = m.resolution
    if res is not None:
        for miss in res.missing_libraries:
            out.append(
                Finding(
                    "error",
                    "missing-library",
                    m.path,
                    f"needs {miss.name} (DT_NEEDED of {_base(miss.needed_by)}), which is not found",
                    cause=_missing_lib_cause(miss.name, target),
                    fix=_missing_lib_fix(miss.name, m, target),
                    details={
                        "module": m.path,
                        "library": miss.name,
                        "searched": list(miss.searched),
                        # the loader stops at the missing library; these are most likely its symbols
                        "unresolved": [u.name for u in res.unresolved],
                    },
                )
            )
        for mv in res.missing_versions:
            glibc = mv.version.startswith("GLIBC_")
            out.append(
                Finding(
                    "error",
                    "glibc-too-old" if glibc else "library-too-old",
                    m.path,
                    f"needs {mv.version} from {mv.library}; the found {mv.provider} has only up to "
                    f"{mv.available[-1] if mv.available else 'none of that family'}",
                    cause=("glibc too old" if glibc else f"{mv.library} too old")
                    + ": the module was built against a newer one than this system has",
                    fix=(
                        "run on a system with a newer glibc, or rebuild on an older base (manylinux)"
                        if glibc
                        else f"install a newer {mv.library} (e.g. a newer libstdc++ / GCC runtime), "
                        "or rebuild with an older compiler"
                    ),
                    details={"module": m.path, **dataclasses.asdict(mv)},
                )
            )
        # the loader stops at the first missing library, but symbols that library cannot
        # provide (torch's C++ API when libcudart is missing) are still this module's problem
        for u in res.unresolved:
            if not any(_may_provide(miss.name, u) for miss in res.missing_libraries):
                out.append(symbol_finding(u, m, target))
        for path, reason in res.unreadable:
            out.append(
                Finding(
                    "uninspected",
                    "library-unreadable",
                    m.path,
                    f"could not read {path}: {reason}",
                    details={"module": m.path, "library": path},
                )
            )
        if not res.demangler and res.unresolved:
            out.append(
                Finding(
                    "info",
                    "no-demangler",
                    m.path,
                    "no C++ demangler (neither c++filt nor libstdc++'s __cxa_demangle): names are shown mangled",
                    fix="install binutils (c++filt)",
                )
            )

    if res is None and m.loader_symbol:
        # no ELF reading here (e.g. no pyelftools): the loader's own message still names the symbol
        name, demangled = m.loader_symbol
        found = symbol_finding(elf.UnresolvedSymbol(name, demangled, None, None, "?", ()), m, target)
        out.append(dataclasses.replace(found, details={**found.details, "source": "loader message"}))

    # the loader's own verdict on libc's versions (missing_versions) already says it for this system
    loader_said = res is not None and any(v.version.startswith("GLIBC_") for v in res.missing_versions)
    out.extend(_glibc_findings(m, dataclasses.replace(target, glibc=None) if loader_said else target))

    # C++ string ABI of the module against torch's (a mismatch without an undefined symbol is a warning)
    if (
        m.cxx_abi in ("cxx11", "pre-cxx11")
        and target.torch_cxx11_abi is not None
        and (m.cxx_abi == "cxx11") != target.torch_cxx11_abi
        and not any(f.code == "cxx-abi-mismatch" for f in out)
    ):
        out.append(
            Finding(
                "warning",
                "cxx-abi-mismatch",
                m.path,
                f"the module's C++ symbols use the {m.cxx_abi} std::string ABI; this torch uses "
                f"{'cxx11' if target.torch_cxx11_abi else 'pre-cxx11'}",
                cause="built with another _GLIBCXX_USE_CXX11_ABI than torch; any std::string crossing to torch breaks",
                fix=f"rebuild with -D_GLIBCXX_USE_CXX11_ABI={int(target.torch_cxx11_abi)}",
                details={"module": m.path},
            )
        )

    # abi3 claims
    if m.limited_api:
        names = [i.symbol for i in m.limited_api]
        out.append(
            Finding(
                "error",
                "abi3-unclean",
                m.path,
                f"claims abi3 but uses {len(names)} symbol(s) outside the stable ABI it claims: "
                + ", ".join(f"{i.symbol} ({i.reason})" for i in m.limited_api[:8]),
                cause="not abi3-clean: compiled without Py_LIMITED_API (or a too new Py_LIMITED_API) "
                "while tagged abi3; it breaks on other Python versions",
                fix="define Py_LIMITED_API to the oldest supported version (setuptools: py_limited_api=True "
                "and define_macros=[('Py_LIMITED_API', '0x03090000')]) and replace the listed calls",
                details={"module": m.path, "symbols": names},
            )
        )

    # GPU code against each GPU (or stated capability)
    if m.cuda is not None:
        for cap in target.capabilities:
            try:
                cc = _cc(cap)
            except ValueError:
                continue
            pick = m.cuda.runs_on(cc)
            sm = f"sm_{cc[0]}{cc[1]}"
            carried = f"cubins {list(m.cuda.cubins) or 'none'}, PTX {list(m.cuda.ptx) or 'none'}"
            if pick is None:
                out.append(
                    Finding(
                        "error",
                        "no-gpu-code",
                        m.path,
                        f"no cubin/PTX for {sm}: the module carries {carried}",
                        cause=f"wrong GPU arch: built for other GPUs; CUDA kernels fail with "
                        f"'no kernel image is available for execution on the device' on {sm}",
                        fix=f"rebuild with -gencode arch=compute_{cc[0]}{cc[1]},code=sm_{cc[0]}{cc[1]} "
                        f"(TORCH_CUDA_ARCH_LIST={cap}), or use an env whose gpu_targets include {cap}",
                        details={
                            "module": m.path,
                            "capability": cap,
                            "cubins": list(m.cuda.cubins),
                            "ptx": list(m.cuda.ptx),
                        },
                    )
                )
            elif pick[0] == "ptx":
                out.append(
                    Finding(
                        "info",
                        "ptx-jit",
                        m.path,
                        f"no cubin for {sm}; its PTX {pick[1]} is JIT-compiled by the driver at first load",
                        cause="built for an older arch with PTX: it runs, after a one-time JIT "
                        "(slower start, "
                        "possibly slower kernels)",
                        fix=f"add -gencode arch=compute_{cc[0]}{cc[1]},code=sm_{cc[0]}{cc[1]} for native code",
                        details={"module": m.path, "capability": cap, "ptx": pick[1]},
                    )
                )
            if pick is not None and cc == (9, 0) and pick[1] != "sm_90a" and _is_flash_kernels_module(m.path):
                out.append(
                    Finding(
                        "info",
                        "no-hopper-kernels",
                        m.path,
                        f"flash_kernels runs {pick[1]} code on this cc 9.0 GPU: the build has no sm_90a "
                        "cubin, so its Hopper kernels (wgmma, TMA) are not in it",
                        cause="built for the plain 9.0 (or an older) target; the general kernels run instead, "
                        "about 1.7x slower forward and 2x slower forward+backward at head dim 128 on an H200 "
                        "(benchmarks/results/attention_20261130-160104.md)",
                        fix="rebuild with TORCH_CUDA_ARCH_LIST='8.0;9.0a' (or FLASH_KERNELS_CUDA_ARCHS), or use an "
                        "env whose gpu_targets include 9.0a",
                        details={"module": m.path, "capability": cap, "runs": pick[1]},
                    )
                )
    return out


def _is_flash_kernels_module(path: str) -> bool:
    """flash_kernels' compiled extension (flash_kernels/_C*.so), whose Hopper kernels need sm_90a code."""
    p = Path(path)
    return p.parent.name == "flash_kernels" and p.name.startswith("_C.")


def _may_provide(library: str, u: elf.UnresolvedSymbol) -> bool:
    """Whether a missing ``library`` could be where ``u`` is defined (unknown libraries: yes)."""
    if re.match(r"libcudart\.so", library):
        return u.name.startswith(("cuda", "__cuda"))
    if re.match(r"libcuda\.so", library):
        return u.name.startswith("cu")
    if _TORCH_LIBS.match(library):
        return u.demangled.startswith(_TORCH_NAMESPACES) or u.name.startswith(("aoti_torch_", "THP", "_Z"))
    if library.startswith("libpython"):
        return u.name.startswith(("Py", "_Py"))
    return True


def _missing_lib_fix(name: str, m: probe.ModuleFacts, target: Target) -> str:
    dist = m.distribution or m.package
    cudart = re.match(r"libcudart\.so\.(\d+)", name)
    if cudart and target.torch_cuda and target.torch_cuda.split(".")[0] != cudart.group(1):
        return (
            f"install the {dist} wheel built for torch {target.torch_version} with CUDA "
            f"{target.torch_cuda.split('.')[0]} (the recommended env <env>), or switch to a torch built with "
            f"CUDA {cudart.group(1)}; adding a CUDA {cudart.group(1)} runtime beside this torch does not help: "
            "the module would then fail on torch's own symbols"
        )
    return f"install the package that provides {name}, or the env matching this torch (<env>)"


def _missing_lib_cause(name: str, target: Target) -> str:
    m = re.match(r"libcudart\.so\.(\d+)", name)
    if m:
        here = f" (torch here uses CUDA {target.torch_cuda})" if target.torch_cuda else ""
        return f"built against the CUDA {m.group(1)} runtime, which this environment does not provide{here}"
    if _TORCH_LIBS.match(name):
        return "torch's libraries are not found: torch is missing, or a different torch is installed"
    if name.startswith("libpython"):
        return "built against a shared libpython this system lacks (built for another Python)"
    return "a library it was linked against is not installed or not on the loader's search path"


# ---------------------------------------------------------------------------
# The environment


def environment_findings(facts: probe.Facts) -> list[Finding]:
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

    if not facts.tools.pyelftools:
        out.append(
            Finding(
                "uninspected" if facts.modules else "info",
                "pyelftools-missing",
                "flashkit",
                "pyelftools not installed: symbol checks skipped",
                fix="pip install pyelftools into the interpreter that runs flashkit",
            )
        )

    torch = facts.torch
    if facts.interpreter is not None and torch is None:
        out.append(
            Finding(
                "error",
                "torch-missing",
                "torch",
                f"torch is not installed for {facts.interpreter.executable}",
                cause="flash-attention kernels need torch",
                fix="install the lockfile of the recommended env: pip install -r lockfiles/<env>.txt",
            )
        )
    elif torch is not None and torch.imported is False:
        last = (torch.import_error or "").strip().splitlines()[-1:] or ["(no message)"]
        out.append(
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
        )
    elif torch is not None and torch.imported:
        out.extend(_torch_runtime_findings(facts, torch))

    out.extend(_nvcc_findings(facts))

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

    flash = [d for d in facts.distributions if d.name.lower().replace("-", "_") in ("flash_kernels", "flash_attn")]
    if not flash and not facts.modules and facts.interpreter is not None:
        out.append(
            Finding(
                "info",
                "no-flash-package",
                "flash_kernels",
                "neither flash_kernels nor flash_attn is installed",
                fix="install the flash_kernels wheel of the recommended env",
            )
        )
    return out


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
        if driver and need and _vkey(driver) < _vkey(need):
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
            code = elf.CudaCode(
                tuple(a for a in torch.arch_list if a.startswith("sm_")),
                tuple(a for a in torch.arch_list if a.startswith("compute_")),
                "torch",
            )
            try:
                fits = code.runs_on(_cc(cap))
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


@dataclasses.dataclass(frozen=True)
class BuildLabel:
    """The torch/CUDA a wheel says it was built for, from its local version label.

    flash_kernels (``0.1.0+cu130torch2.11cxx11abitrue``) and flash-attn's release
    wheels (``+cu12torch2.6cxx11abiFALSE``) spell it the same way.
    """

    torch: str  # "2.11"
    cuda: str | None = None  # "13.0", or "12" when the label names only the major
    rocm: str | None = None
    cxx11_abi: bool | None = None


_BUILD_LABEL = re.compile(
    r"(?:cu(?P<cu>\d+)|rocm(?P<rocm>\d+(?:\.\d+)*))?torch(?P<torch>\d+\.\d+)(?:cxx11abi(?P<abi>true|false))?",
    re.IGNORECASE,
)


def build_label(version: str) -> BuildLabel | None:
    if "+" not in version:
        return None
    m = _BUILD_LABEL.search(version.split("+", 1)[1])
    if not m:
        return None
    cuda = None
    if m.group("cu"):
        digits = m.group("cu")
        cuda = digits if len(digits) <= 2 else f"{digits[:-1]}.{digits[-1]}"
    abi = m.group("abi")
    return BuildLabel(m.group("torch"), cuda, m.group("rocm"), None if abi is None else abi.lower() == "true")


def _minor(version: str) -> str:
    return ".".join(re.findall(r"\d+", version)[:2])


def _env_line(env: str, specs_by_id: Mapping[str, Any], records, lockfiles) -> str:
    spec = specs_by_id[env]
    parts = [_verification(env, records.get(env))]
    if lockfiles.get(env):
        parts.append(f"lockfile {lockfiles[env]}")
    if spec.publish_tags:
        parts.append(f"image tag {spec.publish_tags[0]}")
    return f"env {env} ({'; '.join(parts)})"


def built_for_findings(
    facts: probe.Facts,
    findings: Sequence[Finding],
    specs: Sequence[Any] | None,
    records: Mapping[str, Any],
    lockfiles: Mapping[str, str | None],
    recommended: str | None,
) -> list[Finding]:
    """One finding per flash package built for another torch/CUDA than the one here, with both ways out.

    The evidence is the wheel's version label, the CUDA runtime its modules
    link (``libcudart.so.13``) and the module findings already made; it is an
    error when those findings hold an error, a warning otherwise.
    """
    torch = facts.torch
    if torch is None or not torch.imported or not torch.version:
        return []
    out = []
    by_id = {str(s.id): s for s in specs or ()}
    for dist in facts.distributions:
        if dist.name.lower().replace("-", "_") not in probe.MODULE_PACKAGES:
            continue
        label = build_label(dist.version)
        mods = [m for m in facts.modules if m.distribution == dist.name]
        cudart = sorted({x.group(1) for m in mods for n in m.needed if (x := re.match(r"libcudart\.so\.(\d+)$", n))})
        built_torch = label.torch if label else None
        built_cuda = label.cuda if label and label.cuda else (cudart[0] if len(cudart) == 1 else None)
        torch_differs = built_torch is not None and built_torch != _minor(torch.version)
        cuda_differs = (
            built_cuda is not None and torch.cuda is not None and built_cuda.split(".")[0] != torch.cuda.split(".")[0]
        )
        if not (torch_differs or cuda_differs):
            continue
        paths = {m.path for m in mods}
        errors = [f for f in findings if f.severity == "error" and f.details.get("module") in paths]
        symbols = [
            f.details["demangled"]
            for f in errors
            if f.code in ("undefined-symbol", "cxx-abi-mismatch")
            and str(f.details.get("demangled", "")).startswith(_TORCH_NAMESPACES)
        ]
        built = " with ".join(
            x
            for x in (f"torch {built_torch}" if built_torch else None, f"CUDA {built_cuda}" if built_cuda else None)
            if x
        )
        here = f"torch {torch.version}" + (f" with CUDA {torch.cuda}" if torch.cuda else "")
        evidence = []
        if label:
            evidence.append(f"its version label +{dist.version.split('+', 1)[1]}")
        missing_rt = [f"libcudart.so.{n}" for n in cudart if torch.cuda and n != torch.cuda.split(".")[0]]
        if missing_rt:
            evidence.append(f"its modules link {', '.join(missing_rt)} (CUDA {cudart[0]})")
        if symbols:
            evidence.append(
                f"{len(symbols)} torch C++ symbol(s) that torch {torch.version} does not define, e.g. `{symbols[0]}`"
            )
        ways = []
        if recommended in by_id and _minor(by_id[recommended].torch) == _minor(torch.version):
            ways.append(
                f"keep torch {torch.version}: install the {dist.name} wheel (or the image) of "
                + _env_line(recommended, by_id, records, lockfiles)
            )
        else:
            ways.append(f"rebuild {dist.name} against torch {torch.version}")
        origin = [
            str(s.id)
            for s in specs or ()
            if built_torch
            and _minor(s.torch) == built_torch
            and (
                built_cuda is None
                or (s.accelerator.kind == "cuda" and s.accelerator.major == int(built_cuda.split(".")[0]))
            )
        ]
        if origin:
            ways.append(
                "or keep this wheel: use the combination it was built for, "
                + _env_line(origin[0], by_id, records, lockfiles)
            )
        elif built:
            ways.append(f"or install the torch it was built for ({built})")
        out.append(
            Finding(
                "error" if errors else "warning",
                "built-for-another-torch",
                dist.name,
                f"{dist.name} {dist.version} was built for {built}; this environment has {here}",
                cause="a wheel built for another torch/CUDA combination"
                + (": " + "; ".join(evidence) if evidence else ""),
                fix="; ".join(ways),
                details={
                    "distribution": dist.name,
                    "version": dist.version,
                    "built_for": {"torch": built_torch, "cuda": built_cuda},
                    "here": {"torch": torch.version, "cuda": torch.cuda},
                    "symbols": symbols,
                    "envs": {"recommended": recommended, "built_for": origin[0] if origin else None},
                },
            )
        )
    return out


# ---------------------------------------------------------------------------
# Recommendation


def _gpu_caps(facts: probe.Facts, stated: Sequence[str]) -> tuple[str, ...]:
    caps = list(stated)
    for g in facts.gpus:
        if g.capability:
            caps.append(g.capability)
    if facts.torch is not None and facts.torch.cuda:  # on ROCm "capabilities" are not CUDA archs
        caps.extend(d.capability for d in facts.torch.devices if re.fullmatch(r"\d+\.\d+", d.capability))
    return tuple(dict.fromkeys(caps))


def _targets_cover(gpu_targets: Iterable[str], cap: str) -> bool:
    cubins, ptx = [], []
    for t in gpu_targets:
        m = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", t)
        if not m:
            continue
        arch = f"{m.group(1)}{m.group(2)}{m.group(3)}"
        cubins.append(f"sm_{arch}")
        if m.group(4):
            ptx.append(f"compute_{arch}")
    try:
        return elf.CudaCode(tuple(cubins), tuple(ptx), "spec").runs_on(_cc(cap)) is not None
    except ValueError:
        return False


def score_env(spec, facts: probe.Facts, caps: Sequence[str], lock_cuda: str | None = None) -> Candidate:
    """How well one EnvSpec fits the probed environment (higher is closer).

    ``lock_cuda`` is the CUDA runtime the env's lockfile pins for torch ("12.6"):
    the spec's accelerator version is its toolkit's, and torch's wheel may use a
    newer minor of the same major (torch 2.7.1 from PyPI is cu126 beside nvcc 12.4).
    """
    score = 0
    matches: list[str] = []
    diffs: list[str] = []
    fields: list[str] = []

    def differs(field: str, text: str) -> None:
        diffs.append(text)
        fields.append(field)

    torch = facts.torch if facts.torch is not None and facts.torch.imported else None
    want_kind = "rocm" if torch and torch.hip else "cuda" if (torch and torch.cuda) or facts.gpus else None
    kind = spec.accelerator.kind
    if want_kind:
        if kind == want_kind:
            score += 30
            matches.append(f"accelerator {kind}")
        else:
            score -= 100
            differs("accelerator", f"accelerator {kind} (this machine: {want_kind})")

    if torch and torch.version:
        here = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", torch.version)
        env_t = spec.torch.split(".")
        if here and env_t[:2] == [here.group(1), here.group(2)]:
            score += 40
            matches.append(f"torch {spec.torch}")
            if here.group(3) is not None and len(env_t) > 2 and env_t[2] != here.group(3):
                score -= 2
                differs("torch", f"torch patch {spec.torch} (here {torch.version})")
        elif here:
            gap = abs((int(env_t[0]) * 100 + int(env_t[1])) - (int(here.group(1)) * 100 + int(here.group(2))))
            score -= 10 + gap
            differs("torch", f"torch {spec.torch} (here {torch.version})")
        accel_here = torch.hip if kind == "rocm" else torch.cuda
        if accel_here and kind == (want_kind or kind):
            ah = accel_here.split(".")
            ev = spec.accelerator.version.split(".")
            if ah[:1] == ev[:1]:
                score += 20
                if ah[:2] == ev[:2]:
                    score += 5
                    matches.append(f"{spec.accelerator}")
                elif lock_cuda and ah[:2] == lock_cuda.split(".")[:2]:
                    score += 5
                    matches.append(f"{spec.accelerator} toolkit, torch's CUDA {lock_cuda} runtime (lockfile)")
                else:
                    differs("accelerator", f"{spec.accelerator} (torch here uses {accel_here})")
            else:
                score -= 20
                differs("accelerator", f"{spec.accelerator} (torch here uses {accel_here})")
        if torch.cxx11_abi is not None:
            if spec.cxx11_abi == torch.cxx11_abi:
                score += 5
                matches.append(f"cxx11_abi {str(spec.cxx11_abi).lower()}")
            else:
                score -= 15
                here_abi = str(torch.cxx11_abi).lower()
                differs("cxx11_abi", f"cxx11_abi {str(spec.cxx11_abi).lower()} (torch here: {here_abi})")
    elif kind == "cuda" and facts.gpus and facts.gpus[0].driver:
        need = MIN_DRIVER_FOR_CUDA.get(spec.accelerator.major)
        if need and _vkey(facts.gpus[0].driver) < _vkey(need):
            score -= 50
            differs("accelerator", f"{spec.accelerator} needs driver >= {need} (here {facts.gpus[0].driver})")
        else:
            score += 10
            matches.append(f"{spec.accelerator} runs on driver {facts.gpus[0].driver}")

    if facts.interpreter is not None:
        py = "{}.{}".format(*facts.interpreter.python)
        if spec.python == py:
            score += 10
            matches.append(f"python {py}")
        else:
            differs("python", f"python {spec.python} in the env (here {py}; an abi3 wheel of the env still loads)")

    if kind == "cuda":
        for cap in caps:
            if _targets_cover(spec.gpu_targets, cap):
                score += 10
                matches.append(f"gpu_targets cover {cap}")
            else:
                score -= 30
                differs("gpu_targets", f"gpu_targets {list(spec.gpu_targets)} do not cover this GPU ({cap})")
    return Candidate(str(spec.id), score, tuple(matches), tuple(diffs), tuple(dict.fromkeys(fields)))


def _record_passed(record: Mapping[str, Any] | None) -> bool:
    """True when the latest entry has tier results and none failed (for ranking only, not a verdict)."""
    if not record:
        return False
    entry = (record.get("entries") or {}).get(record.get("latest") or "")
    tiers = entry.get("tiers") if isinstance(entry, Mapping) else None
    return bool(tiers) and all(
        isinstance(t, Mapping) and t.get("verdict") in ("passed", "not-run") for t in tiers.values()
    )


def _verification(env: str, record: Mapping[str, Any] | None) -> str:
    if not record:
        return f"not verified (no verified/{env}.json record)"
    entries = record.get("entries") or {}
    latest = record.get("latest")
    entry = entries.get(latest) if latest else None
    if not isinstance(entry, Mapping):
        return "not verified (the record has no entry)"
    tiers = entry.get("tiers") or {}
    parts = [f"{name} {t.get('verdict', '?')}" for name, t in sorted(tiers.items()) if isinstance(t, Mapping)]
    return f"record for input hash {str(latest)[:12]}: " + (", ".join(parts) or "no tier results")


def recommend(
    facts: probe.Facts,
    specs: Sequence[Any],
    records: Mapping[str, Mapping[str, Any] | None],
    lockfiles: Mapping[str, str | None],
    caps: Sequence[str] = (),
    lock_cuda: Mapping[str, str | None] | None = None,
) -> Recommendation:
    """The closest env to this environment, with its status, or which spec to add."""
    if not specs:
        return Recommendation(None, False, "no env specs found under envs/")
    by_id = {str(s.id): s for s in specs}
    scored = []
    for s in specs:
        c = score_env(s, facts, caps, (lock_cuda or {}).get(str(s.id)))
        if _record_passed(records.get(str(s.id))):
            c = dataclasses.replace(c, score=c.score + 5, matches=(*c.matches, "verified"))
        scored.append(c)
    # ties go to the newest torch, then the newest accelerator version
    ranked = sorted(
        scored,
        key=lambda c: (
            -c.score,
            [-x for x in _vkey(by_id[c.env].torch)],
            [-x for x in _vkey(by_id[c.env].accelerator.version)],
            c.env,
        ),
    )
    best = ranked[0]
    spec = next(s for s in specs if str(s.id) == best.env)
    exact = not best.differences and facts.torch is not None and bool(facts.torch.imported)
    why = "fits this environment" if exact else "closest env; it differs in: " + "; ".join(best.differences)
    if not best.differences and not exact:
        why = "best match for this machine (no working torch here to compare against)"
    add = None if exact else _spec_to_add(facts, caps, best, specs)
    return Recommendation(
        env=best.env,
        exact=exact,
        reason=why,
        differences=best.differences,
        mismatched=best.mismatched,
        verification=_verification(best.env, records.get(best.env)),
        lockfile=lockfiles.get(best.env),
        publish_tags=tuple(spec.publish_tags),
        add_spec=add,
        candidates=tuple(ranked[:5]),
    )


def _spec_to_add(facts: probe.Facts, caps: Sequence[str], best: Candidate, specs: Sequence[Any]) -> str | None:
    """Name the spec change that would fit exactly, when a working torch says what fits."""
    torch = facts.torch
    if torch is None or not torch.imported or not torch.version or facts.interpreter is None:
        return None
    if set(best.mismatched) == {"python"}:
        return None  # only the image's Python differs: the env's abi3 wheel serves this Python
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", torch.version)
    accel = torch.hip or torch.cuda
    if not m or not accel:
        return None
    major, minor = accel.split(".")[:2]
    env_id = f"{'rocm' if torch.hip else 'cu'}{major}{minor}-torch{m.group(1)}{m.group(2)}"
    if best.env == env_id and set(best.mismatched) <= {"gpu_targets", "python"}:
        spec = next(s for s in specs if str(s.id) == env_id)
        missing = [c for c in caps if not _targets_cover(spec.gpu_targets, c)]
        return f"add {', '.join(repr(c) for c in missing)} to gpu_targets in envs/{env_id}.yaml"
    py = "{}.{}".format(*facts.interpreter.python)
    name = env_id if all(str(s.id) != env_id for s in specs) else f"{env_id}-py{py.replace('.', '')}"
    targets = ", ".join(f'"{c}"' for c in caps) or '"8.0", "9.0"'
    return (
        f'add envs/{name}.yaml with python: "{py}", torch: "{m.group(1)}.{m.group(2)}.{m.group(3)}", '
        f'accelerator: {{kind: {"rocm" if torch.hip else "cuda"}, version: "{major}.{minor}"}}, '
        f"cxx11_abi: {str(bool(torch.cxx11_abi)).lower()}, gpu_targets: [{targets}]"
    )


# ---------------------------------------------------------------------------
# Putting it together


def diagnose(
    facts: probe.Facts,
    *,
    specs: Sequence[Any] | None = None,
    records: Mapping[str, Mapping[str, Any] | None] | None = None,
    lockfiles: Mapping[str, str | None] | None = None,
    capabilities: Sequence[str] = (),
    glibc_policy: str | None = None,
    repo_problem: RepoProblem | None = None,
    lock_cuda: Mapping[str, str | None] | None = None,
) -> Diagnosis:
    """Findings and a recommendation from probed facts. Pure: no I/O.

    ``capabilities`` are GPU archs to check the modules against besides the
    GPUs found ("9.0"); ``glibc_policy`` a manylinux policy to hold them to;
    ``lock_cuda`` the CUDA runtime each env's lockfile pins (:func:`lock_cuda_runtime`).
    """
    caps = _gpu_caps(facts, capabilities)
    torch = facts.torch
    target = Target(
        python=facts.interpreter.python if facts.interpreter else None,
        glibc=facts.interpreter.glibc if facts.interpreter else None,
        glibc_policy=glibc_policy,
        torch_version=torch.version if torch is not None and torch.imported else None,
        torch_cxx11_abi=torch.cxx11_abi if torch is not None and torch.imported else None,
        torch_cuda=torch.cuda if torch is not None and torch.imported else None,
        capabilities=caps,
    )
    findings = environment_findings(facts)
    for m in facts.modules:
        findings.extend(module_findings(m, target))
    rec = None
    if repo_problem:
        findings.append(
            Finding(
                "info",
                "no-recommendation",
                "envs",
                f"no recommendation: {repo_problem.what}",
                fix=repo_problem.fix,
            )
        )
    elif specs is not None:
        rec = recommend(facts, specs, records or {}, lockfiles or {}, caps, lock_cuda)
    findings.extend(
        built_for_findings(facts, findings, specs, records or {}, lockfiles or {}, rec.env if rec else None)
    )
    if rec is not None and rec.env:
        findings = [
            dataclasses.replace(f, fix=f.fix.replace("<env>", rec.env)) if f.fix and "<env>" in f.fix else f
            for f in findings
        ]
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: (order[f.severity], f.subject, f.code))
    return Diagnosis(tuple(findings), rec)


def to_json(diagnosis: Diagnosis, facts: probe.Facts) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "status": diagnosis.status,
        "exit_code": diagnosis.exit_code,
        "findings": [probe.json_ready(dataclasses.asdict(f)) for f in diagnosis.findings],
        "recommendation": probe.json_ready(dataclasses.asdict(diagnosis.recommendation))
        if diagnosis.recommendation
        else None,
        "facts": facts.to_json(),
    }


# ---------------------------------------------------------------------------
# Command line


_DESCRIPTION = """\
Inspect a Python environment (this interpreter, or --python PATH) without importing torch in
this process: Python tag, torch and its CUDA/HIP and C++ ABI, nvcc, GPUs, installed flash_kernels /
flash_attn and their compiled modules (undefined symbols, GPU code, glibc, abi3). Each finding says
what, the likely cause and the fix; the closest env in envs/ is recommended with its status.

exit codes:
  0   healthy: no problem found
  20  problems found (a finding of severity "error")
  21  could not inspect (the interpreter did not answer, a module could not be read, pyelftools
      missing while there are modules to check, or doctor itself failed)
  2   usage error
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor",
        help="diagnose this Python environment for flash-attention and recommend the env that fits",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help=f"print one JSON object (schema_version {SCHEMA_VERSION})")
    p.add_argument(
        "--repo",
        type=Path,
        # SUPPRESS: an unset --repo here must not hide `flashkit --repo DIR doctor`
        default=argparse.SUPPRESS,
        help="flashkit checkout with envs/ (default: found from cwd)",
    )
    p.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="inspect the environment of this interpreter (default: the one running flashkit)",
    )
    p.add_argument(
        "--arch",
        action="append",
        default=[],
        metavar="CC",
        help="also check compiled modules against this GPU compute capability, e.g. 9.0 (repeatable)",
    )
    p.add_argument(
        "--manylinux",
        default=None,
        metavar="POLICY",
        help="hold modules to this glibc policy, e.g. manylinux_2_28",
    )
    p.add_argument(
        "--facts",
        type=Path,
        metavar="FILE",
        help="diagnose facts probed elsewhere (`python -m flashkit.doctor.probe -o FILE`, or a doctor --json) "
        "instead of probing here",
    )
    p.add_argument(
        "--root",
        metavar="DIR",
        help="with --facts: read the compiled modules from the filesystem mounted at DIR "
        "(an image's root; paths in the facts are inside it)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=probe.TORCH_TIMEOUT_S,
        metavar="S",
        help=f"limit for the child that imports torch (default {probe.TORCH_TIMEOUT_S} s)",
    )
    p.add_argument(
        "--no-import",
        action="store_true",
        help="do not import torch or the modules in the target interpreter",
    )
    p.set_defaults(func=run)
    return p


def _bad_usage(args: argparse.Namespace) -> str | None:
    for cap in args.arch:
        if not re.fullmatch(r"\d{1,2}\.\d", cap):
            return f"--arch {cap!r} is not a compute capability like 8.0 or 9.0"
    if args.root and not args.facts:
        return "--root applies to --facts (facts probed inside that filesystem with `python -m flashkit.doctor.probe`)"
    if args.root and not os.path.isdir(args.root):
        return f"--root {args.root} is not a directory"
    if args.facts and (args.python or args.no_import):
        return "--facts reads facts probed elsewhere; --python and --no-import apply to probing here"
    if args.manylinux:
        try:
            elf.glibc_of_policy(args.manylinux)
        except ValueError as exc:
            return f"--manylinux: {exc}"
    return None


def _load_repo(repo: Path | None) -> tuple[list[Any] | None, dict, dict, RepoProblem | None, dict]:
    """Specs, records, lockfiles, why not (or None) and each lockfile's torch CUDA runtime."""
    try:
        from flashkit.core import paths
        from flashkit.plan import spec
    except ImportError as exc:
        return (
            None,
            {},
            {},
            RepoProblem(
                f"cannot read env specs here ({exc})",
                "install flashkit's dependencies (PyYAML, packaging), or probe here with "
                "`python -m flashkit.doctor.probe -o facts.json` and run `flashkit doctor --facts facts.json` "
                "where they are installed",
            ),
            {},
        )
    try:
        root = Path(repo) if repo else paths.find_repo_root()
        if not paths.is_repo_root(root):
            return (
                None,
                {},
                {},
                RepoProblem(
                    f"--repo {root} is not a flashkit checkout (it needs envs/ and {paths.TEMPLATE})",
                    "pass --repo the root of the flashkit checkout",
                ),
                {},
            )
        specs = spec.load_all(root)
    except Exception as exc:  # a broken spec must not stop the diagnosis
        return None, {}, {}, RepoProblem(str(exc), "run inside a flashkit checkout or pass --repo PATH"), {}
    records: dict[str, Any] = {}
    lockfiles: dict[str, str | None] = {}
    lock_cuda: dict[str, str | None] = {}
    for s in specs:
        env = str(s.id)
        path = root / "verified" / f"{env}.json"
        try:
            records[env] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError) as exc:
            records[env] = {"entries": {}, "error": str(exc)}
        lock = paths.lock_file(root, env)
        lockfiles[env] = paths.rel(root, lock) if lock.is_file() else None
        lock_cuda[env] = lock_cuda_runtime(lock) if lock.is_file() else None
    return specs, records, lockfiles, None, lock_cuda


_CUDA_RUNTIME_PIN = re.compile(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)", re.MULTILINE | re.IGNORECASE)


def lock_cuda_runtime(lock: Path) -> str | None:
    """The CUDA runtime ("12.6") a lockfile pins for torch (nvidia-cuda-runtime[-cuXX]==...), or None."""
    try:
        m = _CUDA_RUNTIME_PIN.search(lock.read_text(encoding="utf-8"))
    except OSError:
        return None
    return f"{m.group(1)}.{m.group(2)}" if m else None


def run(args: argparse.Namespace) -> int:
    problem = _bad_usage(args)
    if problem:
        print(f"flashkit doctor: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run(args)
    except Exception as exc:
        # a failure of doctor itself must not read as a verdict ("problems found")
        if os.environ.get("FLASHKIT_DEBUG") == "1" or getattr(args, "debug", False):
            import traceback

            traceback.print_exc()
        print(f"flashkit doctor: could not inspect: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNINSPECTED


def load_facts(path: Path) -> probe.Facts:
    """Facts from a ``python -m flashkit.doctor.probe`` file or a ``flashkit doctor --json`` output."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--facts {path}: cannot read JSON: {exc}") from None
    if not isinstance(data, dict) or "facts" not in data:
        raise ValueError(f"--facts {path}: no 'facts' object; write one with `python -m flashkit.doctor.probe -o FILE`")
    try:
        return probe.Facts.from_json(data["facts"])
    except ValueError as exc:
        raise ValueError(f"--facts {path}: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    if args.facts:
        try:
            facts = load_facts(args.facts)
        except ValueError as exc:
            print(f"flashkit doctor: {exc}", file=sys.stderr)
            return EXIT_UNINSPECTED
        if args.root:
            facts = probe.reinspect(facts, args.root)
    else:
        facts = probe.probe(args.python, import_torch=not args.no_import, torch_timeout=args.timeout)
    repo = getattr(args, "repo", None)
    specs, records, lockfiles, repo_problem, lock_cuda = _load_repo(Path(repo) if repo else None)
    diagnosis = diagnose(
        facts,
        specs=specs,
        records=records,
        lockfiles=lockfiles,
        capabilities=args.arch,
        glibc_policy=args.manylinux,
        repo_problem=repo_problem,
        lock_cuda=lock_cuda,
    )
    if args.json:
        sys.stdout.write(json.dumps(to_json(diagnosis, facts), indent=2, sort_keys=True) + "\n")
    else:
        render(diagnosis, facts)
    return diagnosis.exit_code


# ---------------------------------------------------------------------------
# Human output

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", "uninspected": "magenta"}


def _fact_rows(facts: probe.Facts) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    i = facts.interpreter
    rows.append(("python", f"{i.version} ({i.tag}) {i.executable}, glibc {i.glibc or '?'}" if i else "not inspected"))
    t = facts.torch
    if t is None:
        rows.append(("torch", "not installed"))
    elif t.imported:
        accel = f"CUDA {t.cuda}" if t.cuda else f"HIP {t.hip}" if t.hip else "CPU only"
        rows.append(("torch", f"{t.version}, {accel}, cxx11_abi={t.cxx11_abi}, {t.location}"))
    elif t.imported is None:
        rows.append(("torch", f"installed at {t.location} (import not tried)"))
    else:
        rows.append(("torch", "installed, import FAILS"))
    rows.append(("nvcc", f"{facts.nvcc.version} ({facts.nvcc.path})" if facts.nvcc else "not found"))
    if facts.gpus:
        for g in facts.gpus:
            rows.append(("gpu", f"{g.name}, sm {g.capability or '?'}, driver {g.driver or '?'}"))
    elif t is not None and t.devices:
        for d in t.devices:
            rows.append(("gpu", f"{d.name}, sm {d.capability}"))
    else:
        rows.append(("gpu", "none visible"))
    for d in facts.distributions:
        if d.name.lower() in ("torch",):
            continue
        tags = f" [{', '.join(d.wheel_tags)}]" if d.wheel_tags else ""
        rows.append(("package", f"{d.name} {d.version}{tags}"))
    for m in facts.modules:
        rows.append(("module", f"{m.path} ({m.tag.label})"))
    return rows


def render(diagnosis: Diagnosis, facts: probe.Facts, file=None) -> None:
    """Print the diagnosis for a person: with rich when it is installed, plain text otherwise."""
    out = file or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        _render_plain(diagnosis, facts, out)
        return
    console = Console(file=out, highlight=False, soft_wrap=True, width=None if out.isatty() else 160)
    table = Table(title="flashkit doctor", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in _fact_rows(facts):
        table.add_row(Text(k), Text(v))  # Text: "[...]" in values is not rich markup
    console.print(table)
    console.print()
    if not diagnosis.findings:
        console.print(Text("No problems found.", style="green"))
    for f in diagnosis.findings:
        head = Text()
        head.append(f"{f.severity.upper():<11}", style=_STYLE[f.severity])
        head.append(f" [{f.code}] ", style="dim")
        head.append(f.what)
        console.print(head)
        if f.subject and f.subject not in f.what:
            console.print(Text(f"            in: {f.subject}", style="dim"))
        if f.cause:
            console.print(Text(f"            cause: {f.cause}"))
        if f.fix:
            console.print(Text(f"            fix: {f.fix}", style="green"))
    console.print()
    _render_recommendation(diagnosis.recommendation, lambda s, style=None: console.print(Text(s, style=style or "")))
    style = {"healthy": "bold green", "problems": "bold red", "uninspected": "bold magenta"}[diagnosis.status]
    console.print(Text(f"status: {diagnosis.status} (exit {diagnosis.exit_code})", style=style))


def _render_recommendation(rec: Recommendation | None, say) -> None:
    if rec is None:
        return
    if rec.env is None:
        say(f"recommendation: none ({rec.reason})", "bold")
        return
    say(f"recommended env: {rec.env}" + (" (fits)" if rec.exact else " (closest)"), "bold")
    say(f"  {rec.reason}")
    say(f"  status: {rec.verification}")
    say(f"  lockfile: {rec.lockfile or 'none yet (run flashkit lock ' + rec.env + ')'}")
    if rec.publish_tags:
        say(f"  image tags: {', '.join(rec.publish_tags)}")
    if rec.add_spec:
        say(f"  to fit exactly: {rec.add_spec}")


def _render_plain(diagnosis: Diagnosis, facts: probe.Facts, out) -> None:
    def say(text: str, _style: str | None = None) -> None:
        out.write(text + "\n")

    say("flashkit doctor")
    for k, v in _fact_rows(facts):
        say(f"  {k:<8} {v}")
    say("")
    if not diagnosis.findings:
        say("No problems found.")
    for f in diagnosis.findings:
        say(f"{f.severity.upper():<11} [{f.code}] {f.what}")
        if f.subject and f.subject not in f.what:
            say(f"            in: {f.subject}")
        if f.cause:
            say(f"            cause: {f.cause}")
        if f.fix:
            say(f"            fix: {f.fix}")
    say("")
    _render_recommendation(diagnosis.recommendation, say)
    say(f"status: {diagnosis.status} (exit {diagnosis.exit_code})")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flashkit.doctor.report``: the doctor alone, for hosts without the CLI's other dependencies."""
    parser = argparse.ArgumentParser(prog="flashkit")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
