"""Hash-pinned lockfiles, resolved for one Python and platform each without running the image.

The image's two files, disjoint, resolved together so that their versions agree:
- ``lockfiles/<id>/py<X.Y>.txt``  (X.Y = the spec's Python) runtime set: what the published image
  installs (torch, numpy, pytest...)
- ``lockfiles/<id>/build.txt``    builder-only additions: the toolchain (ninja, setuptools, PyPI nvcc...)
The builder installs both with ``pip install --require-hashes --no-deps``; the runtime only the first.
Every other Python the env's torch supports gets its own ``py<X.Y>.txt`` (production requirements, not an
input of the image); :mod:`flashkit.plan.production` merges them into ``lockfiles/<id>.txt``.

Resolution: uv's ``pip compile --python-version --python-platform --generate-hashes`` with
``--exclude-newer`` set from the spec, so re-locking later gives the same pins. The header is fixed
text derived from the spec (no timestamps, no uv version), which also makes a lock whose inputs no
longer match its spec detectable offline ("stale").
For envs whose torch comes from the base image (NGC, ROCm) only what is added on top is locked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from flashkit.plan import compat
from flashkit.plan.spec import EnvSpec

PLATFORM = "x86_64-manylinux_2_28"
HEADER_MARK = "# flashkit lock"


@dataclass(frozen=True)
class LockInputs:
    runtime: tuple[str, ...]
    build: tuple[str, ...]


def inputs(spec: EnvSpec) -> LockInputs:
    """The requirement sets the lock is resolved from, derived from the spec alone."""
    if spec.torch_source == "base-image":
        # torch, numpy and the build toolchain are the image's own; we add the test runner only.
        return LockInputs(runtime=("pytest",), build=())
    runtime = (f"torch=={spec.torch}", compat.NUMPY_FOR_TRITON_INTERPRETER, "pytest")
    build = ["ninja", "packaging", "setuptools", "wheel"]
    if spec.compiler.source == "pypi":
        v = spec.compiler.version
        series = compat.series(v)
        nxt = f"{series.split('.')[0]}.{int(series.split('.')[1]) + 1}"
        build += [f"{name}=={v}" for name in compat.PYPI_NVCC_SAME_VERSION]
        # cccl headers must come from the same CUDA release as nvcc; cudart only needs the same major
        # (torch pins its own cudart, and libcudart.so.13 is ABI-stable within the major).
        build += [
            f"nvidia-cuda-cccl>={series},<{nxt}",
            f"nvidia-cuda-runtime>={spec.accelerator.major},<{spec.accelerator.major + 1}",
        ]
    return LockInputs(runtime=runtime, build=tuple(build))


def resolver_args(spec: EnvSpec, python: str | None = None) -> list[str]:
    """uv's arguments for one Python (default: the image's). Another Python is resolved wheels-only:
    a production host installs, it does not compile numpy."""
    other = python is not None and python != spec.python
    return [
        "pip",
        "compile",
        "--no-config",
        "--no-python-downloads",
        "--quiet",
        "--python-version",
        python or spec.python,
        "--python-platform",
        PLATFORM,
        "--generate-hashes",
        "--exclude-newer",
        spec.lock_exclude_newer,
        "--no-header",
        "--annotation-style",
        "line",
        *(["--only-binary", ":all:"] if other else []),
    ]


def header(spec: EnvSpec, kind: str, python: str | None = None) -> str:
    """The fixed first lines of a lockfile: ``kind`` "runtime" or "build" (the image's), or "runtime"
    with another ``python`` (a production set that is not installed in the image)."""
    li = inputs(spec)
    reqs = li.runtime if kind == "runtime" else li.runtime + li.build
    if python is not None and python != spec.python:
        return (
            f"{HEADER_MARK} {spec.id} (production set for Python {python}; the image runs {spec.python})\n"
            f"# regenerate: flashkit lock {spec.id}\n"
            f"# resolver: uv {' '.join(resolver_args(spec, python))}, preferring the versions of py{spec.python}.txt\n"
            f"# inputs: {' '.join(reqs)}\n"
        )
    what = (
        "runtime set: installed in the published image"
        if kind == "runtime"
        else "builder-only additions: installed in the builder stage together with the runtime set"
    )
    lines = [
        f"{HEADER_MARK} {spec.id} ({what})",
        f"# regenerate: flashkit lock {spec.id}",
        f"# resolver: uv {' '.join(resolver_args(spec))}",
        f"# inputs: {' '.join(reqs)}",
    ]
    if spec.torch_source == "base-image":
        lines.append(
            f"# torch and the toolchain come from the base image {spec.base.ref}; only additions are locked here"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class LockTexts:
    runtime: str
    build: str
    base: str | None = None  # lockfiles/<id>/base.txt of a debian-flavoured env (flashkit.plan.baselock)


# --------------------------------------------------------------------------------------------------
# Parsing and offline consistency


@dataclass(frozen=True)
class Pin:
    name: str  # canonical name
    version: str
    hashes: tuple[str, ...]


PIN_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(?P<version>[^\s\\;]+)")


def logical_lines(text: str) -> list[str]:
    """A requirements file's entries with backslash continuations joined; comments and blank lines dropped."""
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            if buf:
                logical.append(buf)
                buf = ""
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        logical.append(buf)
        buf = ""
    if buf:
        logical.append(buf)
    return logical


MAX_VERSION_CHARS = 64  # the longest a lockfile holds is a local version such as 2.7.1+cu126.post20261130


def version_problem(version: str) -> str | None:
    """Why ``version`` cannot be a pinned version (PEP 440, of a sane length), or None. Checked as a pin is read:
    every later comparison parses it, and a 5000-digit release number is more than Python converts."""
    if len(version) > MAX_VERSION_CHARS:
        return f"a version of {len(version)} characters (at most {MAX_VERSION_CHARS})"
    try:
        Version(version)
    except InvalidVersion:
        return f"{version!r} is not a version (PEP 440)"
    return None


def parse(text: str) -> tuple[list[Pin], list[str]]:
    """Pins in a requirements file written by uv, and problems with lines that are not pins."""
    pins: list[Pin] = []
    problems: list[str] = []
    logical = logical_lines(text)
    for entry in logical:
        parts = entry.split()
        if not parts:
            continue
        m = PIN_RE.match(parts[0])
        if not m:
            problems.append(f"not an exact pin: {parts[0]!r}")
            continue
        hashes = tuple(p.split("=", 1)[1] for p in parts[1:] if p.startswith("--hash="))
        others = [p for p in parts[1:] if not p.startswith("--hash=")]
        if others:
            problems.append(f"{m['name']}: unexpected options {' '.join(others)}")
        bad = version_problem(m["version"])
        if bad:
            problems.append(f"{m['name']}: {bad}")
            continue
        pins.append(Pin(canonicalize_name(m["name"]), m["version"], hashes))
    return pins, problems


def _hash_problems(label: str, pins: list[Pin]) -> list[str]:
    problems = []
    for pin in pins:
        if not pin.hashes:
            problems.append(f"{label}: {pin.name}=={pin.version} has no --hash")
        if any(not re.match(r"^sha256:[0-9a-f]{64}$", h) for h in pin.hashes):
            problems.append(f"{label}: {pin.name} has a hash that is not sha256")
    return problems


def check_python(spec: EnvSpec, python: str, text: str) -> list[str]:
    """Every reason the production set of a Python other than the image's does not match the spec
    (empty: consistent). Offline."""
    label = f"py{python} lock"
    problems: list[str] = []
    if not text.startswith(header(spec, "runtime", python)):
        problems.append(f"{label} is stale: its header does not match the spec's inputs; run `flashkit lock {spec.id}`")
    pins, parse_problems = parse(text)
    problems += [f"{label}: {p}" for p in parse_problems] + _hash_problems(label, pins)
    if not pins:
        problems.append(f"{label} holds no packages")
    names = {p.name: p for p in pins}
    for req_text in inputs(spec).runtime:
        req = Requirement(req_text)
        pin = names.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{label}: {req.name} (an input) is missing")
        elif not req.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{label}: {req.name}=={pin.version} does not satisfy the input {req_text}")
    torch = names.get("torch")
    if spec.torch_source == "pypi" and torch is not None and torch.version != spec.torch:
        problems.append(f"{label}: torch=={torch.version} but the spec says {spec.torch}")
    problems += [
        f"{label}: {n} is a compiler component and must not be in a production set"
        for n in compat.PYPI_NVCC_SAME_VERSION
        if canonicalize_name(n) in names
    ]
    return problems


def check(spec: EnvSpec, runtime_text: str, build_text: str) -> list[str]:
    """Every reason the committed lockfiles do not match the spec (empty: consistent). Offline."""
    problems: list[str] = []
    for kind, text in (("runtime", runtime_text), ("build", build_text)):
        want = header(spec, kind)
        if not text.startswith(want):
            problems.append(
                f"{kind} lock is stale: its header does not match the spec's inputs; run `flashkit lock {spec.id}`"
            )
    rt, p1 = parse(runtime_text)
    bd, p2 = parse(build_text)
    problems += [f"runtime lock: {p}" for p in p1] + [f"build lock: {p}" for p in p2]
    problems += _hash_problems("runtime lock", rt) + _hash_problems("build lock", bd)
    names_rt = {p.name: p for p in rt}
    names_bd = {p.name: p for p in bd}
    both = sorted(set(names_rt) & set(names_bd))
    if both:
        problems.append(f"packages in both the runtime and the build lock: {', '.join(both)}")
    if not rt:
        problems.append("runtime lock holds no packages")
    li = inputs(spec)
    allpins = {**names_bd, **names_rt}
    for req_text in li.runtime + li.build:
        try:
            req = Requirement(req_text)
        except InvalidRequirement:  # pragma: no cover - inputs() writes valid requirements
            continue
        pin = allpins.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{req.name} (an input) is missing from the lock")
        elif not req.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{req.name}=={pin.version} in the lock does not satisfy the input {req_text}")
        elif req_text in li.runtime and pin.name not in names_rt:
            problems.append(f"{req.name} is a runtime input but is only in the build lock")
    if spec.torch_source == "pypi":
        torch = names_rt.get("torch")
        if torch is not None and torch.version != spec.torch:
            problems.append(f"torch=={torch.version} in the lock but the spec says {spec.torch}")
    if spec.compiler.source == "pypi":
        versions = {
            n: allpins[canonicalize_name(n)].version
            for n in compat.PYPI_NVCC_SAME_VERSION
            if canonicalize_name(n) in allpins
        }
        if len(set(versions.values())) > 1:
            problems.append(
                "nvcc, nvvm and crt must share one version: " + ", ".join(f"{k}=={v}" for k, v in versions.items())
            )
        cccl = allpins.get("nvidia-cuda-cccl")
        if cccl is not None and compat.series(cccl.version) != compat.series(spec.compiler.version):
            problems.append(
                f"nvidia-cuda-cccl=={cccl.version} is not from the CUDA {compat.series(spec.compiler.version)} release of nvcc {spec.compiler.version}"
            )
        # The compiler proper stays out of the published image (cudart and cccl may be torch's own deps).
        for name in compat.PYPI_NVCC_SAME_VERSION:
            if canonicalize_name(name) in names_rt:
                problems.append(f"{name} is a compiler component and must not be in the runtime lock")
    return problems
