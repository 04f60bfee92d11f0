"""Production requirements: one resolved set per Python the env's torch supports, and one file for them all.

Layout under ``lockfiles/``:

- ``<env>/py<X.Y>.txt``: the set uv resolved for Python X.Y alone. The image's Python's file is the
  image's runtime set, an input of the image (its bytes are in the input hash; nothing else here is).
  Every other Python is resolved wheels-only and prefers the image's versions, so its set differs from
  the image's only where that Python needs another version (networkx 3.7 needs Python >= 3.12, numpy
  2.3 needs >= 3.11...).
- ``<env>.txt``: every covered Python's set in one file, each pin marked with the Pythons it is for; a
  pin without a marker is the same on every covered Python.

None of these holds the kernel wheel (its sha256 is known only after the build these files are inputs of).
What users install is a publication's file (``flashkit publish-wheels``), cut from the per-Python set by
:func:`split` into torch's side, plus the verified wheel by hash, and the kernel suite's test pins apart.

A Python the env's torch has wheels for but whose set cannot be resolved wheels-only is "not covered",
with uv's reason, in the merged file's header; matrix, doctor and ``flashkit requirements`` read it from
there. Envs whose torch comes from the base image (NGC, ROCm) have no production requirements: the image
is the product. Pure, except :func:`read`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from flashkit.core import paths, safeio
from flashkit.core.errors import LockError, PythonNotCovered
from flashkit.plan import compat, lock
from flashkit.plan.spec import EnvSpec

MAX_LOCK_BYTES = 4 * safeio.MIB
MERGED_MARK = "# flashkit production requirements"
PLATFORM_TEXT = compat.PLATFORM_FLOOR.text()
_PYTHON_LINE = re.compile(r"^# python (?P<py>3\.\d+): (?P<what>.*)$", re.MULTILINE)
_NOT_COVERED = "not covered: "


def vkey(python: str) -> tuple[int, ...]:
    return tuple(int(x) for x in python.split("."))


def claimed(spec: EnvSpec) -> tuple[str, ...]:
    """The Pythons the env's torch has wheels for (PyPI torch), or only the image's (torch from the base)."""
    if spec.torch_source != "pypi":
        return (spec.python,)
    return tuple(sorted(compat.TORCH_PYTHONS.get(spec.torch_series, (spec.python,)), key=vkey))


@dataclass(frozen=True)
class Production:
    """An env's resolved sets: written by ``flashkit lock`` or read from the repository."""

    sets: dict[str, str]  # Python -> text of lockfiles/<env>/py<Python>.txt (the image's included)
    not_covered: dict[str, str] = field(default_factory=dict)  # Python -> why it has no set
    merged: str | None = None  # lockfiles/<env>.txt (None: not written, or a base-image env)


@dataclass(frozen=True)
class Coverage:
    """Which Pythons an env's production requirements serve, for matrix, doctor and the CLI."""

    env: str
    torch: str
    image_python: str
    covered: tuple[str, ...]
    not_covered: tuple[tuple[str, str], ...]
    merged_path: str | None  # repo-relative; None when there are no production requirements
    # Python -> (production file URL, test file URL) of the env's current wheel publication (empty: none)
    published: dict[str, tuple[str, str]] = field(default_factory=dict)
    index_url: str | None = None  # where that publication's wheel is served

    def file_for(self, python: str) -> str:
        return f"{paths.LOCKFILES_DIR}/{self.env}/py{python}.txt"

    def reason(self, python: str) -> str | None:
        """Why ``python`` is not covered (None: it is)."""
        if python in self.covered:
            return None
        for py, why in self.not_covered:
            if py == python:
                return why
        if self.merged_path is None:
            return self.not_covered[0][1] if self.not_covered else "no production requirements"
        return f"torch {self.torch} has no wheels for Python {python} (covered: {', '.join(self.covered)})"

    def commands(self, python: str) -> tuple[str, str]:
        """The exact pip and uv commands for a covered ``python``: the published file's URL, which installs the
        verified kernel wheel too, or (nothing published) the committed set, which installs torch alone."""
        return install_lines(self.published[python][0] if python in self.published else self.file_for(python))

    def summary(self) -> str:
        """``3.10-3.14``, ``3.11-3.14; not 3.15``, or ``image only`` (torch from the base image)."""
        if self.merged_path is None:
            return "image only"
        text = _span(self.covered) if self.covered else "none"
        if self.not_covered:
            text += "; not " + ", ".join(py for py, _ in self.not_covered)
        return text

    def to_json(self) -> dict:
        return {
            "covered": list(self.covered),
            "not_covered": {py: why for py, why in self.not_covered},
            "file": self.merged_path,
            "per_python": {py: self.file_for(py) for py in self.covered},
            "published": {py: {"requirements": p, "tests": t} for py, (p, t) in sorted(self.published.items())},
            "index_url": self.index_url,
        }


def install_lines(file: str) -> tuple[str, str]:
    """pip's and uv's command for a requirements file or URL; neither removes a package the file omits
    (``uv pip sync`` would: :func:`fresh_venv_line`)."""
    return f"pip install --require-hashes -r {file}", f"uv pip install --require-hashes -r {file}"


def fresh_venv_line(file: str) -> str:
    """uv's exact sync: right for a new venv, wrong for a working one (it uninstalls what the file omits)."""
    return f"uv pip sync --require-hashes {file}"


def _span(pythons: tuple[str, ...]) -> str:
    """Consecutive minors as a range ("3.9-3.13"); anything else listed."""
    minors = [vkey(p)[1] for p in pythons]
    if len(minors) > 2 and minors == list(range(minors[0], minors[0] + len(minors))):
        return f"{pythons[0]}-{pythons[-1]}"
    return ", ".join(pythons)


def install_commands(cov: Coverage, python: str) -> tuple[str, str]:
    """The exact pip and uv commands for ``python`` (from the repository root); PythonNotCovered if none."""
    why = cov.reason(python)
    if why is not None:
        raise PythonNotCovered(
            f"{cov.env}: the production requirements do not cover Python {python}: {why}",
            hint=(
                f"use one of Python {', '.join(cov.covered)} (`flashkit matrix` lists each env's Pythons)"
                if cov.covered
                else f"use the {cov.env} image"
            ),
        )
    return cov.commands(python)


def coverage(spec: EnvSpec, prod: Production) -> Coverage:
    env = str(spec.id)
    if spec.torch_source != "pypi":
        why = f"torch comes from the base image {spec.base.ref}, not from PyPI: use the image"
        return Coverage(env, spec.torch, spec.python, (), ((spec.python, why),), None)
    return Coverage(
        env,
        spec.torch,
        spec.python,
        tuple(sorted(prod.sets, key=vkey)),
        tuple(sorted(prod.not_covered.items(), key=lambda kv: vkey(kv[0]))),
        f"{paths.LOCKFILES_DIR}/{env}.txt",
    )


# --------------------------------------------------------------------------------------------------
# The merged file


def _marker(pythons: list[str], covered: list[str]) -> str:
    if pythons == covered:
        return ""
    return " ; " + " or ".join(f'python_version == "{py}"' for py in pythons)


def merged_header(spec: EnvSpec, covered: list[str], not_covered: dict[str, str]) -> str:
    env = str(spec.id)
    lines = [
        f"{MERGED_MARK} {env}: torch {spec.torch} for Python {', '.join(covered)} on {PLATFORM_TEXT}",
        "# the resolved sets a publication is cut from (torch side and the kernel suite's test pins); they hold no "
        "kernel wheel: install from a publication (`flashkit resolve` names its URL)",
        f"# regenerate: flashkit lock {env} (merged from {paths.LOCKFILES_DIR}/{env}/py*.txt; "
        "a pin without a marker is the same on every Python listed)",
    ]
    for py in sorted({*covered, *not_covered}, key=vkey):
        if py in not_covered:
            lines.append(f"# python {py}: {_NOT_COVERED}{not_covered[py]}")
        else:
            mine = " (the image's set)" if py == spec.python else ""
            lines.append(f"# python {py}: {paths.LOCKFILES_DIR}/{env}/py{py}.txt{mine}")
    return "\n".join(lines) + "\n"


def merge(spec: EnvSpec, sets: dict[str, str], not_covered: dict[str, str]) -> str:
    """``lockfiles/<env>.txt``: the header naming every Python, then :func:`merged_body`."""
    return merged_header(spec, sorted(sets, key=vkey), not_covered) + merged_body(str(spec.id), sets)


def merged_body(env: str, sets: dict[str, str]) -> str:
    """One requirements body for every Python in ``sets``: each distinct (name, version, hashes) once,
    marked with the Pythons whose set holds it. Deterministic: same sets, same bytes."""
    covered = sorted(sets, key=vkey)
    groups: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for py in covered:
        pins, problems = lock.parse(sets[py])
        if problems:
            raise LockError(f"{env}: py{py}.txt cannot be merged: {'; '.join(problems)}")
        for pin in pins:
            groups.setdefault((pin.name, pin.version, pin.hashes), []).append(py)
    body = []
    for (name, version, hashes), pys in sorted(groups.items(), key=lambda kv: (kv[0][0], vkey(kv[1][0]))):
        lines = [f"{name}=={version}{_marker(pys, covered)}", *(f"    --hash={h}" for h in hashes)]
        body.append(" \\\n".join(lines) + "\n")
    return "".join(body)


@dataclass(frozen=True)
class MarkedPin:
    name: str
    version: str
    hashes: tuple[str, ...]
    marker: Marker | None


def parse_merged(text: str) -> tuple[list[MarkedPin], dict[str, str], list[str]]:
    """The merged file's pins, its "not covered" Pythons with their reasons, and problems."""
    not_covered = {
        m["py"]: m["what"][len(_NOT_COVERED) :]
        for m in _PYTHON_LINE.finditer(text)
        if m["what"].startswith(_NOT_COVERED)
    }
    pins, problems = [], []
    for entry in lock.logical_lines(text):
        req_text, _, rest = entry.partition(" --hash=")
        try:
            req = Requirement(req_text)
        except InvalidRequirement as exc:
            problems.append(f"not a requirement: {req_text!r} ({exc})")
            continue
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            problems.append(f"{req.name}: not an exact pin ({str(req.specifier)[:80]})")
            continue
        bad = lock.version_problem(specs[0].version)
        if bad:
            problems.append(f"{req.name}: {bad}")
            continue
        hashes = tuple(("--hash=" + rest).split()) if rest else ()
        pins.append(MarkedPin(canonicalize_name(req.name), specs[0].version, tuple(h[7:] for h in hashes), req.marker))
    return pins, not_covered, problems


def pins_for(pins: list[MarkedPin], python: str) -> tuple[dict[str, lock.Pin], list[str]]:
    """What pip or uv installs from the merged file on ``python``: the pins whose marker matches."""
    env = {"python_version": python, "python_full_version": f"{python}.0"}
    chosen: dict[str, lock.Pin] = {}
    problems = []
    for p in pins:
        if p.marker is not None and not p.marker.evaluate(env):
            continue
        if p.name in chosen:
            problems.append(f"two pins of {p.name} apply to Python {python}")
        chosen[p.name] = lock.Pin(p.name, p.version, p.hashes)
    return chosen, problems


# --------------------------------------------------------------------------------------------------
# What a user installs, and what only the kernel suite's tests need

# The one input of a runtime set that a user's install needs; the others (pytest, the Triton interpreter's
# numpy bound: lock.inputs) are there for the tiers that run the kernel suite inside the image.
PRODUCTION_ROOT = "torch"
_VIA = re.compile(r"^\s+# via (?P<parents>.+)$")


@dataclass(frozen=True)
class Split:
    """A runtime set cut in two by uv's ``# via`` annotations: torch's dependency closure, and the rest."""

    production: tuple[lock.Pin, ...]
    test: tuple[lock.Pin, ...]


def parents(text: str) -> tuple[dict[str, set[str]], list[str]]:
    """Each pin's parents as uv's line annotations name them (``# via torch, -c constraints.txt``: a ``-r``
    or ``-c`` entry is an input file, not a package), and problems: a pin with no annotation cannot be
    placed."""
    found: dict[str, set[str]] = {}
    current: str | None = None
    for raw in text.splitlines():
        pin = lock.PIN_RE.match(raw)
        if pin:
            current = canonicalize_name(pin["name"])
            continue
        via = _VIA.match(raw)
        if via and current is not None:
            names = (p.strip() for p in via["parents"].split(","))
            found[current] = {canonicalize_name(n) for n in names if n and not n.startswith("-")}
            current = None
    pins, problems = lock.parse(text)
    problems += [f"{p.name}: no `# via` annotation, so it cannot be told apart" for p in pins if p.name not in found]
    return found, problems


def split(text: str, also: tuple[str, ...] = ()) -> Split:
    """The pins of a per-Python runtime set that install torch and ``also`` (the kernel wheel's own
    requirements), with everything they need, transitively; and those only the tests need (pytest and
    what it pulls in, numpy). LockError when the file cannot be split: a pin without an annotation, or a
    root it does not pin."""
    pins, problems = lock.parse(text)
    graph, more = parents(text)
    if problems or more:
        raise LockError("a runtime set cannot be split into production and test pins: " + "; ".join(problems + more))
    names = {p.name for p in pins}
    roots = {PRODUCTION_ROOT, *(canonicalize_name(n) for n in also)}
    missing = sorted(roots - names)
    if missing:
        raise LockError(f"the runtime set does not pin {', '.join(missing)}, which the production set needs")
    keep = set(roots)
    grew = True
    while grew:  # a fixpoint: a pin is production when any package that needs it is
        grew = False
        for name in names - keep:
            if graph.get(name, set()) & keep:
                keep.add(name)
                grew = True
    return Split(tuple(p for p in pins if p.name in keep), tuple(p for p in pins if p.name not in keep))


def pins_text(pins: tuple[lock.Pin, ...] | list[lock.Pin]) -> str:
    """Pins as a requirements body, one per entry with its hashes, sorted by name (deterministic)."""
    body = []
    for pin in sorted(pins, key=lambda p: p.name):
        body.append(" \\\n".join([f"{pin.name}=={pin.version}", *(f"    --hash={h}" for h in pin.hashes)]) + "\n")
    return "".join(body)


# --------------------------------------------------------------------------------------------------
# Offline consistency and reading


def check(spec: EnvSpec, prod: Production) -> list[str]:
    """Every reason the production files do not match the spec (empty: consistent). Offline. The
    image's own set is checked by :func:`flashkit.plan.lock.check` with its build lock."""
    env, problems = str(spec.id), []
    want = claimed(spec)
    if spec.python not in prod.sets:
        problems.append(f"no lockfile for the image's Python {spec.python}")
    for py in sorted(prod.sets, key=vkey):
        if py not in want:
            problems.append(f"py{py}.txt: torch {spec.torch_series} has no wheels for Python {py}")
        elif py != spec.python:
            problems += lock.check_python(spec, py, prod.sets[py])
    if spec.torch_source != "pypi":
        return problems
    for py in want:
        if py not in prod.sets and py not in prod.not_covered:
            problems.append(
                f"Python {py}: torch {spec.torch_series} supports it, but there is neither "
                f"{paths.LOCKFILES_DIR}/{env}/py{py}.txt nor a reason it is not covered; run `flashkit lock {env}`"
            )
    if prod.merged is None:
        problems.append(f"{paths.LOCKFILES_DIR}/{env}.txt is missing; run `flashkit lock {env}`")
    elif not problems and prod.merged != merge(spec, prod.sets, prod.not_covered):
        problems.append(
            f"{paths.LOCKFILES_DIR}/{env}.txt is not the merge of {paths.LOCKFILES_DIR}/{env}/py*.txt; "
            f"run `flashkit lock {env}`"
        )
    return problems


def read(root: Path, spec: EnvSpec) -> Production:
    """The committed files of ``spec`` (regular files inside the repository only). A missing merged
    file reads as None (:func:`check` says so); an unreadable one is a LockError."""
    env = str(spec.id)
    folder = paths.lock_dir(root, env)
    sets: dict[str, str] = {}
    if folder.is_dir():
        for p in sorted(folder.glob("py3.*.txt")):
            py = p.name[2:-4]
            if re.fullmatch(r"3\.\d+", py):
                sets[py] = safeio.read_text(p, what="lockfile", error=LockError, max_bytes=MAX_LOCK_BYTES, root=root)
    merged_path = paths.production_file(root, env)
    merged = None
    if merged_path.exists() or merged_path.is_symlink():
        merged = safeio.read_text(merged_path, what="lockfile", error=LockError, max_bytes=MAX_LOCK_BYTES, root=root)
    not_covered = parse_merged(merged)[1] if merged is not None else {}
    return Production(sets, not_covered, merged)
