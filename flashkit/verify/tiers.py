"""Verification tiers run against one built artifact; each returns a TierOutcome with its reasons.

- ``build``: the CUDA code in the wheel's compiled objects is exactly the spec's arch list.
- ``abi``: every undefined dynamic symbol of each compiled object resolves against the
  libraries inside the runtime image, symbol versions stay within the env's glibc policy,
  and an abi3 object uses only the limited API of its minimum Python. A stable-ABI wheel
  (``+cu13stable2.10``) must also take nothing from torch's C++ API (c10::, at::, torch::,
  caffe2::), only its C shim, exported by the image's torch, which is at least the wheel's target.
- ``cpu``: the kernel suite's CPU tier inside the runtime container (JUnit XML counts).
- ``gpu``: the suite's GPU tier with ``--gpus all``, or not-run with the reason.

The ``abi`` tier reads the image through the running container's merged
overlay directory, so the checks (flashkit.binary.elf, pyelftools, c++filt, abi3info)
run on the host against the image's files without installing anything in it;
``root`` arguments make every path resolve inside the image.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from flashkit.binary import elf, fatbin, linking
from flashkit.binary.torch_abi import TORCH_NAMESPACES, is_shim_symbol, stable_abi_target, torch_cxx_symbols
from flashkit.core import safeio
from flashkit.core.errors import TierError
from flashkit.core.names import Tier, Verdict
from flashkit.evidence import device_code, wheelzip
from flashkit.evidence.junit import JunitError, junit_counts, junit_failures, suite_verdict
from flashkit.images.build import BuildResult
from flashkit.images.container import Container
from flashkit.images.engine import Engine
from flashkit.plan import compat

TIERS = (Tier.BUILD, Tier.ABI, Tier.CPU, Tier.GPU)
SELFTEST = ("-m", "flash_kernels.selftest")
# The newest glibc / libstdc++ symbol versions a wheel built on each Debian base may
# need: the versions that suite ships (bookworm: glibc 2.36, GCC 12; trixie: glibc 2.41,
# GCC 14). Stated as manylinux policies: the wheel runs on hosts at least that new.
# A published wheel runs beyond its image: builds on the Debian bases made here are held to the platform floor
# (compat.PLATFORM_FLOOR: Debian 12, Ubuntu 22.04), whichever suite built them.
_FLOOR = compat.PLATFORM_FLOOR
SUITE_POLICY = {
    suite: (f"manylinux_{_FLOOR.glibc.replace('.', '_')}", _FLOOR.glibcxx) for suite in ("bookworm", "trixie")
}
DEFAULT_POLICY = ("manylinux_2_28", "3.4.24")  # torch's own wheels (2.7+) for bases we did not make

# Asks the image's interpreter where things are without importing torch or the kernels
# (torch's version comes from its distribution metadata).
_PROBE = r"""
import importlib.metadata, importlib.util, json, os, sys, sysconfig
def loc(name):
    spec = importlib.util.find_spec(name)
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None
def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
print(json.dumps({"python": os.path.realpath(sys.executable), "version": list(sys.version_info[:2]),
    "libpython": sysconfig.get_config_var("LDLIBRARY"), "libdir": sysconfig.get_config_var("LIBDIR"),
    "flash_kernels": loc("flash_kernels"), "torch": loc("torch"), "torch_version": version("torch")}))
"""
# Where torch's C shim is defined: libtorch_cpu.so (almost all of it), libtorch_cuda.so (the CUDA stream
# and guard functions), libtorch.so (a stub that links the two).
TORCH_SHIM_LIBRARIES = ("libtorch_cpu.so", "libtorch_cuda.so", "libtorch.so")
SHOWN_SYMBOLS = 10  # offending symbols named per object; the rest are counted
NO_DEMANGLER = (
    "no C++ demangler on this host (c++filt, or libstdc++'s __cxa_demangle): the stable-ABI rule of {wheel} "
    "(no torch C++ symbols) cannot be checked; install binutils"
)


@dataclasses.dataclass(frozen=True)
class TierOutcome:
    """What one tier found about one built artifact. The ledger binds it to the digest the tier judges
    (the runtime image for image tiers, the wheel for wheel tiers) when it records it."""

    tier: Tier
    verdict: Verdict
    counts: dict[str, int]
    reasons: tuple[str, ...]
    duration_s: float
    host: dict[str, str]


def _result(
    tier: Tier,
    verdict: Verdict | str,
    counts: dict[str, int],
    reasons: list[str],
    start: float,
    host: dict[str, str] | None = None,
) -> TierOutcome:
    return TierOutcome(
        tier=Tier(tier),
        verdict=Verdict(verdict),
        counts=counts,
        reasons=tuple(reasons),
        duration_s=round(time.monotonic() - start, 1),
        host=host or host_facts(),
    )


def host_facts() -> dict[str, str]:
    return {"hostname": platform.node(), "kernel": platform.release(), "machine": platform.machine()}


# ---------------------------------------------------------------------------
# build


def expects_cuda_binary(spec) -> bool:
    return spec.accelerator.kind == "cuda" and "cuda" in spec.backends


def compiled_objects(wheel: Path, dest: Path) -> list[Path]:
    """The wheel's shared objects, unpacked under ``dest`` (read as every wheel is: :mod:`flashkit.evidence.wheelzip`)."""
    try:
        with safeio.open_regular(wheel, what="wheel", error=TierError) as fh:
            names = wheelzip.extract(fh, str(wheel), str(dest), device_code.is_shared_object)
    except wheelzip.WheelError as exc:
        raise TierError(f"the build tier cannot read the exported wheel: {exc}", hint="rebuild the env") from None
    return [dest / n for n in sorted(names)]


def tier_build(spec, res: BuildResult) -> TierOutcome:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flashkit-build-tier-") as tmp:
        objects = compiled_objects(Path(res.wheel_path), Path(tmp))
        names = [o.relative_to(tmp).as_posix() for o in objects]
        if not expects_cuda_binary(spec):
            with_code = [n for n, o in zip(names, objects, strict=True) if fatbin.cuda_code(str(o)) is not None]
            if with_code:
                return _result(
                    "build",
                    "failed",
                    {"checked": len(objects), "failed": len(with_code)},
                    [
                        f"backends {list(spec.backends)} expect no CUDA binary, but "
                        f"{', '.join(with_code)} carry CUDA code"
                    ],
                    start,
                )
            return _result(
                "build",
                "passed",
                {"checked": len(objects)},
                [
                    f"backends {list(spec.backends)}: no CUDA binary expected and none present "
                    f"({len(objects)} compiled objects)"
                ],
                start,
            )
        want_cubins, want_ptx = fatbin.target_code(spec.gpu_targets)
        if not objects:
            return _result(
                "build",
                "failed",
                {"checked": 0, "failed": 1},
                [
                    f"the spec expects CUDA code for {', '.join(spec.gpu_targets)} but "
                    f"{Path(res.wheel_path).name} has no compiled extension (a Triton-only wheel: "
                    "see the build log for why setup.py skipped CUDA)"
                ],
                start,
            )
        reasons, failed, passed = [], 0, 0
        for name, obj in zip(names, objects, strict=True):
            code = fatbin.cuda_code(str(obj))
            if code is None:
                failed += 1
                reasons.append(f"{name}: no .nv_fatbin section (no CUDA code)")
                continue
            missing_c = sorted(want_cubins - set(code.cubins))
            extra_c = sorted(set(code.cubins) - want_cubins)
            missing_p = sorted(want_ptx - set(code.ptx))
            # PTX for an arch the spec lists only adds forward compatibility (flash_kernels
            # embeds it for the newest arch by design, the generic compute_90 for a 9.0a target:
            # arch-specific PTX would JIT nowhere else); PTX for an unlisted arch is a mismatch.
            listed = {c.replace("sm_", "compute_") for c in want_cubins}
            listed |= {re.sub(r"[af]$", "", c) for c in listed}
            bonus_p = sorted((set(code.ptx) - want_ptx) & listed)
            extra_p = sorted(set(code.ptx) - want_ptx - listed)
            if missing_c or extra_c or missing_p or extra_p:
                failed += 1
                parts = [
                    f"missing cubins {missing_c}" if missing_c else "",
                    f"unexpected cubins {extra_c}" if extra_c else "",
                    f"missing PTX {missing_p}" if missing_p else "",
                    f"unexpected PTX {extra_p}" if extra_p else "",
                ]
                reasons.append(
                    f"{name}: {'; '.join(p for p in parts if p)} (spec gpu_targets {list(spec.gpu_targets)})"
                )
            else:
                passed += 1
                note = f"; PTX {bonus_p} for forward compatibility" if bonus_p else ""
                reasons.append(
                    f"{name}: cubins {list(code.cubins)} = spec {list(spec.gpu_targets)}{note} "
                    f"(listed via {code.source})"
                )
    verdict = "passed" if failed == 0 else "failed"
    return _result("build", verdict, {"checked": len(objects), "passed": passed, "failed": failed}, reasons, start)


# ---------------------------------------------------------------------------
# abi


def policy_for(spec) -> tuple[str, str]:
    return SUITE_POLICY.get(spec.base.suite or "", DEFAULT_POLICY)


def _abi3_minimum(wheel_name: str) -> tuple[int, int] | None:
    """(3, 9) for a ...-cp39-abi3-... wheel; None when the wheel is not abi3."""
    m = re.search(r"-cp3(\d+)-abi3-", wheel_name)
    return (3, int(m.group(1))) if m else None


@dataclasses.dataclass(frozen=True)
class _Stable:
    """What a stable-ABI wheel is checked against: its target and the image's torch."""

    target: tuple[int, int]
    torch_version: str | None  # the image's, from its distribution metadata; None: unknown
    libraries: tuple[elf.ElfObject, ...]  # the image's TORCH_SHIM_LIBRARIES that could be read
    no_libraries: str  # why there are none, when there are none

    @property
    def target_text(self) -> str:
        return f"{self.target[0]}.{self.target[1]}"

    @property
    def torch_older(self) -> bool:
        """Whether the image's torch is known to be older than the target."""
        m = re.match(r"(\d+)\.(\d+)", self.torch_version or "")
        return bool(m) and (int(m.group(1)), int(m.group(2))) < self.target


def _stable_context(root: str, probe: dict, target: tuple[int, int], cache: linking.ObjectCache) -> _Stable:
    torch_dir = probe.get("torch")
    libraries, unreadable = [], []
    for name in TORCH_SHIM_LIBRARIES if torch_dir else ():
        path = f"{torch_dir.rstrip('/')}/lib/{name}"
        try:
            if not os.path.exists(elf.host_path(root, path)):
                continue  # a CPU-only torch has no libtorch_cuda.so
            libraries.append(cache.get(path))
        except elf.ElfReadError as exc:
            unreadable.append(f"{path}: {exc.reason}")
    if not torch_dir:
        why = "torch is not installed in the image"
    else:
        why = f"none of {', '.join(TORCH_SHIM_LIBRARIES)} in {torch_dir}/lib" + (
            f" could be read ({'; '.join(unreadable)})" if unreadable else ""
        )
    return _Stable(target, probe.get("torch_version"), tuple(libraries), "" if libraries else why)


def _in_image(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _closure(root: str, path: str, cache: linking.ObjectCache) -> list[str]:
    """``path`` and every library the loader would load for it, inside ``root``."""
    res = linking.resolve(path, linking.LibrarySearch(root=root), cache)
    return [path, *[p for _, p in res.loaded]]


def _preloads(root: str, probe: dict, cache: linking.ObjectCache) -> list[str]:
    """What is in the process before the extension loads: the interpreter (and a shared
    libpython), then what `import torch` loaded: torch._C and its closure."""
    out = _closure(root, probe["python"], cache)
    if probe.get("torch"):
        found = sorted(Path(_in_image(root, probe["torch"])).glob("_C.*.so"))
        if found:
            out += _closure(root, "/" + os.path.relpath(found[0], root), cache)
    return list(dict.fromkeys(out))


def check_abi_in_root(root: str, probe: dict, wheel_name: str, spec) -> tuple[str, dict, list[str]]:
    """The abi checks against a filesystem root; returns (verdict, counts, reasons)."""
    pkg = probe.get("flash_kernels")
    if not pkg:
        return "failed", {"checked": 0, "failed": 1}, ["flash_kernels is not installed in the runtime image"]
    objects = sorted("/" + os.path.relpath(p, root) for p in Path(_in_image(root, pkg)).rglob("*.so"))
    if not objects:
        if expects_cuda_binary(spec):
            return (
                "failed",
                {"checked": 0, "failed": 1},
                [f"backends {list(spec.backends)} expect a compiled extension but {pkg} holds no .so"],
            )
        return (
            "passed",
            {"checked": 0},
            [f"backends {list(spec.backends)}: the installed package has no compiled object; nothing to resolve"],
        )
    target = stable_abi_target(wheel_name)
    if target and not elf.demangler_available():
        return "error", {}, [NO_DEMANGLER.format(wheel=wheel_name)]
    cache = linking.ObjectCache(root)
    preloaded = _preloads(root, probe, cache)
    stable = _stable_context(root, probe, target, cache) if target else None
    search = linking.LibrarySearch(root=root, preloaded=tuple(preloaded))
    policy, glibcxx_limit = policy_for(spec)
    glibc_limit = elf.glibc_of_policy(policy)
    abi3_min = _abi3_minimum(wheel_name)
    py = tuple(probe.get("version") or ())
    reasons: list[str] = []
    failed = passed = symbols = shim_symbols = torch_cxx_symbols = 0
    for so in objects:
        obj = cache.get(so)
        symbols += len(obj.undefined)
        tag = elf.extension_tag(so)
        problems: list[str] = []
        if tag.kind == "cpython" and tag.python != py:
            problems.append(f"built for CPython {tag.label} but the image runs {py[0]}.{py[1]}")
        res = linking.resolve(so, search, cache)
        shim, cxx, stable_problems, explained = _stable_abi_checks(obj, stable) if stable else ([], [], [], set())
        shim_symbols, torch_cxx_symbols = shim_symbols + len(shim), torch_cxx_symbols + len(cxx)
        problems += stable_problems
        problems += _resolution_problems(res, explained)
        problems += _symbol_version_problems(obj, policy, glibc_limit, glibcxx_limit)
        runtime = elf.embedded_cxx_runtime(obj)
        if runtime:
            problems.append(
                f"carries its own C++ runtime (defines {', '.join(runtime)}; needs "
                f"{'libstdc++.so.6' if 'libstdc++.so.6' in obj.needed else 'no libstdc++.so.6'}): it was linked "
                "with libstdc++.a, a second copy beside the one torch loads, whose error messages can crash the "
                "process where the two differ in version; rebuild with a compiler that links libstdc++.so"
            )
        if tag.kind == "abi3" or abi3_min:
            for issue in elf.limited_api_violations(obj, abi3_min or (3, 2)):
                problems.append(f"{issue.symbol}: {issue.reason} (wheel {wheel_name} claims abi3)")
        if not res.demangler:
            reasons.append("c++filt not found on this host: C++ names are shown mangled")
        if problems:
            failed += 1
            shown = problems[:25]
            more = f" ... and {len(problems) - 25} more" if len(problems) > 25 else ""
            reasons.append(f"{so}: " + "; ".join(shown) + more)
        else:
            passed += 1
            reasons.append(
                f"{so}: all {len(obj.undefined)} undefined symbols resolve in the image "
                f"(needs {', '.join(obj.needed)}; in scope after `import torch`: "
                f"{len(preloaded) + len(res.loaded)} objects); glibc <= {glibc_limit}, "
                f"GLIBCXX <= {glibcxx_limit} ({policy})"
                + (f"; limited API of CPython {abi3_min[0]}.{abi3_min[1]} only" if abi3_min else "")
                + (_stable_passed(len(shim), stable) if stable else "")
            )
    verdict = "passed" if failed == 0 else "failed"
    counts = {"checked": len(objects), "passed": passed, "failed": failed, "symbols": symbols}
    if stable:
        counts |= {"shim_symbols": shim_symbols, "torch_cxx_symbols": torch_cxx_symbols}
    return verdict, counts, reasons


def _stable_abi_checks(
    obj: elf.ElfObject, stable: _Stable
) -> tuple[list[elf.DynSymbol], list[str], list[str], set[str]]:
    """A stable-ABI object's undefined shim symbols, its torch C++ symbols (demangled), the problems they
    make, and the shim symbols those problems name."""
    shim = [s for s in obj.undefined if is_shim_symbol(s.name)]
    cxx = torch_cxx_symbols(obj)
    problems, explained = _stable_abi_problems(shim, cxx, stable)
    return shim, cxx, problems, explained


def _named(names: list[str], quote: str = "`") -> str:
    """The first SHOWN_SYMBOLS names, quoted, and how many more there are."""
    shown = ", ".join(f"{quote}{n}{quote}" for n in names[:SHOWN_SYMBOLS])
    return shown + (f" and {len(names) - SHOWN_SYMBOLS} more" if len(names) > SHOWN_SYMBOLS else "")


def _stable_abi_problems(shim: list[elf.DynSymbol], cxx: list[str], stable: _Stable) -> tuple[list[str], set[str]]:
    """What breaks a stable-ABI object's promise to load on torch >= its target, and the undefined shim
    symbols these problems already name (the resolution problems need not repeat them)."""
    t = stable.target_text
    problems: list[str] = []
    if stable.torch_older:
        problems.append(
            f"the image has torch {stable.torch_version}, older than {t}: the wheel targets the stable ABI "
            f"of torch >= {t}"
        )
    if cxx:
        problems.append(
            f"{len(cxx)} undefined symbol(s) of torch's C++ API ({', '.join(TORCH_NAMESPACES)}) in a stable-ABI "
            f"wheel: {_named(cxx)}; these bind it to its build's torch minor (a stable wheel may take only "
            "torch's C shim, aoti_torch_* and torch_*, from libtorch: reach torch through csrc/torch_api.h's "
            "stable mode only)"
        )
    missing = sorted(
        {s.name for s in shim if not s.weak and not any(lib.defines(s.name, s.version) for lib in stable.libraries)}
    )
    if missing:
        libs = ", ".join(os.path.basename(lib.path) for lib in stable.libraries) or stable.no_libraries
        verb = "is" if len(missing) == 1 else "are"
        if stable.torch_older or stable.torch_version is None:
            why = f"the wheel targets the stable ABI of torch >= {t}"
        else:  # a torch new enough lacks it: the wheel uses more than its label says
            why = (
                f"torch {stable.torch_version} is >= {t}, the wheel's stable target, so the wheel uses a newer "
                "stable ABI than its label says (check its TORCH_TARGET_VERSION)"
            )
        problems.append(f"{_named(missing, quote='')} {verb} not exported by this torch's libraries ({libs}): {why}")
    return problems, set(missing)


def _stable_passed(n_shim: int, stable: _Stable) -> str:
    """What the pass line adds for a stable-ABI object that takes ``n_shim`` C shim symbols from torch."""
    libs = ", ".join(os.path.basename(lib.path) for lib in stable.libraries)
    torch = f"torch {stable.torch_version}" if stable.torch_version else "torch (its version unknown: no metadata)"
    return (
        f"; stable ABI of torch >= {stable.target_text}: no torch C++ symbols, "
        f"{n_shim} C shim symbols exported by {torch}" + (f" ({libs})" if libs else "")
    )


def _resolution_problems(res: linking.Resolution, explained: set[str] = frozenset()) -> list[str]:
    """What does not resolve in the image: missing libraries, symbol versions, then undefined symbols
    (except those in ``explained``: another problem already names them, with their cause)."""
    problems: list[str] = []
    for miss in res.missing_libraries:
        searched = ", ".join(miss.searched[:6])
        problems.append(f"needs {miss.name}, not found in the image (searched {searched})")
    for mv in res.missing_versions:
        problems.append(
            f"needs {mv.version} from {mv.library}; {mv.provider} has only "
            f"{', '.join(mv.available[-3:]) or 'no such versions'}"
        )
    # C++ names first, those with a same-named definition in the image leading: they say
    # which library version differs; C symbols of a missing library only repeat that.
    unresolved = [u for u in res.unresolved if u.name not in explained]
    for u in sorted(unresolved, key=lambda u: (not u.near_misses, not u.name.startswith("_Z"))):
        ver = f"@{u.version}" if u.version else ""
        hint = ""
        if u.near_misses:
            nm = u.near_misses[0]
            hint = (
                f" (the image has `{nm.demangled}` in {os.path.basename(nm.provider)}"
                f"{': differs only in the C++11 string ABI' if nm.abi_only else ''})"
            )
        problems.append(f"undefined symbol `{u.demangled}`{ver} [{u.name}]{hint}")
    return problems


def _symbol_version_problems(obj: elf.ElfObject, policy: str, glibc_limit: str, glibcxx_limit: str) -> list[str]:
    """The GLIBC_ and GLIBCXX_ symbol versions ``obj`` needs beyond the env's glibc policy."""
    problems = [
        f"{sym.name}@{sym.version} is newer than policy {policy} (glibc {glibc_limit})"
        for sym in elf.versions_newer_than(obj, "GLIBC_", glibc_limit)
    ]
    for sym in elf.versions_newer_than(obj, "GLIBCXX_", glibcxx_limit):
        problems.append(
            f"{elf.demangle([sym.name])[sym.name]}@{sym.version} is newer than "
            f"GLIBCXX_{glibcxx_limit} (policy {policy})"
        )
    # The C++ runtime's ABI functions (GCC 14's __cxa_call_terminate is CXXABI_1.3.15): the same libstdc++.
    for sym in elf.versions_newer_than(obj, "CXXABI_", compat.PLATFORM_FLOOR.cxxabi):
        problems.append(
            f"{sym.name}@{sym.version} is newer than CXXABI_{compat.PLATFORM_FLOOR.cxxabi} (policy {policy})"
        )
    return problems


def probe_image(c: Container) -> dict:
    py = find_python(c)
    out = c.exec([py, "-c", _PROBE]).check().output
    return json.loads(out.strip().splitlines()[-1])


def find_python(c: Container) -> str:
    out = c.exec(["sh", "-c", "command -v python || command -v python3"]).output.strip()
    if not out:
        raise RuntimeError(f"no python in {c.image}")
    return out.splitlines()[-1]


def tier_abi(engine: Engine, spec, res: BuildResult) -> TierOutcome:
    start = time.monotonic()
    with Container(engine, res.runtime_ref, network=False) as c:
        merged = (c.inspect().get("GraphDriver") or {}).get("Data", {}).get("MergedDir")
        if not merged or not os.path.isdir(os.path.join(merged, "usr")):
            return _result(
                "abi",
                "error",
                {},
                [
                    f"cannot read the container's filesystem from this host (MergedDir {merged!r}); "
                    "the abi tier needs a local engine with the overlay2 driver"
                ],
                start,
            )
        probe = probe_image(c)
        verdict, counts, reasons = check_abi_in_root(merged, probe, Path(res.wheel_path).name, spec)
    return _result("abi", verdict, counts, reasons, start)


# ---------------------------------------------------------------------------
# cpu / gpu: the kernel suite inside the container


def run_suite(
    engine: Engine, res: BuildResult, tier: str, *, gpus: bool, on_output: Callable[[str], None] | None = None
) -> TierOutcome:
    start = time.monotonic()
    report = "/tmp/flashkit-junit.xml"
    with Container(engine, res.runtime_ref, network=False, gpus=gpus) as c:
        py = find_python(c)
        facts = c.exec(
            [
                py,
                "-c",
                "import torch, json; print(json.dumps({'torch': torch.__version__, "
                "'torch_cuda': str(torch.version.cuda), 'cuda_available': torch.cuda.is_available(), "
                "'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''}))",
            ]
        )
        host = host_facts()
        if facts.exit_code == 0:
            host.update({k: str(v) for k, v in json.loads(facts.output.strip().splitlines()[-1]).items()})
        if gpus:
            smi = c.exec(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
            if smi.exit_code == 0 and smi.output.strip():
                name, _, driver = smi.output.strip().splitlines()[0].partition(",")
                host.update({"gpu": name.strip(), "driver": driver.strip()})
        run = c.exec([py, *SELFTEST, "--tier", tier, "--junitxml", report], on_output=on_output)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                xml_text = c.copy_out(report, Path(tmp)).read_text()
            except Exception:
                xml_text = None
    if xml_text is None:
        why = f"the suite wrote no JUnit report (exit {run.exit_code})"
        return _result(tier, Verdict.ERROR, {}, [why, run.output[-1500:]], start, host)
    try:
        counts = junit_counts(xml_text)
        failures = junit_failures(xml_text)
    except JunitError as exc:
        return _result(tier, Verdict.ERROR, {}, [f"the suite's JUnit report is unusable: {exc}"], start, host)
    verdict, why = suite_verdict(counts, run.exit_code)
    if verdict == "passed":
        reasons = [f"{counts['passed']} passed, {counts['skipped']} skipped of {counts['tests']}"]
    else:
        reasons = failures or [why, run.output[-1500:]]
    return _result(tier, verdict, counts, reasons, start, host)


def host_gpu() -> str | None:
    """Why this host cannot run the GPU tier, or None when it can."""
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return "this host has no NVIDIA GPU (no /dev/nvidia0)"
    return None


def tier_gpu(engine: Engine, res: BuildResult, **kw) -> TierOutcome:
    why = host_gpu()
    if why is None:
        runtimes = engine.sdk().info().get("Runtimes", {})
        if "nvidia" not in runtimes:
            why = "the docker engine has no nvidia runtime (install nvidia-container-toolkit)"
    if why:
        return TierOutcome(Tier.GPU, Verdict.NOT_RUN, {}, (why,), 0.0, host_facts())
    return run_suite(engine, res, "gpu", gpus=True, **kw)


def run_tiers(
    engine: Engine,
    spec,
    res: BuildResult,
    tiers: tuple[Tier, ...] = TIERS,
    on_output: Callable[[str], None] | None = None,
) -> list[TierOutcome]:
    runners = {
        Tier.BUILD: lambda: tier_build(spec, res),
        Tier.ABI: lambda: tier_abi(engine, spec, res),
        Tier.CPU: lambda: run_suite(engine, res, "cpu", gpus=False, on_output=on_output),
        Tier.GPU: lambda: tier_gpu(engine, res, on_output=on_output),
    }
    unknown = [t for t in tiers if t not in runners]
    if unknown:
        raise ValueError(f"tiers {', '.join(unknown)} do not run in images; these do: {', '.join(runners)}")
    return [runners[t]() for t in tiers]
