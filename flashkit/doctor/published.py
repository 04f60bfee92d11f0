"""What doctor and resolve read from a publication instead of a checkout: ``<site>/index.json``.

A wheel publication (``flashkit publish-wheels``) carries the matrix as this module writes it: every env's
spec (its YAML text, validated again when read), its verification at its current input hash, the CUDA
runtime its lock pins, the Pythons its requirements cover and, where published, their URLs. So
``flashkit doctor --site URL`` and ``flashkit resolve --site URL`` answer on a machine with no clone, from
the same facts the install page was made from, and name the same commands.

Reading is bounded (size, JSON depth) and typed: a publication that cannot be read is a
:class:`~flashkit.doctor.model.RepoProblem`, which doctor shows as a finding and resolve as its error.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any

from flashkit.core import safeio
from flashkit.core.errors import FlashkitError, SpecError, UsageError
from flashkit.doctor.model import RepoProblem, Verification
from flashkit.doctor.repo import RepoFacts

MANIFEST = "index.json"
MAX_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 32
TIMEOUT_S = 60


def matrix_json(facts: RepoFacts, spec_texts: dict[str, str]) -> dict[str, Any]:
    """The matrix part of a publication's ``index.json``: each env as doctor and resolve need it."""
    envs: dict[str, Any] = {}
    for spec in facts.specs or []:
        env = str(spec.id)
        v = facts.verification.get(env) or Verification("not verified (no ledger)", False)
        cov = facts.requirements.get(env)
        envs[env] = {
            "spec": spec_texts[env],
            "status": v.status,
            "verified": v.verified,
            "input_hash": v.input_hash,
            "why_not": list(v.why_not),
            "evidence": list(v.evidence),
            "images": list(v.published),
            "lock_cuda": facts.lock_cuda.get(env),
            "coverage": None
            if cov is None
            else {
                "covered": list(cov.covered),
                "not_covered": dict(cov.not_covered),
                "merged_path": cov.merged_path,
            },
        }
    return {"envs": envs, "broken": dict(facts.broken)}


def _problem(what: str) -> RepoFacts:
    return RepoFacts(
        None,
        {},
        {},
        {},
        RepoProblem(what, "give --site the base URL of a flashkit publication (the folder holding index.json)"),
    )


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level)
    return level


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON value")


def fetch(site: str) -> RepoFacts:
    """The publication at ``site`` (an http(s) URL or a local folder) as doctor's facts."""
    url = site if site.endswith("/") else site + "/"
    if url.startswith("file://"):  # read as the folder it names, with the same checks
        url = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
    try:
        if "://" in url:
            with urllib.request.urlopen(url + MANIFEST, timeout=TIMEOUT_S) as resp:
                body = resp.read(MAX_BYTES + 1)
        else:  # a regular file only: a FIFO or a device there would block or never end
            body = safeio.read_bytes(Path(url) / MANIFEST, what=MANIFEST, error=UsageError, max_bytes=MAX_BYTES + 1)
    except UsageError as exc:
        return _problem(f"--site {site}: {exc}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return _problem(f"--site {site}: {MANIFEST} cannot be read ({getattr(exc, 'reason', exc)})")
    if len(body) > MAX_BYTES:
        return _problem(f"--site {site}: {MANIFEST} is larger than {MAX_BYTES} bytes")
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        return _problem(f"--site {site}: {MANIFEST} is not JSON ({exc})")
    if _depth(data) > MAX_DEPTH:
        return _problem(f"--site {site}: {MANIFEST} nests deeper than a publication does")
    try:
        return from_json(data, f"{url}{MANIFEST}")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return _problem(f"--site {site}: {MANIFEST} is not a flashkit publication ({type(exc).__name__}: {exc})")


def from_json(data: dict[str, Any], shown: str) -> RepoFacts:
    """Doctor's facts from a publication's parsed ``index.json`` (``shown`` names it in messages)."""
    from flashkit.plan import production
    from flashkit.plan.specfile import parse_spec

    if data.get("schema_version") != 1:
        raise ValueError(f"schema_version {data.get('schema_version')!r}; this flashkit reads 1")
    matrix = data["matrix"]
    specs, verification, lockfiles, lock_cuda, requirements = [], {}, {}, {}, {}
    broken = {str(k): str(v) for k, v in matrix.get("broken", {}).items()}
    for env, row in sorted(matrix["envs"].items()):
        source = PurePosixPath("envs") / f"{env}.yaml"
        try:
            spec = parse_spec(
                str(row["spec"]), env_id=env, display=f"{shown} {source}", source=Path(source), repo_root=Path("/")
            )
        except (SpecError, FlashkitError) as exc:
            broken[env] = str(exc)
            continue
        specs.append(spec)
        published = {py: (str(p["requirements"]), str(p["tests"])) for py, p in (row.get("published") or {}).items()}
        verification[env] = Verification(
            str(row["status"]),
            bool(row["verified"]),
            tuple(str(r) for r in row["images"]),
            row["input_hash"],
            tuple(str(r) for r in row["why_not"]),
            tuple(str(r) for r in row["evidence"]),
        )
        lock_cuda[env] = row.get("lock_cuda")
        cov = row.get("coverage")
        if cov is not None:
            requirements[env] = production.Coverage(
                env,
                spec.torch,
                spec.python,
                tuple(cov["covered"]),
                tuple(sorted(cov["not_covered"].items(), key=lambda kv: production.vkey(kv[0]))),
                cov["merged_path"],
                published,
                row.get("index_url"),
            )
        lockfiles[env] = published.get(spec.python, (None,))[0]
    return RepoFacts(specs, verification, lockfiles, lock_cuda, None, requirements, broken)
