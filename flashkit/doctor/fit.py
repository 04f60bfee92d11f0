"""`flashkit resolve`: the verified build that fits a torch, CUDA/ROCm, Python and C++ ABI a user names,
or why none does.

The match is doctor's (:func:`flashkit.doctor.recommend.score`), so the two never disagree about what fits;
what is verified comes from the ledger through the gate (:mod:`flashkit.doctor.repo`), at each env's
current input hash only. An env fits when it has the asked torch minor, nothing that rules its build out
(another CUDA major, the other C++ ABI, a Python its requirements do not cover), its latest build passes
the policy, and there is a way to install it on that Python: its production requirements for it, or a
published image of it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from flashkit.doctor.model import Candidate, Query, Verification, vkey
from flashkit.doctor.recommend import score

_NOT_COVERED = "no requirements for python"


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
class Resolution:
    query: Query
    fits: tuple[EnvAnswer, ...]  # best first
    others: tuple[EnvAnswer, ...]  # envs of the asked torch minor that do not fit
    reason: str | None  # one sentence when nothing fits
    matrix_torch: tuple[str, ...]  # the torch minors the matrix has

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "query": dataclasses.asdict(self.query),
            "fits": [a.to_json() for a in self.fits],
            "others": [a.to_json() for a in self.others],
            "reason": self.reason,
            "matrix_torch": list(self.matrix_torch),
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
        return Resolution(q, (), (), reason, minors)
    scored = []
    for s in same:
        env = str(s.id)
        cand = score(s, q, lock_cuda.get(env), requirements.get(env))
        v = verification.get(env) or Verification(f"not verified (no ledger verified/{env}.jsonl)", False)
        scored.append((cand.score, answer(s, cand, v, requirements.get(env), q.python)))
    ranked = [a for _, a in sorted(scored, key=lambda sa: (-sa[0], sa[1].env))]
    fits = tuple(a for a in ranked if a.fits)
    others = tuple(a for a in ranked if not a.fits)
    reason = None
    if not fits:
        names = ", ".join(a.env for a in others)
        reason = f"torch {asked} is in the matrix ({names}), but no verified build of it fits"
    return Resolution(q, fits, others, reason, minors)
