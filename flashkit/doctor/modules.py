"""Findings about one compiled module: its Python tag, libraries, symbols, glibc, C++ ABI, abi3 claim and GPU code."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from flashkit.binary import elf, fatbin, linking
from flashkit.binary.torch_abi import TORCH_NAMESPACES, is_shim_symbol
from flashkit.doctor import probe
from flashkit.doctor.model import (
    TORCH_LIBS,
    BuildLabel,
    Finding,
    Target,
    capability,
    vkey,
)

# Compiled modules


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


def symbol_finding(
    u: linking.UnresolvedSymbol, m: probe.ModuleFacts, target: Target, built: BuildLabel | None = None
) -> Finding:
    """Name the likely cause of one undefined symbol, from its name and its near misses
    (and ``built``, the label of the wheel the module came with, when it says stable ABI)."""
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
        code, (cause, fix) = "cxx-abi-mismatch", _cxx_abi_mismatch(u, abi[0], target)
    else:
        code, (cause, fix) = "undefined-symbol", _undefined_symbol_cause(u, shown, m, target, built)
    return Finding("error", code, m.path, what, cause=cause, fix=fix, details=details)


def _cxx_abi_mismatch(u: linking.UnresolvedSymbol, near: linking.NearMiss, target: Target) -> tuple[str, str]:
    """(cause, fix) of a symbol defined in scope only with the other std::string ABI."""
    module_new = "__cxx11" in u.name or "cxx11" in u.demangled
    mod_flag, prov_flag = (1, 0) if module_new else (0, 1)
    torch_note = ""
    if target.torch_cxx11_abi is not None:
        torch_note = f"; this torch uses _GLIBCXX_USE_CXX11_ABI={int(target.torch_cxx11_abi)}"
    cause = (
        f"C++ ABI mismatch: the module was built with _GLIBCXX_USE_CXX11_ABI={mod_flag}, "
        f"but {_base(near.provider)} was built with ={prov_flag} and defines `{near.demangled}` "
        f"(differs only in the std::string ABI){torch_note}"
    )
    fix = (
        f"rebuild the module with -D_GLIBCXX_USE_CXX11_ABI={prov_flag} "
        "(torch's cpp_extension sets it "
        "to match the torch it builds against), or use an env whose cxx11_abi matches"
    )
    return cause, fix


def _undefined_symbol_cause(
    u: linking.UnresolvedSymbol, shown: str, m: probe.ModuleFacts, target: Target, built: BuildLabel | None = None
) -> tuple[str, str]:
    """(cause, fix) of a symbol nothing in scope defines, judged by its near misses, then by its name."""
    if u.near_misses:
        near = u.near_misses[0]
        from_torch = bool(TORCH_LIBS.match(_base(near.provider))) or shown.startswith(TORCH_NAMESPACES)
        built = "another torch version" if from_torch else f"another version of {_base(near.provider)}"
        cause = (
            f"built against {built}: the loaded {_base(near.provider)} defines `{near.demangled}` "
            f"instead of `{shown}`"
            + (f" (torch here is {target.torch_version})" if from_torch and target.torch_version else "")
        )
        return cause, _rebuild_fix(m, target)
    if built is not None and built.stable and is_shim_symbol(u.name):
        return _stable_shim_cause(u, m, target, built)
    if shown.startswith(TORCH_NAMESPACES) or u.name.startswith(("aoti_torch_", "THP")):
        cause = "built against another torch version: no loaded torch library defines it" + (
            f" (torch here is {target.torch_version})" if target.torch_version else ""
        )
        return cause, _rebuild_fix(m, target)
    if u.name.startswith(("Py", "_Py")):
        return (
            "built for another Python version or interpreter: this interpreter does not define it",
            f"rebuild {m.distribution or m.package} for this Python, or install the wheel built for it",
        )
    if u.version:
        return (
            f"needs version {u.version} of {u.version_file or 'a system library'}, which the loaded one lacks",
            "use a system (or image) whose libraries are at least as new as the build machine's",
        )
    return (
        "no library in the load scope defines it: a library it was built against is missing or different",
        _rebuild_fix(m, target),
    )


def _stable_shim_cause(
    u: linking.UnresolvedSymbol, m: probe.ModuleFacts, target: Target, built: BuildLabel
) -> tuple[str, str]:
    """(cause, fix) of a function of torch's stable C shim that the loaded torch lacks, in a stable-ABI wheel."""
    dist = m.distribution or m.package
    here = target.torch_version
    shim = f"`{u.name}` is a function of torch's stable C ABI that {f'torch {here}' if here else 'this torch'} "
    if here and built.fits_torch(here):  # a torch new enough lacks it: the wheel uses more than its label says
        return (
            shim + f"does not export, though the wheel's label says torch >= {built.torch} is enough: it was "
            "built against a newer stable ABI than it claims (TORCH_TARGET_VERSION)",
            f"rebuild {dist} for the stable ABI of torch {built.torch}, or install the newer torch it was built against",
        )
    cuda = f" built with CUDA {built.cuda.split('.')[0]}" if built.cuda else ""
    return (
        f"this stable-ABI wheel needs torch >= {built.torch}: " + shim + "does not export "
        f"(the wheel fits torch {built.torch} and every later torch{cuda})",
        f"install torch >= {built.torch}{cuda} (this one wheel fits them all), or the {dist} wheel/image of "
        "the flashkit env that matches this torch (see the recommendation)",
    )


def _glibc_findings(m: probe.ModuleFacts, target: Target) -> list[Finding]:
    out = []
    need = m.glibc_required
    if not need:
        return out
    for limit, where in ((target.glibc, "this system's glibc"), (_policy_glibc(target.glibc_policy), None)):
        if not limit or vkey(need) <= vkey(limit):
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


def module_findings(m: probe.ModuleFacts, target: Target, built: BuildLabel | None = None) -> list[Finding]:
    """Everything wrong (or unknown) about one compiled module; ``built``: its wheel's version label, if any."""
    out = [
        *_inspection_findings(m),
        *_python_tag_findings(m, target),
        *_import_failure_findings(m),
        *_resolution_findings(m, target, built),
        *_loader_symbol_findings(m, target, built),
    ]
    # the loader's own verdict on libc's versions (missing_versions) already says it for this system
    res = m.resolution
    loader_said = res is not None and any(v.version.startswith("GLIBC_") for v in res.missing_versions)
    out.extend(_glibc_findings(m, dataclasses.replace(target, glibc=None) if loader_said else target))
    out.extend(_cxx_abi_findings(m, target, out))
    out.extend(_abi3_findings(m))
    out.extend(_embedded_runtime_findings(m))
    out.extend(_gpu_code_findings(m, target))
    return out


def _inspection_findings(m: probe.ModuleFacts) -> list[Finding]:
    """What could not be read about the module: not read at all (--no-elf), or a step that failed."""
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
    return out


def _python_tag_findings(m: probe.ModuleFacts, target: Target) -> list[Finding]:
    # a cpython-311 file is not even looked for by CPython 3.12
    if not (m.extension is not False and m.tag.kind == "cpython" and target.python and m.tag.python != target.python):
        return []
    built = f"{m.tag.python[0]}.{m.tag.python[1]}"
    here = f"{target.python[0]}.{target.python[1]}"
    return [
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
    ]


def _import_failure_findings(m: probe.ModuleFacts) -> list[Finding]:
    if not (m.import_error and m.extension is not False):
        return []
    return [
        Finding(
            "error",
            "import-failed",
            m.path,
            f"loading it after `import torch` fails: {m.import_error.splitlines()[-1]}",
            cause="see the findings for this module below" if m.resolution and not m.resolution.ok else None,
            details={"module": m.path, "error": m.import_error},
        )
    ]


def _resolution_findings(m: probe.ModuleFacts, target: Target, built: BuildLabel | None) -> list[Finding]:
    """What loading the module against the load scope leaves unresolved: libraries, versions, symbols."""
    res = m.resolution
    if res is None:
        return []
    out = [*_missing_library_findings(m, res, target), *_missing_version_findings(m, res)]
    # the loader stops at the first missing library, but symbols that library cannot
    # provide (torch's C++ API when libcudart is missing) are still this module's problem
    for u in res.unresolved:
        if not any(_may_provide(miss.name, u) for miss in res.missing_libraries):
            out.append(symbol_finding(u, m, target, built))
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
    return out


def _missing_library_findings(m: probe.ModuleFacts, res: linking.Resolution, target: Target) -> list[Finding]:
    return [
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
        for miss in res.missing_libraries
    ]


def _missing_version_findings(m: probe.ModuleFacts, res: linking.Resolution) -> list[Finding]:
    out = []
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
    return out


def _loader_symbol_findings(m: probe.ModuleFacts, target: Target, built: BuildLabel | None) -> list[Finding]:
    # no ELF reading here (e.g. no pyelftools): the loader's own message still names the symbol
    if m.resolution is not None or not m.loader_symbol:
        return []
    name, demangled = m.loader_symbol
    found = symbol_finding(linking.UnresolvedSymbol(name, demangled, None, None, "?", ()), m, target, built)
    return [dataclasses.replace(found, details={**found.details, "source": "loader message"})]


def _cxx_abi_findings(m: probe.ModuleFacts, target: Target, so_far: list[Finding]) -> list[Finding]:
    """The module's C++ string ABI against torch's, unless ``so_far`` already holds a cxx-abi-mismatch.

    A mismatch without an undefined symbol is a warning.
    """
    if not (
        m.cxx_abi in ("cxx11", "pre-cxx11")
        and target.torch_cxx11_abi is not None
        and (m.cxx_abi == "cxx11") != target.torch_cxx11_abi
        and not any(f.code == "cxx-abi-mismatch" for f in so_far)
    ):
        return []
    return [
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
    ]


def _abi3_findings(m: probe.ModuleFacts) -> list[Finding]:
    """A module that claims abi3 but uses symbols outside the stable ABI it claims."""
    if not m.limited_api:
        return []
    names = [i.symbol for i in m.limited_api]
    return [
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
    ]


def _embedded_runtime_findings(m: probe.ModuleFacts) -> list[Finding]:
    """A module linked with libstdc++.a: it imports and runs, and dies at its first error message."""
    if not m.embedded_cxx_runtime:
        return []
    return [
        Finding(
            "error",
            "embedded-cxx-runtime",
            m.path,
            "carries its own copy of the C++ runtime (defines "
            + ", ".join(m.embedded_cxx_runtime)
            + "): two libstdc++ copies in one process with torch's",
            cause="linked with libstdc++.a (a compiler without the shared libstdc++); where that copy's version "
            "differs from the libstdc++ torch loaded, its iostream code runs on the other copy's locale state, "
            "and the first error that formats a number crashes the process (SIGSEGV) instead of raising",
            fix="rebuild with a compiler whose libstdc++.so is installed (CXX=/usr/bin/g++), or install a "
            "verified wheel (`flashkit resolve`)",
            details={"module": m.path, "defines": list(m.embedded_cxx_runtime)},
        )
    ]


def _gpu_code_findings(m: probe.ModuleFacts, target: Target) -> list[Finding]:
    """The module's GPU code against each GPU (or stated capability)."""
    if m.cuda is None:
        return []
    out = []
    for cap in target.capabilities:
        try:
            cc = capability(cap)
        except ValueError:
            continue
        out.extend(_gpu_arch_findings(m, m.cuda, cap, cc))
    return out


def _gpu_arch_findings(m: probe.ModuleFacts, cuda: fatbin.CudaCode, cap: str, cc: tuple[int, int]) -> list[Finding]:
    """No code for this GPU, only PTX for it, or (flash_kernels on cc 9.0) no sm_90a code."""
    out = []
    pick = cuda.runs_on(cc)
    sm = f"sm_{cc[0]}{cc[1]}"
    carried = f"cubins {list(cuda.cubins) or 'none'}, PTX {list(cuda.ptx) or 'none'}"
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
                details={"module": m.path, "capability": cap, "cubins": list(cuda.cubins), "ptx": list(cuda.ptx)},
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


def _may_provide(library: str, u: linking.UnresolvedSymbol) -> bool:
    """Whether a missing ``library`` could be where ``u`` is defined (unknown libraries: yes)."""
    if re.match(r"libcudart\.so", library):
        return u.name.startswith(("cuda", "__cuda"))
    if re.match(r"libcuda\.so", library):
        return u.name.startswith("cu")
    if TORCH_LIBS.match(library):
        return u.demangled.startswith(TORCH_NAMESPACES) or is_shim_symbol(u.name) or u.name.startswith(("THP", "_Z"))
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
    if TORCH_LIBS.match(name):
        return "torch's libraries are not found: torch is missing, or a different torch is installed"
    if name.startswith("libpython"):
        return "built against a shared libpython this system lacks (built for another Python)"
    return "a library it was linked against is not installed or not on the loader's search path"
