"""`flashkit wheelhouse <env>`: production requirements for the verified set, and an index holding its wheel.

For each env, only when the verification record passes the same gate as
``flashkit publish`` (default policy ``full``; ``--policy`` to ask for less),
this writes under ``<out>/<env>/``:

- ``files/<wheel>`` and ``files/SHA256SUMS``: the exported ``flash_kernels``
  wheel, after checking that its sha256 is the one the record judged
  (a find-links folder);
- ``simple/index.html`` and ``simple/flash-kernels/index.html``: a PEP 503
  simple index over ``files/`` with ``#sha256=`` fragments;
- ``requirements.txt``: the env's runtime lockfile (torch and every dependency,
  each pinned by hash; it is what the verified image installed) plus
  ``flash-kernels==<version> --hash=sha256:<verified sha256>`` and
  ``--find-links files``, so ``pip install --require-hashes -r requirements.txt``
  on a fresh venv installs exactly the verified set (torch and its
  dependencies from the package index, the kernel wheel from ``files/``).

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
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from flashkit.core.digests import sha256_file as sha256
from flashkit.core.errors import PublishRefused
from flashkit.ledger import store
from flashkit.ledger.gate import GateDecision, Policy, gate
from flashkit.ledger.publish import refuse_hint, refuse_message

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
    if not wheel.is_file():
        raise PublishRefused(
            f"{env_id}: the wheel {wheel} is missing", hint=f"run `flashkit build {env_id}` or pass --wheel"
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


def requirements_text(vw: VerifiedWheel, lock_text: str, lock_name: str) -> str:
    name, version, _build, _tags = parse_wheel_filename(vw.path.name)
    body = "\n".join(ln for ln in lock_text.splitlines() if not ln.startswith("# ")).strip("\n")
    return (
        f"# flashkit wheelhouse {vw.env}: the verified set, every artifact pinned by hash\n"
        f"# input hash {vw.input_hash}; policy {vw.policy.name} ({vw.policy.describe()}); "
        f"passed: {', '.join(vw.passed_tiers)}\n"
        f"# install: pip install --require-hashes -r requirements.txt  (from this folder or by path)\n"
        f"# torch and its dependencies: {lock_name}; {name}: files/ (find-links, relative to this file)\n"
        "--find-links files\n"
        f"{body}\n"
        f"{name}=={version} \\\n    --hash=sha256:{vw.sha256}\n"
    )


def simple_index(wheel_name: str, sha256: str) -> dict[str, str]:
    """PEP 503 pages (relative paths under the env folder -> HTML)."""
    project = canonicalize_name(parse_wheel_filename(wheel_name)[0])
    w = html.escape(wheel_name)
    return {
        "simple/index.html": (f'<!DOCTYPE html>\n<html><body>\n<a href="{project}/">{project}</a>\n</body></html>\n'),
        f"simple/{project}/index.html": (
            f'<!DOCTYPE html>\n<html><body>\n<a href="../../files/{w}#sha256={sha256}">{w}</a>\n</body></html>\n'
        ),
    }


def write_env_wheelhouse(out: Path, vw: VerifiedWheel, lock_text: str, lock_name: str) -> Path:
    """Fill a fresh ``<out>/<env>`` and swap it in whole."""
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{vw.env}.", dir=out))
    try:
        files = stage / "files"
        files.mkdir()
        shutil.copyfile(vw.path, files / vw.path.name)
        if sha256(files / vw.path.name) != vw.sha256:
            raise PublishRefused(f"{vw.path} changed while it was copied")
        (files / "SHA256SUMS").write_text(f"{vw.sha256}  {vw.path.name}\n")
        for rel, text in simple_index(vw.path.name, vw.sha256).items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).write_text(text)
        (stage / "requirements.txt").write_text(requirements_text(vw, lock_text, lock_name))
        for p in [stage, *stage.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        dest = out / vw.env
        old = None
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{vw.env}.old.", dir=out))
            os.replace(dest, old / "x")
        os.replace(stage, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return dest
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
