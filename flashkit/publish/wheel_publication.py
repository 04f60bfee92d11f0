"""`flashkit publish-wheels`: the verified kernel wheels on a package index, and the files that install them.

A publication is one folder, served at ``base_url`` beside the install page, written whole or not at all:

- ``requirements/<env>/py<X.Y>.txt``: the production file of each env and Python it covers
  (:mod:`flashkit.publish.requirement_files`): ``pip install --require-hashes -r <URL>`` installs torch, its
  dependencies and the verified wheel, each by hash; ``py<X.Y>-test.txt`` beside it adds what the kernel
  suite's CPU tier needs;
- ``attestations/<env>.intoto.json``: a DSSE envelope, signed with the publisher's ed25519 key, of an in-toto
  statement about the wheel (name and sha256) whose predicate lists every verdict the gate relied on;
- ``index.json``: for each wheel file its sha256, and per env serving it the input hash, the verdicts it
  carries and the attestation; the matrix as doctor reads it (``flashkit doctor --site URL``); the kit;
- ``kit/``: the flashkit wheel this publication was made with and its hash-pinned requirements, so
  ``flashkit doctor`` runs without a clone;
- with a ``static`` index, the index itself: ``simple/`` (PEP 503, ``#sha256=`` fragments) over ``files/``.
  With an index ``server`` (:mod:`flashkit.publish.index_server`), the wheels are uploaded there instead and
  the requirement files name its URL; its login is the user's pip configuration's, never a file's.

Only wheels that pass the gate (the same as for images, with the env's ``gpu_evidence``) reach either index.
After the folder is in place, one ``wheel-publication`` fact per env is appended to the ledger: resolve,
doctor and the install page show a URL only where such a fact exists at the env's current input hash.
Every fact of one publication names the sha256 of its ``index.json``; a later publication to the same
``base_url`` replaces the folder, so only the latest one's facts describe what is served there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from flashkit.core import outputs
from flashkit.core.atomic import utc_now
from flashkit.core.errors import PublishRefused, UsageError
from flashkit.ledger.gate import GateDecision, Policy
from flashkit.ledger.model import WheelPublication
from flashkit.plan.spec import EnvSpec
from flashkit.publish import attest
from flashkit.publish.push import judgement_entry
from flashkit.publish.requirement_files import PROJECT, render
from flashkit.publish.wheelhouse import served, simple_index

MANIFEST = "index.json"
MARKER = ".flashkit-publication"  # the one kind of folder a publication replaces
STATIC, SERVER = "static", "server"
WHEEL_STATEMENT_TYPE = "https://flashkit.invalid/attestation/wheel-verification/v1"


@dataclasses.dataclass(frozen=True)
class Destination:
    """Where a publication is served (``base_url``) and which index serves its wheels."""

    base_url: str
    index_url: str
    kind: str  # STATIC | SERVER

    @classmethod
    def of(cls, base_url: str, server_index_url: str | None = None) -> Destination:
        """Served at ``base_url``; the wheels on its own static index, or on a server's (its PEP 503 URL)."""
        base = check_url(base_url, "--url")
        if server_index_url is None:
            return cls(base, base + "simple/", STATIC)
        return cls(base, check_url(server_index_url, "--index-url"), SERVER)


def check_url(url: str, flag: str) -> str:
    """An http(s) URL a publication may name: no credentials, no spaces, ending in one '/'."""
    from urllib.parse import urlsplit

    bad = [c for c in url if c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F]
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise UsageError(f"{flag} {url!r}: not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or bad:
        raise UsageError(f"{flag} {url!r}: give an http:// or https:// URL such as https://org.github.io/flash/")
    if "@" in url or parts.username or parts.password:
        raise UsageError(
            f"{flag}: the URL carries credentials; a publication names its URLs in files anyone can read",
            hint="give the URL without user:password@; the login comes from the user's pip or twine configuration",
        )
    if parts.query or parts.fragment:
        raise UsageError(f"{flag} {url!r}: a URL with a query or fragment cannot prefix file paths")
    return url if url.endswith("/") else url + "/"


@dataclasses.dataclass(frozen=True)
class Verified:
    """One env's wheel that passed the gate, with what its requirement files are cut from."""

    spec: EnvSpec
    input_hash: str
    wheel: Path
    sha256: str
    requires: tuple[str, ...]  # the wheel's Requires-Dist
    policy: Policy
    decision: GateDecision
    sets: dict[str, str]  # Python -> the env's runtime set for it (the image's own included)

    @property
    def env(self) -> str:
        return str(self.spec.id)


@dataclasses.dataclass(frozen=True)
class Kit:
    """The flashkit wheel of this publication and the hash-pinned requirements of its dependencies."""

    wheel: Path
    sha256: str
    lock: str  # lockfiles/kit.txt


@dataclasses.dataclass(frozen=True)
class Planned:
    """A publication, complete in memory: the folder's files, the wheels to place or upload, the facts."""

    files: dict[str, bytes]  # path under base_url -> bytes (wheels excluded)
    wheels: dict[str, Path]  # file name -> verified wheel on disk (placed under files/ by a static index)
    facts: tuple[WheelPublication, ...]
    manifest: dict[str, Any]


def _paths(env: str, python: str) -> tuple[str, str]:
    return f"requirements/{env}/py{python}.txt", f"requirements/{env}/py{python}-test.txt"


def verdict_entries(decision: GateDecision) -> list[dict[str, Any]]:
    """Every verdict the gate relied on (as an image's attestation states it), and the relation that carries it
    to this wheel when it judged another file."""
    out = []
    for j in decision.passed:
        entry = judgement_entry(j)
        if j.relation:
            entry["relation"] = {
                "kind": j.relation,
                "source_env": str(j.source_env),
                "judged": entry["subject"]["digest"],
            }
            if j.device_code:
                entry["relation"]["device_code"] = str(j.device_code)
        out.append(entry)
    return out


def _attestation(vw: Verified, entries: list[dict[str, Any]], signer) -> tuple[str, bytes, dict[str, Any]]:
    predicate = {
        "env": vw.env,
        "input_hash": vw.input_hash,
        "policy": {"name": vw.policy.name, "requires": vw.policy.describe()},
        "verdicts": entries,
    }
    stmt = attest.statement(vw.wheel.name, vw.sha256, WHEEL_STATEMENT_TYPE, predicate)
    envelope = attest.sign(signer, stmt)
    path = f"attestations/{vw.env}.intoto.json"
    meta = {
        "path": path,
        "sha256": hashlib.sha256(envelope).hexdigest(),
        "key_id": attest.key_id(signer.public_key),
        "predicate_types": [WHEEL_STATEMENT_TYPE],
    }
    return path, envelope, meta


def _env_files(vw: Verified, dest: Destination) -> tuple[dict[str, bytes], dict[str, str], dict[str, str], dict]:
    """The requirement files of one env, for every Python its sets cover and its wheel installs on."""
    pythons, left_out = served(vw.wheel.name, sorted(vw.sets, key=lambda p: tuple(map(int, p.split(".")))))
    if not pythons:
        raise PublishRefused(f"{vw.env}: the verified wheel {vw.wheel.name} installs on none of its covered Pythons")
    line = (
        f"verified: input hash {vw.input_hash}; policy {vw.policy.name} ({vw.policy.describe()}); "
        f"passed: {', '.join(vw.decision.passed_tiers)}"
    )
    files: dict[str, bytes] = {}
    reqs, tests = {}, {}
    for py in pythons:
        prod_path, test_path = _paths(vw.env, py)
        pair = render(
            env=vw.env,
            python=py,
            torch=vw.spec.torch,
            runtime_set=vw.sets[py],
            wheel=vw.wheel.name,
            wheel_sha256=vw.sha256,
            wheel_requires=vw.requires,
            index_url=dest.index_url,
            production_url=dest.base_url + prod_path,
            test_url=dest.base_url + test_path,
            verified=line,
        )
        files[prod_path], files[test_path] = pair.production.encode(), pair.test.encode()
        reqs[py], tests[py] = prod_path, test_path
    return files, reqs, tests, left_out


def _kit_files(kit: Kit | None, dest: Destination) -> tuple[dict[str, bytes], dict[str, Any] | None]:
    if kit is None:
        return {}, None
    wheel_path = f"kit/{kit.wheel.name}"
    body = "\n".join(ln for ln in kit.lock.splitlines() if not ln.startswith("# ")).strip("\n")
    text = (
        "# flashkit, the kit (`flashkit doctor`, `flashkit resolve`), with every dependency pinned by hash;\n"
        "# install it in a venv of its own (Python >= 3.11):\n"
        f"#   pip install --require-hashes -r {dest.base_url}kit/requirements.txt\n"
        f"{body}\n"
        f"flashkit @ {dest.base_url}{wheel_path} \\\n    --hash=sha256:{kit.sha256}\n"
    )
    files = {wheel_path: kit.wheel.read_bytes(), "kit/requirements.txt": text.encode()}
    meta = {"wheel": wheel_path, "sha256": kit.sha256, "requirements": "kit/requirements.txt"}
    return files, meta


def plan(
    verified: list[Verified],
    dest: Destination,
    *,
    signer,
    kit: Kit | None,
    matrix: dict[str, Any],
    skipped: dict[str, str],
) -> Planned:
    """Everything a publication writes and records, from checked inputs. ``matrix`` is doctor's view of every
    env (:func:`flashkit.doctor.published.matrix_json`); ``skipped`` the envs left out, with the reason."""
    if not verified:
        raise PublishRefused("nothing to publish: no env's wheel passed the gate", hint="see the skipped envs above")
    _one_file_per_name(verified)
    files: dict[str, bytes] = {}
    wheels: dict[str, Path] = {}
    by_file: dict[str, dict[str, Any]] = {}
    per_env: dict[str, tuple[Verified, dict[str, str], dict[str, str], dict[str, Any], dict[str, str]]] = {}
    for vw in verified:
        env_files, reqs, tests, left_out = _env_files(vw, dest)
        entries = verdict_entries(vw.decision)
        att_path, envelope, att = _attestation(vw, entries, signer)
        files |= env_files | {att_path: envelope}
        wheels[vw.wheel.name] = vw.wheel
        entry = by_file.setdefault(vw.wheel.name, {"sha256": vw.sha256, "envs": {}})
        entry["url"] = dest.base_url + f"files/{vw.wheel.name}" if dest.kind == STATIC else None
        entry["envs"][vw.env] = {"input_hash": vw.input_hash, "verdicts": entries, "attestation": att}
        per_env[vw.env] = (vw, reqs, tests, att, left_out)
    kit_files, kit_meta = _kit_files(kit, dest)
    files |= kit_files
    if dest.kind == STATIC:
        files |= {k: v.encode() for k, v in simple_index(sorted((n, by_file[n]["sha256"]) for n in wheels)).items()}
    manifest = {
        "schema_version": 1,
        "base_url": dest.base_url,
        "index": {"kind": dest.kind, "url": dest.index_url, "project": PROJECT},
        "files": by_file,
        "kit": kit_meta,
        "matrix": _with_urls(matrix, dest, per_env),
        "skipped": skipped,
    }
    text = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    files[MANIFEST] = text
    files[MARKER] = b"written by `flashkit publish-wheels`; the command replaces this folder whole\n"
    publication = hashlib.sha256(text).hexdigest()
    facts = tuple(_fact(vw, reqs, tests, att, files, dest, publication) for vw, reqs, tests, att, _ in per_env.values())
    return Planned(files, wheels, facts, manifest)


def _with_urls(matrix: dict[str, Any], dest: Destination, per_env: dict) -> dict[str, Any]:
    """Doctor's matrix with each published env's requirement URLs filled in."""
    out = json.loads(json.dumps(matrix))
    for env, (_vw, reqs, tests, _att, left_out) in per_env.items():
        row = out.setdefault("envs", {}).setdefault(env, {})
        row["published"] = {
            py: {"requirements": dest.base_url + reqs[py], "tests": dest.base_url + tests[py]} for py in reqs
        }
        row["index_url"] = dest.index_url
        if left_out:
            row["published_left_out"] = left_out
    return out


def _fact(vw: Verified, reqs, tests, att, files: dict[str, bytes], dest: Destination, publication: str):
    named = [*reqs.values(), *tests.values(), att["path"]]
    if dest.kind == STATIC:
        named.append(f"files/{vw.wheel.name}")
    digests = {p: (vw.sha256 if p.startswith("files/") else hashlib.sha256(files[p]).hexdigest()) for p in named}
    return WheelPublication(
        env=vw.env,
        input_hash=vw.input_hash,
        date=utc_now(),
        wheel=vw.wheel.name,
        wheel_sha256=vw.sha256,
        index=dest.kind,
        index_url=dest.index_url,
        base_url=dest.base_url,
        publication=publication,
        files=dict(sorted(digests.items())),
        requirements=reqs,
        tests=tests,
        policy=f"{vw.policy.name}:{vw.policy.describe()}",
        verified_tiers=vw.decision.passed_tiers,
        verdict_ids=tuple(j.verdict.id for j in vw.decision.passed if j.verdict is not None),
        attestation=att,
    )


def _one_file_per_name(verified: list[Verified]) -> None:
    seen: dict[str, Verified] = {}
    for vw in verified:
        other = seen.setdefault(vw.wheel.name, vw)
        if other.sha256 != vw.sha256:
            raise PublishRefused(
                f"{other.env} and {vw.env}: different verified wheels share the file name {vw.wheel.name}; "
                "one index cannot hold both",
                hint="each env's wheel carries its local version (+cu<X><Y>torch<A.B>... or +cu<X>stable<A.B>)",
            )


def _ours(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def check_out(out: Path) -> Path:
    """``out`` is replaced whole: the rule of every output folder (absent, empty, or a publication's; never
    under /proc, /sys, /dev or in a git directory), checked before any work."""
    return outputs.check_folder(out, flag="--out", ours=_ours, what=f"`flashkit publish-wheels` wrote ({MARKER})")


def write(out: Path, planned: Planned, *, place_wheels: bool) -> None:
    """The folder, staged beside ``out`` and swapped in whole; each wheel's bytes checked once more as they are
    placed (a file changed since the gate judged it is refused, and nothing is written)."""
    files = dict(planned.files)
    if place_wheels:
        for name, path in sorted(planned.wheels.items()):
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != planned.manifest["files"][name]["sha256"]:
                raise PublishRefused(f"{path} changed since the gate judged it; nothing was published")
            files[f"files/{name}"] = data
    outputs.write_folder(out, files, flag="--out", ours=_ours, what=f"`flashkit publish-wheels` wrote ({MARKER})")
