"""Probe a Python environment for ``flashkit doctor``, without importing torch here.

The thin edge of the doctor: everything that runs a process or reads a file
lives here, and returns plain frozen values (:class:`Facts`) that
:mod:`flashkit.doctor.diagnose` judges without touching the system.

- The target interpreter (``--python``, default this one) is asked in two
  child processes: one that reads metadata and module locations without
  importing anything heavy, and one that imports torch, reads its facts and
  tries to import the compiled modules. A torch whose import raises, hangs or
  crashes the child costs only that step: the failure becomes a fact. What
  the children run is :mod:`flashkit.doctor.target_probe`.
- ``nvcc --version`` and ``nvidia-smi`` are run when present.
- Compiled modules are read with :mod:`flashkit.binary.elf` in this process (the
  target interpreter need not have pyelftools).

Every step is isolated: an exception in one is recorded in ``Facts.errors``
with the step name and never stops the others.

Facts travel as JSON (:meth:`Facts.to_json` / :meth:`Facts.from_json`), and
this module needs only the standard library (pyelftools for the ELF part), so
it can run where the rest of flashkit cannot::

    # on a GPU host or inside an image
    python -m flashkit.doctor.probe -o facts.json            # or --no-elf without pyelftools there
    # where flashkit is installed
    flashkit doctor --facts facts.json [--root /mnt/image-rootfs]
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from flashkit.binary import elf, fatbin, linking
from flashkit.core import procs
from flashkit.doctor import target_probe

# Distributions whose versions the doctor reports (names as importlib.metadata spells them).
WATCHED_DISTRIBUTIONS = (
    "torch",
    "triton",
    "pytorch-triton-rocm",
    "flash_kernels",
    "flash-kernels",
    "flash_attn",
    "flash-attn",
    "numpy",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime",
    "nvidia-cuda-nvcc",
    "pyelftools",
    "abi3info",
)
# Import names whose compiled modules are inspected.
MODULE_PACKAGES = ("flash_kernels", "flash_attn")
TOP_LEVEL_MODULES = ("flash_attn_2_cuda",)

ENV_TIMEOUT_S = 60
TORCH_TIMEOUT_S = 240
# The limits a --timeout may take: subprocess refuses NaN, infinity and anything past about 292 years.
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.1, 86400
TOOL_TIMEOUT_S = 30
_MARK = "FLASHKIT-PROBE-JSON:"


@dataclasses.dataclass(frozen=True)
class StepError:
    step: str
    message: str


@dataclasses.dataclass(frozen=True)
class InterpreterFacts:
    executable: str
    realpath: str
    version: str  # "3.12.3"
    implementation: str  # "cpython"
    tag: str  # "cp312", "cp313t"
    machine: str
    glibc: str | None  # "2.39"; None on a non-glibc system
    ext_suffix: str | None
    libpython: str | None  # the shared libpython the interpreter loads, if built shared
    site_packages: tuple[str, ...]

    @property
    def python(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)


@dataclasses.dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    location: str | None
    wheel_tags: tuple[str, ...]  # from the WHEEL file: "cp39-abi3-linux_x86_64"
    installer: str | None


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    capability: str  # "9.0"


@dataclasses.dataclass(frozen=True)
class TorchFacts:
    """What ``import torch`` says. ``imported`` None: not tried (not installed or disabled)."""

    location: str | None  # package directory, found without importing
    imported: bool | None
    import_error: str | None
    version: str | None = None
    cuda: str | None = None  # torch.version.cuda
    hip: str | None = None
    cxx11_abi: bool | None = None
    cuda_available: bool | None = None
    devices: tuple[Device, ...] = ()
    arch_list: tuple[str, ...] = ()
    loaded_libraries: tuple[str, ...] = ()  # shared objects mapped after import torch

    @property
    def lib_dir(self) -> str | None:
        return os.path.join(self.location, "lib") if self.location else None


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str
    capability: str | None  # "9.0"
    driver: str | None
    memory_mib: int | None


@dataclasses.dataclass(frozen=True)
class Nvcc:
    path: str
    version: str | None  # "13.0"
    release_line: str | None


@dataclasses.dataclass(frozen=True)
class ModuleFacts:
    """One compiled module: what its file says, what loading it would need, what import said."""

    path: str
    package: str  # import package it belongs to ("flash_kernels") or its own name
    distribution: str | None
    tag: elf.ExtensionTag
    # a Python extension (defines PyInit_<name>) or a library bundled beside one; None: unknown
    extension: bool | None = None
    import_error: str | None = None  # from the torch child, after import torch; None: imported or not tried
    import_tried: bool = False
    elf_read: bool = False  # False: its ELF facts were not read (see errors, or probed with --no-elf)
    # the symbol named by the loader's "undefined symbol: X" message, and its demangled form
    loader_symbol: tuple[str, str] | None = None
    needed: tuple[str, ...] = ()
    resolution: linking.Resolution | None = None
    cuda: fatbin.CudaCode | None = None
    has_fatbin: bool = False
    limited_api: tuple[elf.LimitedApiIssue, ...] | None = None  # None: not checked
    glibc_required: str | None = None
    glibcxx_required: str | None = None
    cxx_abi: str | None = None
    embedded_cxx_runtime: tuple[str, ...] = ()  # C++ runtime functions the module defines itself
    errors: tuple[StepError, ...] = ()


@dataclasses.dataclass(frozen=True)
class ImportCheck:
    """``import NAME`` in the target after ``import torch``: error None means it imported."""

    name: str
    error: str | None


@dataclasses.dataclass(frozen=True)
class Tools:
    pyelftools: bool
    abi3info: bool
    cxxfilt: bool


@dataclasses.dataclass(frozen=True)
class Facts:
    interpreter: InterpreterFacts | None
    torch: TorchFacts | None  # None: torch is not installed
    nvcc: Nvcc | None
    gpus: tuple[Gpu, ...]
    distributions: tuple[Distribution, ...]
    modules: tuple[ModuleFacts, ...]
    tools: Tools
    errors: tuple[StepError, ...]
    imports: tuple[ImportCheck, ...] = ()  # the packages (flash_kernels, flash_attn)

    def to_json(self) -> dict[str, Any]:
        return json_ready(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: Any) -> Facts:
        """Facts back from :meth:`to_json` output (e.g. probed on another host); ValueError if not."""
        try:
            return _from_plain(cls, data)
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"not the facts of a flashkit probe: {exc}") from None


def json_ready(value: Any) -> Any:
    """``dataclasses.asdict`` output with tuples as lists and keys as strings, as JSON writes it."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value


def _from_plain(tp: Any, value: Any) -> Any:
    """Rebuild a value of type ``tp`` (dataclasses, tuples, unions, mappings) from JSON data."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        problems = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _from_plain(option, value)
            except (TypeError, ValueError, KeyError) as exc:
                problems.append(str(exc))
        raise ValueError("; ".join(problems) or f"{value!r} is not {tp}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"{tp.__name__}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        unknown = set(value) - set(fields)
        if unknown:
            raise ValueError(f"{tp.__name__}: unknown fields {sorted(unknown)}")
        return tp(**{name: _from_plain(hints[name], v) for name, v in value.items()})
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_plain(args[0], v) for v in value)
        if len(args) != len(value):
            raise ValueError(f"expected {len(args)} items, got {len(value)}")
        return tuple(_from_plain(a, v) for a, v in zip(args, value, strict=True))
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        return {k: _from_plain(args[1], v) for k, v in value.items()}
    if tp is Any:
        return value
    if tp in (str, int, float, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise TypeError(f"expected {tp.__name__}, got {value!r}")
        return value
    raise TypeError(f"cannot rebuild {tp!r}")


# ---------------------------------------------------------------------------
# Host side


def _run_target(python: str, entry: Callable[..., Any], args: tuple, timeout: float) -> dict[str, Any]:
    """Run ``entry(*args)`` in ``python`` and return its JSON result; raise RuntimeError with why not.

    ``entry`` is a function of :mod:`flashkit.doctor.target_probe`: the whole
    module travels, so the entry's helpers go with it, and it is called by name.
    """
    source = inspect.getsource(target_probe)
    code = (
        f"{source}\nimport json, sys\n"
        f"_r = {entry.__name__}(*json.loads(sys.argv[1]))\n"
        f"sys.stdout.write('\\n{_MARK}' + json.dumps(_r) + '\\n')\n"
    )
    # A neutral working directory: run from the checkout, '' on sys.path would
    # import the flash_kernels source tree instead of the installed package.
    with tempfile.TemporaryDirectory(prefix="flashkit-probe-") as cwd:
        proc = procs.run(
            [python, "-c", code, json.dumps(list(args))],
            timeout=timeout,
            error=RuntimeError,
            what=f"interpreter {python}",
            timeout_message=f"{python} did not answer within {timeout:.0f} s",
            capture_output=True,
            text=True,
            cwd=cwd,
        )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    how = f"exit code {proc.returncode}" if proc.returncode >= 0 else f"signal {-proc.returncode}"
    raise RuntimeError(f"{python} ended with {how} and no answer: " + " | ".join(tail))


def find_nvcc(environ: dict[str, str] | None = None) -> str | None:
    """nvcc the way torch's cpp_extension finds it: CUDA_HOME/CUDA_PATH, PATH, /usr/local/cuda."""
    env = os.environ if environ is None else environ
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = env.get(var)
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.access(default, os.X_OK) else None


_NVCC_RELEASE = re.compile(r"release (\d+\.\d+)")


def probe_nvcc(path: str | None = None) -> Nvcc | None:
    path = path or find_nvcc()
    if path is None:
        return None
    proc = procs.run([path, "--version"], timeout=TOOL_TIMEOUT_S, error=RuntimeError, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{path} --version exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    m = _NVCC_RELEASE.search(proc.stdout)
    line = next((x.strip() for x in proc.stdout.splitlines() if "release" in x), None)
    return Nvcc(path, m.group(1) if m else None, line)


def probe_gpus() -> tuple[Gpu, ...]:
    """GPUs seen by nvidia-smi; () when there is no nvidia-smi (no NVIDIA driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    fields = "name,compute_cap,driver_version,memory.total"
    proc = procs.run(
        [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        timeout=TOOL_TIMEOUT_S,
        error=RuntimeError,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        # older drivers do not know compute_cap: ask without it
        proc = procs.run(
            [exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
            timeout=TOOL_TIMEOUT_S,
            error=RuntimeError,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip()[-300:]
            raise RuntimeError(f"nvidia-smi exited {proc.returncode}: {msg}")
        rows = [[*r[:1], None, *r[1:]] for r in _csv_rows(proc.stdout)]
    else:
        rows = _csv_rows(proc.stdout)
    gpus = []
    for name, cc, driver, mem in rows:
        gpus.append(Gpu(name, cc or None, driver or None, int(float(mem)) if mem and _is_number(mem) else None))
    return tuple(gpus)


def _csv_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _tools() -> Tools:
    def importable(name: str) -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return Tools(pyelftools=importable("elftools"), abi3info=importable("abi3info"), cxxfilt=elf.demangler_available())


def inspect_module(
    path: str,
    package: str,
    distribution: str | None,
    search: linking.LibrarySearch,
    cache: linking.ObjectCache,
    abi3_minimum: tuple[int, int] | None,
    *,
    abi3: bool | None = None,
) -> ModuleFacts:
    """Read one compiled module; each part that fails becomes a StepError, the rest still runs.

    The limited-API check runs when the module claims abi3 (``abi3``; by
    default: a minimum is given or the file is ``*.abi3.so``), against
    ``abi3_minimum`` when known.
    """
    tag = elf.extension_tag(path)
    errors: list[StepError] = []
    facts: dict[str, Any] = {}
    try:
        obj = cache.get(path)
    except (elf.ElfReadError, elf.ElfToolsMissing) as exc:
        return ModuleFacts(path, package, distribution, tag, errors=(StepError("read ELF", str(exc)),))
    facts["elf_read"] = True
    facts["extension"] = f"PyInit_{os.path.basename(path).split('.')[0]}" in obj.defined
    facts["needed"] = obj.needed
    facts["has_fatbin"] = obj.has_fatbin
    facts["glibc_required"] = elf.max_version(obj, "GLIBC_")
    facts["glibcxx_required"] = elf.max_version(obj, "GLIBCXX_")
    facts["embedded_cxx_runtime"] = elf.embedded_cxx_runtime(obj)

    def step(name: str, fn: Callable[[], Any], key: str) -> None:
        try:
            facts[key] = fn()
        except Exception as exc:  # a failing check is a fact, never a crash
            errors.append(StepError(name, f"{type(exc).__name__}: {exc}"))

    step("resolve symbols", lambda: linking.resolve(path, search, cache), "resolution")
    if obj.has_fatbin:
        step("list CUDA code", lambda: fatbin.cuda_code(path, search.root), "cuda")
    if abi3 is None:
        abi3 = abi3_minimum is not None or tag.kind == "abi3"
    if abi3:
        step("limited API", lambda: elf.limited_api_violations(obj, abi3_minimum), "limited_api")
    step(
        "C++ ABI",
        lambda: elf.cxx_abi_of(
            elf.demangle([s.name for s in obj.undefined] + [n for n in obj.defined if n.startswith("_Z")]).values()
        ),
        "cxx_abi",
    )
    return ModuleFacts(path, package, distribution, tag, errors=tuple(errors), **facts)


def _abi3_minimum(wheel_tags: tuple[str, ...]) -> tuple[int, int] | None:
    """The oldest CPython an abi3 wheel claims (``cp39-abi3-...`` -> (3, 9)); None when it claims none."""
    claimed = None
    for t in wheel_tags:
        m = re.match(r"cp(\d)(\d+)-abi3-", t)
        if m:
            v = (int(m.group(1)), int(m.group(2)))
            claimed = v if claimed is None or v < claimed else claimed
    return claimed


def probe(
    python: str | None = None,
    *,
    import_torch: bool = True,
    torch_timeout: float = TORCH_TIMEOUT_S,
    inspect_elf: bool = True,
) -> Facts:
    """Probe the environment of ``python`` (default: this interpreter). Never raises for what it finds.

    ``torch_timeout`` bounds the child that imports torch (a hung import is a
    finding, not a hang). ``inspect_elf`` False leaves the compiled modules
    unread, for :func:`reinspect` on another machine with the filesystem mounted.
    """
    python = python or sys.executable
    errors: list[StepError] = []
    tools = _tools()
    env = _probe_environment(python, errors)
    interp = _interpreter_from(env)
    dists = _distributions_from(env)
    raw_modules = env.get("modules", [])
    cache = linking.ObjectCache()
    torch, import_errors = _probe_torch(python, env, dists, cache, errors, import_torch, torch_timeout)
    tried_imports = set(import_errors)
    nvcc, gpus = _probe_host_tools(errors)

    stubs = tuple(_module_stub(m, import_errors, tried_imports) for m in raw_modules)
    modules = inspect_modules(stubs, interp, torch, dists, "/", cache) if inspect_elf else stubs
    imports = tuple(
        ImportCheck(name, import_errors.get(name))
        for name in dict.fromkeys(m["package"] for m in raw_modules)
        if name in tried_imports
    )
    return Facts(interp, torch, nvcc, gpus, dists, modules, tools, tuple(errors), imports)


def _probe_environment(python: str, errors: list[StepError]) -> dict[str, Any]:
    """The target's :func:`~flashkit.doctor.target_probe.environment` answer; {} when it gave none."""
    env: dict[str, Any] = {}
    try:
        env = _run_target(
            python,
            target_probe.environment,
            (WATCHED_DISTRIBUTIONS, MODULE_PACKAGES, TOP_LEVEL_MODULES),
            ENV_TIMEOUT_S,
        )
    except Exception as exc:
        errors.append(StepError("interpreter", str(exc)))
    errors.extend(StepError(step, msg) for step, msg in env.get("errors", []))
    return env


def _interpreter_from(env: dict[str, Any]) -> InterpreterFacts | None:
    if "interpreter" not in env:
        return None
    d = env["interpreter"]
    return InterpreterFacts(**{**d, "site_packages": tuple(d["site_packages"])})


def _distributions_from(env: dict[str, Any]) -> tuple[Distribution, ...]:
    return tuple(
        Distribution(d["name"], d["version"], d["location"], tuple(d["wheel_tags"]), d["installer"])
        for d in env.get("distributions", [])
    )


def _probe_torch(
    python: str,
    env: dict[str, Any],
    dists: tuple[Distribution, ...],
    cache: linking.ObjectCache,
    errors: list[StepError],
    import_torch: bool,
    timeout: float,
) -> tuple[TorchFacts | None, dict[str, str | None]]:
    """TorchFacts (None: torch is not installed), and the import error of each package and extension tried.

    The import errors are keyed by package name and by extension path; only
    those tried are there (none when torch was not imported in a child).
    """
    torch_dist = next((d for d in dists if d.name.lower() == "torch"), None)
    if not env or (torch_dist is None and not env.get("torch_location")):
        return None, {}
    location = env.get("torch_location")
    if not import_torch:
        return TorchFacts(location, None, None), {}
    raw_modules = env.get("modules", [])
    packages = list(dict.fromkeys(m["package"] for m in raw_modules))
    extensions = [[m["module"], m["path"]] for m in raw_modules if _is_extension(m["path"], cache)]
    try:
        t = _run_target(python, target_probe.torch_facts, (packages, extensions), timeout)
    except Exception as exc:
        return TorchFacts(location, False, f"the import torch probe failed: {exc}"), {}
    if t.get("cuda_error"):
        errors.append(StepError("torch.cuda", t["cuda_error"]))
    torch = TorchFacts(
        location=location,
        imported=t["imported"],
        import_error=t["import_error"],
        version=t.get("version"),
        cuda=t.get("cuda"),
        hip=t.get("hip"),
        cxx11_abi=t.get("cxx11_abi"),
        cuda_available=t.get("cuda_available"),
        devices=tuple(Device(x["name"], x["capability"]) for x in t.get("devices", [])),
        arch_list=tuple(t.get("arch_list", [])),
        loaded_libraries=tuple(t.get("loaded_libraries", [])),
    )
    return torch, t.get("modules", {})


def _probe_host_tools(errors: list[StepError]) -> tuple[Nvcc | None, tuple[Gpu, ...]]:
    """nvcc and the GPUs of this host; a tool that fails is a StepError, not a crash."""
    nvcc = None
    try:
        nvcc = probe_nvcc()
    except Exception as exc:
        errors.append(StepError("nvcc", str(exc)))
    gpus: tuple[Gpu, ...] = ()
    try:
        gpus = probe_gpus()
    except Exception as exc:
        errors.append(StepError("nvidia-smi", str(exc)))
    return nvcc, gpus


def _is_extension(path: str, cache: linking.ObjectCache) -> bool:
    """Whether importing ``path`` makes sense: it defines PyInit_<name>, or (unreadable) its name says so."""
    try:
        obj = cache.get(path)
    except (elf.ElfReadError, elf.ElfToolsMissing):
        tag = elf.extension_tag(path)
        return tag.kind != "plain" or not os.path.basename(path).startswith("lib")
    return f"PyInit_{os.path.basename(path).split('.')[0]}" in obj.defined


def inspect_modules(
    stubs: tuple[ModuleFacts, ...],
    interp: InterpreterFacts | None,
    torch: TorchFacts | None,
    dists: tuple[Distribution, ...],
    root: str = "/",
    cache: linking.ObjectCache | None = None,
) -> tuple[ModuleFacts, ...]:
    """Read the ELF facts of each module (paths inside ``root``), keeping what the import said.

    The load scope is what the target process had: the interpreter, libpython
    and, when torch imported, every shared object it had mapped; torch's lib
    directory is searched like LD_LIBRARY_PATH.
    """
    if not stubs:
        return ()
    cache = cache or linking.ObjectCache(root)
    preloaded: list[str] = []
    if interp is not None:
        preloaded.append(interp.realpath)
        if interp.libpython:
            preloaded.append(interp.libpython)
    if torch is not None and torch.imported:
        preloaded.extend(p for p in torch.loaded_libraries if p not in preloaded)
    extra = (torch.lib_dir,) if torch is not None and torch.lib_dir else ()
    search = linking.LibrarySearch(root=root, extra_dirs=extra, preloaded=tuple(preloaded))
    by_name = {d.name: d for d in dists}
    out = []
    for stub in stubs:
        dist = by_name.get(stub.distribution) if stub.distribution else None
        try:
            read = inspect_module(
                stub.path,
                stub.package,
                stub.distribution,
                search,
                cache,
                _abi3_minimum(dist.wheel_tags if dist else ()),
            )
        except Exception as exc:  # a module that breaks the reader is a finding, not a crash
            read = dataclasses.replace(stub, errors=(StepError("inspect", f"{type(exc).__name__}: {exc}"),))
        out.append(
            dataclasses.replace(
                read,
                import_tried=stub.import_tried,
                import_error=stub.import_error,
                loader_symbol=stub.loader_symbol,
            )
        )
    return tuple(out)


def reinspect(facts: Facts, root: str) -> Facts:
    """Facts probed inside an image (``--no-elf``) completed by reading its filesystem mounted at ``root``."""
    return dataclasses.replace(
        facts,
        modules=inspect_modules(facts.modules, facts.interpreter, facts.torch, facts.distributions, root),
        tools=_tools(),
    )


def _module_stub(m: dict[str, Any], import_errors: dict[str, str | None], tried: set[str]) -> ModuleFacts:
    stub = ModuleFacts(m["path"], m["package"], m.get("distribution"), elf.extension_tag(m["path"]))
    if m["path"] not in tried:
        return stub
    error = import_errors.get(m["path"])
    named = re.search(r"undefined symbol: (\S+)", error or "")
    symbol = (named.group(1), elf.demangle([named.group(1)])[named.group(1)]) if named else None
    return dataclasses.replace(stub, import_tried=True, import_error=error, loader_symbol=symbol)


FACTS_SCHEMA_VERSION = 1


def main(argv: list[str] | None = None) -> int:
    """``python -m flashkit.doctor.probe``: print (or write) the facts as JSON, for ``flashkit doctor --facts``.

    Needs only the standard library (pyelftools for the compiled-module part), so
    it runs on a GPU host or inside an image where the rest of flashkit's
    dependencies are absent. Exit 0, or 2 when the interpreter could not be inspected or ``-o`` names a
    place no output of flashkit's may go (:mod:`flashkit.core.outputs`), refused before the probe runs.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m flashkit.doctor.probe", description=main.__doc__)
    parser.add_argument("--python", metavar="PATH", help="interpreter to inspect (default: this one)")
    parser.add_argument("--no-import", action="store_true", help="do not import torch or the modules")
    parser.add_argument(
        "--no-elf",
        action="store_true",
        help="do not read the compiled modules here (no pyelftools in an image): "
        "`flashkit doctor --facts FILE --root MOUNTED_ROOT` reads them later",
    )
    parser.add_argument(
        "--timeout", type=float, default=TORCH_TIMEOUT_S, metavar="S", help="limit for the import torch child"
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout")
    args = parser.parse_args(argv)
    if not MIN_TIMEOUT_S <= args.timeout <= MAX_TIMEOUT_S:  # NaN fails this too; subprocess cannot take inf
        parser.error(f"--timeout {args.timeout}: give the limit in seconds ({MIN_TIMEOUT_S:g}-{MAX_TIMEOUT_S})")
    if args.output:
        from flashkit.core import outputs
        from flashkit.core.errors import FlashkitError

        try:  # the same rule as every -o of flashkit's, checked before the probe runs
            target = outputs.check_file(args.output, flag="-o")
        except FlashkitError as exc:
            print(f"python -m flashkit.doctor.probe: error: {exc}", file=sys.stderr)
            return exc.exit_code
    facts = probe(args.python, import_torch=not args.no_import, torch_timeout=args.timeout, inspect_elf=not args.no_elf)
    text = json.dumps({"schema_version": FACTS_SCHEMA_VERSION, "facts": facts.to_json()}, indent=2, sort_keys=True)
    if args.output:
        from flashkit.core.atomic import write_text_atomic

        try:
            with outputs.writing(target, flag="-o"):
                write_text_atomic(target, text + "\n")
        except FlashkitError as exc:
            print(f"python -m flashkit.doctor.probe: error: {exc}", file=sys.stderr)
            return exc.exit_code
    else:
        sys.stdout.write(text + "\n")
    return 0 if facts.interpreter is not None else 2


if __name__ == "__main__":
    sys.exit(main())
