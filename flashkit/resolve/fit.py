"""`flashkit resolve`: the verified build that fits a torch, CUDA/ROCm, Python and C++ ABI a user names,
or why none does.

The match is doctor's (:func:`flashkit.doctor.recommend.score`), so the two never disagree about what fits;
what is verified comes from the ledger through the gate (:mod:`flashkit.doctor.repo`), at each env's
current input hash only. An env fits when it has the asked torch minor, nothing that rules its build out
(another CUDA major, the other C++ ABI, a Python its requirements do not cover), its latest build passes
the policy, and there is a way to install it on that Python: its production requirements for it, or a
published image of it.

When nothing fits, the nearest fit is named: among the (env, Python) pairs that resolve would answer with a
fit, the one asking the fewest changes of the query (torch minor, CUDA/ROCm major, Python, C++ ABI), ties
to the newest torch. A GPU's vendor is not a change a user can make, so only envs of the asked accelerator
count; when none of them fits anything, that is said instead ("nothing near").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from flashkit.doctor.model import MIN_DRIVER_FOR_CUDA, Candidate, Query, Verification, vkey
from flashkit.doctor.recommend import score

_NOT_COVERED = "no requirements for python"
ACCEL_NAME = {"cuda": "CUDA", "rocm": "ROCm"}
# For people who maintain the matrix, not for a user choosing an install: kept in --json only.
MAINTAINER_HINT = "a new env is a new envs/<id>.yaml, verified with `nox -s test-<env>` (docs/envs.md)"


@dataclasses.dataclass(frozen=True)
class EnvAnswer:
    """One env of the asked torch minor: does it fit, how to install it, or why not."""

    env: str
    torch: str
    accelerator: str
    python: str  # the image's
    fits: bool
    verified: bool
    status: str  # the ledger's line for its current input hash
    input_hash: str | None
    why_not: tuple[str, ...]  # empty when it fits
    notes: tuple[str, ...]  # differences that do not rule it out (a torch patch, a CUDA minor)
    requirements: str | None  # the per-Python requirements file
    install: tuple[str, ...]  # the exact pip and uv commands
    images: tuple[str, ...]  # published references at the current input hash
    evidence: tuple[str, ...] = ()  # the GPU run the verdict comes from, and how it reaches this build
    # Verified and covered, but nothing of it is published: no index serves its wheel, no registry its image
    # (the answer is then how to build it from a clone, exit 35, never a command that cannot run).
    unpublished: bool = False
    tests: str | None = None  # the URL of the kernel suite's test requirements, beside ``requirements``

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True)
class Nearest:
    """The verified build nearest to a query that nothing fits, and the query that resolve fits with it."""

    env: str
    query: Query  # the asked query with only the changed parts replaced
    changes: tuple[str, ...]  # "torch 2.6 -> 2.15", "CUDA 12.6 -> 13.0 (driver >= 580.65.06)", ...
    published: bool = True  # False: verified, but nothing of it is published yet (resolve would exit 35)

    def to_json(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "query": dataclasses.asdict(self.query),
            "changes": list(self.changes),
            "published": self.published,
        }


@dataclasses.dataclass(frozen=True)
class Resolution:
    query: Query
    fits: tuple[EnvAnswer, ...]  # best first
    others: tuple[EnvAnswer, ...]  # envs of the asked torch minor that do not fit
    reason: str | None  # one sentence when nothing fits
    matrix_torch: tuple[str, ...]  # the torch minors the matrix has
    nearest: Nearest | None = None  # when nothing fits: the fit with the fewest changes
    nothing_near: str | None = None  # when nothing fits and nothing is near: why

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "query": dataclasses.asdict(self.query),
            "fits": [a.to_json() for a in self.fits],
            "others": [a.to_json() for a in self.others],
            "reason": self.reason,
            "matrix_torch": list(self.matrix_torch),
            "nearest": self.nearest.to_json() if self.nearest else None,
            "nothing_near": self.nothing_near,
            "maintainer_hint": None if self.fits else MAINTAINER_HINT,
        }


def minor(version: str) -> str:
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else version


NOT_PUBLISHED = "nothing of it is published"


def _ways(spec, cov, v: Verification, py: str) -> tuple[str | None, tuple[str, ...], tuple[str, ...], str | None]:
    """The published requirements file (URL) and commands for Python ``py``, the published images, or why
    there is neither. A covered Python whose requirements are not published has no way to install the
    kernel yet: its reason starts with :data:`NOT_PUBLISHED`."""
    file, install = None, ()
    covered = cov is not None and cov.covered and cov.reason(py) is None
    if covered and py in cov.published:
        file, install = cov.published[py][0], cov.commands(py)
    images = v.published if spec.python == py else ()
    if install or images:
        return file, install, images, None
    if covered:
        return None, (), (), f"{NOT_PUBLISHED}: no index serves its wheel for Python {py} and no registry its image"
    parts = []
    if cov is None or not cov.covered:
        why = cov.reason(py) if cov is not None else "its requirements are unreadable"
        parts.append(f"no requirements for Python {py} ({why})")
    if spec.python != py:
        parts.append(f"its image runs Python {spec.python}")
    elif not v.published:
        parts.append(f"its image (Python {py}) is not published")
    return None, (), (), "; ".join(parts) or None


def answer(spec, cand: Candidate, v: Verification, cov, py: str) -> EnvAnswer:
    why = list(cand.blocking)
    if not v.verified and v.status.startswith("not verified"):
        why.append(f"{v.status} (its current input hash is {str(v.input_hash)[:20]})")
    elif not v.verified:  # built, but a tier the policy needs did not pass (or the ledger is unreadable)
        gate_why = "; ".join(v.why_not[:2]) or v.status
        why.append(f"not verified at its current input hash {str(v.input_hash)[:20]}: {gate_why}")
    file, install, images, no_way = _ways(spec, cov, v, py)
    unpublished = not why and bool(no_way) and no_way.startswith(NOT_PUBLISHED)
    if no_way and not any(w.startswith(_NOT_COVERED) for w in why):
        why.append(no_way)
    blocking = set(cand.blocking)
    tests = cov.published[py][1] if file is not None and cov is not None else None
    return EnvAnswer(
        env=str(spec.id),
        torch=spec.torch,
        accelerator=str(spec.accelerator),
        python=spec.python,
        fits=not why,
        verified=v.verified,
        status=v.status,
        input_hash=v.input_hash,
        why_not=tuple(why),
        notes=tuple(d for d in cand.differences if d not in blocking),
        requirements=file,
        install=install,
        images=images,
        evidence=v.evidence,
        unpublished=unpublished,
        tests=tests,
    )


def resolve(
    q: Query,
    specs: Sequence[Any],
    verification: Mapping[str, Verification],
    lock_cuda: Mapping[str, str | None],
    requirements: Mapping[str, Any],
) -> Resolution:
    """Every env of ``q``'s torch minor, scored by doctor's rules, split into those that fit and those that don't."""
    assert q.torch and q.python
    minors = tuple(sorted({minor(s.torch) for s in specs}, key=vkey))
    asked = minor(q.torch)
    same = [s for s in specs if minor(s.torch) == asked]
    if not same:
        reason = f"torch {asked} is not in the matrix (it has torch {', '.join(minors)})"
        return Resolution(q, (), (), reason, minors, *nearest(q, specs, verification, lock_cuda, requirements))
    scored = []
    for s in same:
        env = str(s.id)
        cand = score(s, q, lock_cuda.get(env), requirements.get(env))
        v = verification.get(env) or Verification(f"not verified (no ledger verified/{env}.jsonl)", False)
        scored.append((cand.score, answer(s, cand, v, requirements.get(env), q.python)))
    ranked = [a for _, a in sorted(scored, key=lambda sa: (-sa[0], sa[1].env))]
    fits = tuple(a for a in ranked if a.fits)
    others = tuple(a for a in ranked if not a.fits)
    if fits:
        return Resolution(q, fits, others, None, minors)
    if any(a.unpublished for a in others):  # a verified build fits, nothing of it is downloadable (exit 35)
        return Resolution(q, fits, others, "a verified build fits, but nothing of it is published yet", minors)
    names = ", ".join(a.env for a in others)
    reason = f"torch {asked} is in the matrix ({names}), but no verified build of it fits"
    return Resolution(q, fits, others, reason, minors, *nearest(q, specs, verification, lock_cuda, requirements))


def nearest(
    q: Query,
    specs: Sequence[Any],
    verification: Mapping[str, Verification],
    lock_cuda: Mapping[str, str | None],
    requirements: Mapping[str, Any],
) -> tuple[Nearest | None, str | None]:
    """The fit with the fewest changes from ``q`` (see the module docstring), or why there is none.

    A pair counts only when resolve, asked the changed query, answers it with that env (:func:`answer`'s
    rules, so the nearest fit named is one the command fits)."""
    pool = [s for s in specs if q.accelerator is None or s.accelerator.kind == q.accelerator]
    best: tuple[tuple, Nearest] | None = None
    for s in pool:
        env = str(s.id)
        v = verification.get(env)
        if v is None or not v.verified:
            continue
        cov = requirements.get(env)
        for py in sorted({s.python, *(getattr(cov, "covered", None) or ())}, key=vkey):
            alt = _instead(q, s, py, lock_cuda.get(env))
            there = answer(s, score(s, alt, lock_cuda.get(env), cov), v, cov, py)
            if not (there.fits or there.unpublished):
                continue
            changes = _changes(q, alt)
            py_gap = abs(vkey(py)[1] - vkey(q.python or py)[1])
            # A fit one command installs comes before a verified build nobody can download yet.
            key = (not there.fits, len(changes), [-x for x in vkey(s.torch)], py_gap, -vkey(py)[1], env)
            if best is None or key < best[0]:
                best = (key, Nearest(env, alt, changes, there.fits))
    if best is not None:
        return best[1], None
    kind = ACCEL_NAME.get(q.accelerator or "", "")
    if not pool:
        return None, f"the matrix has no {kind} env"
    names = sorted(str(s.id) for s in pool)
    which = f"({', '.join(names)})" if len(names) <= 3 else f"(all {len(names)})"
    envs = f"{kind} env" if kind else "env"
    return None, f"no {envs} of the matrix is verified and installable {which}"


def _instead(q: Query, spec, py: str, lock_cuda: str | None) -> Query:
    """``q`` with what ``spec`` cannot serve replaced by what it has: its torch for another minor, its ABI,
    Python ``py``, and for another CUDA major the CUDA its torch reports (the lockfile's runtime, else the
    spec's). A CUDA minor is kept: the fit is by major, so keeping it is the smaller change."""
    torch = q.torch if q.torch and minor(q.torch) == minor(spec.torch) else _public(spec.torch)
    accel = q.accel_version
    if q.accelerator and _major(accel) != _major(spec.accelerator.version):
        accel = (lock_cuda if spec.accelerator.kind == "cuda" else None) or spec.accelerator.version
    abi = q.cxx11_abi if q.cxx11_abi in (None, spec.cxx11_abi) else spec.cxx11_abi
    return dataclasses.replace(q, torch=torch, accel_version=accel, cxx11_abi=abi, python=py)


def _public(torch: str) -> str:
    """A torch version without its local label, as resolve's --torch takes it (NGC's 2.10.0a0+b4e4ee81d3)."""
    return torch.split("+", 1)[0]


def _major(version: str | None) -> str:
    return (version or "").split(".")[0]


def _changes(q: Query, alt: Query) -> tuple[str, ...]:
    out = []
    if q.torch and minor(q.torch) != minor(alt.torch or ""):
        out.append(f"torch {minor(q.torch)} -> {minor(alt.torch or '')}")
    if q.accelerator and _major(q.accel_version) != _major(alt.accel_version):
        driver = MIN_DRIVER_FOR_CUDA.get(int(_major(alt.accel_version))) if q.accelerator == "cuda" else None
        need = f" (driver >= {driver})" if driver else ""
        out.append(f"{ACCEL_NAME[q.accelerator]} {q.accel_version} -> {alt.accel_version}{need}")
    if q.python != alt.python:
        out.append(f"Python {q.python} -> {alt.python}")
    if q.cxx11_abi != alt.cxx11_abi:
        abi = {True: "cxx11", False: "pre-cxx11"}
        out.append(f"C++ ABI {abi[bool(q.cxx11_abi)]} -> {abi[bool(alt.cxx11_abi)]}")
    return tuple(out)
