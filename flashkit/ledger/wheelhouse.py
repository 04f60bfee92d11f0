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

import argparse
import dataclasses
import html
import os
import shutil
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from flashkit.ledger import record
from flashkit.evidence.artifact_check import sha256  # one streaming file hash, stdlib-only
from flashkit.ledger.publish import Policy, PublishRefused, gate, parse_policy, refuse_hint, refuse_message

DEFAULT_OUT = Path(".work/wheelhouse")


@dataclasses.dataclass(frozen=True)
class VerifiedWheel:
    env: str
    input_hash: str
    path: Path
    sha256: str
    policy: Policy
    passed_tiers: tuple[str, ...]


def check_wheel(
    env_id: str, input_hash: str, image_id: str, wheel: Path, record_file: Path, policy: Policy
) -> VerifiedWheel:
    """The gate, then the wheel's bytes against the sha256 the record judged."""
    rec = record.load(record_file)
    decision = gate(rec, input_hash, image_id, policy)
    if not decision:
        raise PublishRefused(
            refuse_message(env_id, input_hash, record_file, decision, policy), hint=refuse_hint(env_id, decision)
        )
    judged = rec["entries"][input_hash]["artifact"].get("wheel_sha256")
    if not wheel.is_file():
        raise PublishRefused(f"{env_id}: the verified wheel {wheel} is missing", hint=f"run `flashkit build {env_id}`")
    actual = sha256(wheel)
    if actual != judged:
        raise PublishRefused(
            f"{env_id}: {wheel} has sha256 {actual}, but record {record_file} judged wheel {judged}",
            hint=f"the wheel changed after verification; rerun `flashkit test {env_id}`",
        )
    return VerifiedWheel(env_id, input_hash, wheel, actual, policy, decision.passed_tiers)


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


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "wheelhouse", help="export an env's verified wheel into an index with hash-pinned production requirements"
    )
    p.add_argument("envs", nargs="+", help="env ids")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--policy", default="full", help="required tiers, as for `flashkit publish` (default full)")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    from flashkit.core import paths
    from flashkit.images.build import load_result
    from flashkit.plan.inputhash import input_hash
    from flashkit.plan.spec import load_env

    root = paths.root_of(args)
    policy = parse_policy(args.policy)
    checked = []
    # Check every env before writing any: a refusal leaves the whole wheelhouse as it was.
    for env in args.envs:
        spec = load_env(root, env)
        env_id = str(spec.id)
        h = input_hash(root, spec)
        res = load_result(root, env_id, h)
        if res is None:
            raise PublishRefused(
                f"{env_id}: no build for its current input hash {h}",
                hint=f"run `flashkit test {env_id}` to build and verify the current inputs",
            )
        vw = check_wheel(env_id, h, res.runtime_id, Path(res.wheel_path), record.record_path(env_id, root), policy)
        lock = paths.lock_file(root, env_id)
        checked.append((vw, lock.read_text(encoding="utf-8"), paths.rel(root, lock)))
    out = args.out if args.out.is_absolute() else root / args.out
    for vw, lock_text, lock_name in checked:
        dest = write_env_wheelhouse(out, vw, lock_text, lock_name)
        print(f"{vw.env}: {dest}/requirements.txt ({vw.path.name} sha256 {vw.sha256})", file=sys.stderr)
    return 0
