"""`flashkit wheelhouse <env>`: production requirements for the verified set, and an index holding its wheel.

For each env, only when the verification record passes the same gate as
``flashkit publish`` (default policy ``full``; ``--policy`` to ask for less),
this writes under ``<out>/<env>/``:

- ``files/<wheel>`` and ``files/SHA256SUMS``: the exported ``flash_kernels``
  wheel, after checking that its sha256 is the one the record judged
  (a find-links folder);
- ``simple/index.html`` and ``simple/flash-kernels/index.html``: a PEP 503
  simple index over ``files/`` with ``#sha256=`` fragments;
- ``requirements.txt``: the env's production requirements for every Python
  the lockfiles cover and the wheel serves (its abi3 tag names the oldest),
  pins marked by Python as in ``lockfiles/<env>.txt``, plus
  ``flash-kernels==<version> --hash=sha256:<verified sha256>`` and
  ``--find-links files``, so ``pip install --require-hashes -r requirements.txt``
  (or ``uv pip sync``) on a fresh venv of any of those Pythons installs exactly
  the verified set (torch and its dependencies from the package index, the
  kernel wheel from ``files/``);
- ``py<X.Y>.txt``: the same for one Python (``lockfiles/<env>/py<X.Y>.txt`` plus
  the kernel wheel), the layout of ``lockfiles/``.

One folder per env because every env's wheel has the same file name (the same
``flash_kernels`` version, abi3) but different bytes (built against a different
torch); one index cannot hold two files of one name. Everything is written to a
temporary folder first and moved into place whole, so a refusal or a crash
leaves the previous wheelhouse untouched. Outputs are deterministic (no dates).

Exit codes: 17 (refused by the gate, or the wheel on disk is not the verified
one), as for ``flashkit publish``.
"""

from __future__ import annotations

import dataclasses
import html
import os
import shutil
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from flashkit.core.atomic import replace_folder, stage_folder
from flashkit.core.digests import sha256_file as sha256
from flashkit.core.errors import PublishRefused
from flashkit.ledger import store
from flashkit.ledger.gate import GateDecision, Policy, gate
from flashkit.plan import production
from flashkit.publish.push import refuse_hint, refuse_message

DEFAULT_OUT = Path(".work/wheelhouse")


@dataclasses.dataclass(frozen=True)
class VerifiedWheel:
    env: str
    input_hash: str
    path: Path
    sha256: str
    policy: Policy
    passed_tiers: tuple[str, ...]


def check_wheel(root: Path, env_id: str, input_hash: str, wheel: Path, policy: Policy) -> VerifiedWheel:
    """The wheel's bytes, then the gate for a build in the ledger that produced exactly those bytes."""
    if not os.path.isfile(wheel):  # os.path: False, not OSError, for a name too long to look up
        what = "is not a regular file" if os.path.lexists(wheel) else "is missing"
        raise PublishRefused(
            f"{env_id}: the wheel {wheel} {what}", hint=f"run `flashkit build {env_id}` or pass --wheel"
        )
    actual = sha256(wheel)
    ledger = store.load(root, env_id)
    holders = [a for a in ledger.artifacts(input_hash) if a.wheel_sha256 == actual]
    decisions: list[GateDecision] = [gate(ledger, input_hash, a.image_id, policy) for a in holders]
    passing = next((d for d in decisions if d), None)
    if passing is None:
        if not holders:
            decision = GateDecision(
                False, (f"no build in the ledger at {input_hash} produced a wheel with sha256 {actual}",), ()
            )
        else:
            decision = decisions[-1]
        raise PublishRefused(
            refuse_message(env_id, input_hash, f"{store.DIR}/{env_id}.jsonl", decision, policy),
            hint=refuse_hint(env_id, decision),
        )
    return VerifiedWheel(env_id, input_hash, wheel, actual, policy, passing.passed_tiers)


def served(wheel_name: str, pythons: list[str]) -> tuple[list[str], dict[str, str]]:
    """The Pythons among ``pythons`` that the wheel's tags install on, and why the others are left out."""
    tags = parse_wheel_filename(wheel_name)[3]
    ok, left_out = [], {}
    for py in pythons:
        v = production.vkey(py)
        fits = any(
            t in set(cpython_tags(v, platforms=[t.platform])) | set(compatible_tags(v, platforms=[t.platform]))
            for t in tags
        )
        if fits:
            ok.append(py)
        else:
            left_out[py] = f"the verified wheel is {'.'.join(sorted({f'{t.interpreter}-{t.abi}' for t in tags}))}"
    return ok, left_out


def requirements_text(vw: VerifiedWheel, body: str, what: str, lock_name: str) -> str:
    """A requirements file: ``body`` (pins of torch and its dependencies, by hash) plus the verified wheel."""
    name, version, _build, _tags = parse_wheel_filename(vw.path.name)
    return (
        f"# flashkit wheelhouse {vw.env}: the verified set, every artifact pinned by hash; {what}\n"
        f"# input hash {vw.input_hash}; policy {vw.policy.name} ({vw.policy.describe()}); "
        f"passed: {', '.join(vw.passed_tiers)}\n"
        f"# install: pip install --require-hashes -r <this file>  or  uv pip sync --require-hashes <this file>\n"
        f"# torch and its dependencies: {lock_name}; {name}: files/ (find-links, relative to this file)\n"
        "--find-links files\n"
        f"{body.strip(chr(10))}\n"
        f"{name}=={version} \\\n    --hash=sha256:{vw.sha256}\n"
    )


def requirement_files(vw: VerifiedWheel, sets: dict[str, str], not_covered: dict[str, str]) -> dict[str, str]:
    """``requirements.txt`` (every Python the lockfiles cover and the wheel serves) and one ``py<X.Y>.txt``
    each, from the env's per-Python lockfiles (``sets``: Python -> lockfile text)."""
    pythons, left_out = served(vw.path.name, sorted(sets, key=production.vkey))
    if not pythons:
        raise PublishRefused(
            f"{vw.env}: the verified wheel {vw.path.name} installs on none of the Pythons the lockfiles cover "
            f"({', '.join(sorted(sets, key=production.vkey))})"
        )
    left_out = {**not_covered, **left_out}
    chosen = {py: sets[py] for py in pythons}
    absent = "".join(
        f"; not {py}: {why}" for py, why in sorted(left_out.items(), key=lambda kv: production.vkey(kv[0]))
    )
    files = {
        "requirements.txt": requirements_text(
            vw,
            production.merged_body(vw.env, chosen),
            f"Python {', '.join(pythons)}{absent}",
            f"lockfiles/{vw.env}.txt",
        )
    }
    for py in pythons:
        body = "\n".join(ln for ln in sets[py].splitlines() if not ln.startswith("# "))
        files[f"py{py}.txt"] = requirements_text(vw, body, f"Python {py}", f"lockfiles/{vw.env}/py{py}.txt")
    return files


def simple_index(wheels: list[tuple[str, str]], files: str = "../../files") -> dict[str, str]:
    """PEP 503 pages over ``wheels`` ((file name, sha256), one project): relative paths -> HTML."""
    project = canonicalize_name(parse_wheel_filename(wheels[0][0])[0])
    links = "".join(
        f'<a href="{files}/{html.escape(w)}#sha256={sha}">{html.escape(w)}</a>\n' for w, sha in sorted(wheels)
    )
    return {
        "simple/index.html": (f'<!DOCTYPE html>\n<html><body>\n<a href="{project}/">{project}</a>\n</body></html>\n'),
        f"simple/{project}/index.html": f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n",
    }


def write_tree(stage: Path, texts: dict[str, str]) -> None:
    """Text files under ``stage`` (relative path -> text), folders made as needed."""
    for rel, text in texts.items():
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_text(text)


def copy_wheel(vw: VerifiedWheel, files: Path) -> None:
    """The verified wheel into ``files/``, its bytes checked again after the copy."""
    files.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(vw.path, files / vw.path.name)
    if sha256(files / vw.path.name) != vw.sha256:
        raise PublishRefused(f"{vw.path} changed while it was copied")


def write_env_wheelhouse(out: Path, vw: VerifiedWheel, requirements: dict[str, str]) -> Path:
    """Fill a fresh ``<out>/<env>`` (``requirements``: file name -> text) and swap it in whole."""
    out.mkdir(parents=True, exist_ok=True)
    stage = stage_folder(out / vw.env)
    try:
        copy_wheel(vw, stage / "files")
        (stage / "files" / "SHA256SUMS").write_text(f"{vw.sha256}  {vw.path.name}\n")
        write_tree(stage, {**simple_index([(vw.path.name, vw.sha256)]), **requirements})
        replace_folder(stage, out / vw.env)
        return out / vw.env
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
