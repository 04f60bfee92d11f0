"""`flashkit publish-wheels`: verified kernel wheels on a package index, with the files that install them."""

from __future__ import annotations

import os
import tempfile
from email.parser import HeaderParser
from pathlib import Path

from flashkit.cli.common import root, say
from flashkit.core import paths, safeio
from flashkit.core.digests import sha256_file
from flashkit.core.errors import FlashkitError, LockError, PublishRefused, UsageError
from flashkit.doctor import published
from flashkit.doctor import repo as repo_facts
from flashkit.evidence import wheelzip
from flashkit.images.build import WORK, load_result
from flashkit.ledger import gate, store
from flashkit.locking.uv import uv_binary
from flashkit.plan import production
from flashkit.plan.lock import check_python
from flashkit.plan.plan import plan_of
from flashkit.plan.specfile import load_each, load_env
from flashkit.publish import attest, index_server, kit, wheel_publication
from flashkit.publish.push import refuse_hint, refuse_message
from flashkit.publish.requirement_files import PROJECT

MAX_METADATA_BYTES = 1024 * 1024


def wheel_requires(wheel: Path) -> tuple[str, ...]:
    """The wheel's Requires-Dist, from its METADATA (the requirements pip checks when it installs it)."""
    with safeio.open_regular(wheel, what="wheel", error=PublishRefused) as fh:
        try:
            found = wheelzip.read_members(
                fh, str(wheel), lambda n: n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            )
        except wheelzip.WheelError as exc:
            raise PublishRefused(str(exc)) from None
    if len(found) != 1:
        raise PublishRefused(f"{wheel}: not a wheel (it has {len(found)} .dist-info/METADATA files)")
    text = next(iter(found.values()))
    if len(text) > MAX_METADATA_BYTES:
        raise PublishRefused(f"{wheel}: its METADATA is larger than {MAX_METADATA_BYTES} bytes")
    try:
        return tuple(HeaderParser().parsestr(text.decode("utf-8")).get_all("Requires-Dist") or ())
    except UnicodeDecodeError:
        raise PublishRefused(f"{wheel}: its METADATA is not UTF-8") from None


def exported_wheel(r: Path, env: str, input_hash: str) -> Path | None:
    """The wheel a build of ``env`` at ``input_hash`` exported: its build result's, else the one wheel in the
    folder builds export to (``.work/wheels/<env>/<input hash>/``, what CI's build jobs hand the pages job).
    Which bytes these are is the gate's question, not this one's."""
    res = load_result(r, env, input_hash)
    if res is not None and res.wheel_path and Path(res.wheel_path).is_file():
        return Path(res.wheel_path)
    found = sorted((r / WORK / "wheels" / env / input_hash).glob("*.whl"))
    return found[0] if len(found) == 1 and found[0].is_file() else None


def verified(r: Path, plan, policy: gate.Policy) -> wheel_publication.Verified:
    """The env's wheel of its current input hash, when a build in the ledger made exactly these bytes and the
    gate passes for that build under ``policy`` with the env's own ``gpu_evidence``; PublishRefused else."""
    ledger = store.load(r, plan.env_id)
    wheel = exported_wheel(r, plan.env_id, plan.input_hash)
    if wheel is None:
        decision = gate.latest_decision(ledger, plan.input_hash, policy, plan.spec.gpu_evidence)
        why = "" if decision else f" ({'; '.join(decision.reasons)[:300]})"
        raise PublishRefused(
            f"{plan.env_id}: no wheel of its current input hash {plan.input_hash} in this checkout{why}",
            hint=f"run `nox -s test-{plan.env_id}` (or `flashkit build {plan.env_id}`) first",
        )
    sha = sha256_file(wheel)
    holders = [a for a in ledger.artifacts(plan.input_hash) if a.wheel_sha256 == sha]
    decisions = [gate.gate(ledger, plan.input_hash, a.image_id, policy, plan.spec.gpu_evidence) for a in holders]
    passing = next((d for d in decisions if d), None)
    if passing is None:
        decision = (
            decisions[-1]
            if decisions
            else gate.GateDecision(False, (f"no build at {plan.input_hash} produced a wheel with sha256 {sha}",), ())
        )
        raise PublishRefused(
            refuse_message(plan.env_id, plan.input_hash, f"{store.DIR}/{plan.env_id}.jsonl", decision, policy),
            hint=refuse_hint(plan.env_id, decision),
        )
    prod = production.read(r, plan.spec)
    sets = {**prod.sets, plan.spec.python: plan.locks.runtime}
    stale = [p for py in sets if py != plan.spec.python for p in check_python(plan.spec, py, sets[py])]
    if stale:
        raise LockError(f"{plan.env_id}: " + "; ".join(stale), hint=f"run `flashkit lock {plan.env_id}`")
    return wheel_publication.Verified(
        plan.spec, plan.input_hash, wheel, sha, wheel_requires(wheel), policy, passing, sets
    )


def _chosen(r: Path, args) -> tuple[list, dict[str, str]]:
    """The specs asked for, and (with --all) the envs whose spec cannot be read, with why."""
    if args.all:
        if args.envs:
            raise UsageError("--all publishes every verified env; give no env ids with it")
        specs, broken = load_each(r)
        return specs, {env: f"spec invalid: {str(exc).splitlines()[0]}" for env, exc in broken.items()}
    if not args.envs:
        raise UsageError("name the env(s) to publish, e.g. `flashkit publish-wheels cu124-torch27 ...`, or pass --all")
    return [load_env(r, e) for e in args.envs], {}


def _signer(args):
    key = args.signing_key or os.environ.get(attest.SIGNING_KEY_ENV)
    if not key:
        raise UsageError(
            f"a publication signs an attestation of each wheel: pass --signing-key PATH or set {attest.SIGNING_KEY_ENV}",
            hint="make a key pair once with `flashkit key generate DIR` (outside the repository)",
        )
    return attest.load_signer(Path(key))


def run(args) -> int:
    r = root(args)
    if args.index_url and not args.index_server:
        raise UsageError("--index-url names the index of an --index-server; give the server's upload URL too")
    dest = wheel_publication.Destination.of(args.url, args.index_url or _default_index(args.index_server))
    policy = gate.parse_policy(args.policy)
    out = Path(os.path.abspath(args.out))
    wheel_publication.check_out(out)  # before any work: the folder is replaced whole
    signer = _signer(args)  # a missing or bad key is refused before anything is built or uploaded
    specs, skipped = _chosen(r, args)
    found = []
    for spec in specs:
        try:
            found.append(verified(r, plan_of(r, spec), policy))
        except FlashkitError as exc:
            if not args.all:
                raise
            skipped[str(spec.id)] = "; ".join(ln.strip() for ln in exc.message.splitlines())[:600]
    for env, why in sorted(skipped.items()):
        say(f"skipped {env}: {why}")
    facts = repo_facts.load(r, args.policy)
    texts = {
        str(s.id): safeio.read_text(
            paths.env_file(r, str(s.id)), what="env spec", error=UsageError, max_bytes=safeio.MIB, root=r
        )
        for s in facts.specs or []
    }
    with tempfile.TemporaryDirectory(prefix="flashkit-kit-") as tmp:
        the_kit = None if args.no_kit else kit.build(r, Path(tmp), uv_binary())
        planned = wheel_publication.plan(
            found, dest, signer=signer, kit=the_kit, matrix=published.matrix_json(facts, texts), skipped=skipped
        )
        if dest.kind == wheel_publication.SERVER:
            wheels = {vw.wheel.name: (vw.wheel, vw.sha256) for vw in found}
            index_server.upload(args.index_server, dest.index_url, PROJECT, wheels, say)
        wheel_publication.write(out, planned, place_wheels=dest.kind == wheel_publication.STATIC)
    for fact in planned.facts:
        store.append(r, fact.env, [fact])
    for fact in planned.facts:
        for py, path in sorted(fact.requirements.items(), key=lambda kv: production.vkey(kv[0])):
            print(f"{fact.env} Python {py}: pip install --require-hashes -r {fact.url(path)}")
    say(
        f"{len(planned.facts)} env(s) published in {out} (serve it at {dest.base_url}); wheels on "
        f"{dest.index_url}; recorded in {', '.join(sorted(paths.rel(r, store.ledger_path(r, f.env)) for f in planned.facts))}"
    )
    return 0


def _default_index(server: str | None) -> str | None:
    """A pypiserver's index is ``<server>/simple/``; another server's is given with --index-url."""
    if server is None:
        return None
    return (server if server.endswith("/") else server + "/") + "simple/"


def register(sub) -> None:
    p = sub.add_parser(
        "publish-wheels",
        help="put verified kernel wheels on a package index (static, or a server with a login) with the "
        "hash-pinned requirement files that install them",
        description="For each env whose wheel passes the gate (the same as `flashkit publish` for images): write "
        "a publication folder to serve at --url: per Python, requirement files that install torch and the "
        "verified wheel by hash, a signed attestation of each wheel, index.json (the verdicts each file "
        "carries, and the matrix for `flashkit doctor --site`), the kit; and either a static PEP 503 index "
        "(simple/, files/) or, with --index-server, the wheels uploaded there with twine (login from "
        "TWINE_USERNAME and TWINE_PASSWORD). DIR is replaced whole; one wheel-publication fact per env is "
        "appended to its ledger. Serve DIR with the install page: `flashkit site --with-publication DIR`.",
    )
    p.add_argument("envs", nargs="*", metavar="ENV", help="env ids (or --all)")
    p.add_argument("--all", action="store_true", help="every env whose wheel passes the gate; the others are listed")
    p.add_argument("--url", required=True, help="the base URL DIR will be served at, e.g. https://org.github.io/flash/")
    p.add_argument("--out", required=True, metavar="DIR", help="the publication folder (replaced whole)")
    p.add_argument(
        "--index-server", metavar="URL", help="upload the wheels to this index server (twine's --repository-url)"
    )
    p.add_argument("--index-url", metavar="URL", help="the server's PEP 503 index (default: <index-server>/simple/)")
    p.add_argument("--policy", default=gate.DEFAULT_POLICY, help="tiers that must have passed, as for publish")
    p.add_argument(
        "--signing-key", help="ed25519 private key that signs each wheel's attestation (default: $FLASHKIT_SIGNING_KEY)"
    )
    p.add_argument("--no-kit", action="store_true", help="leave the flashkit wheel (kit/) out of the publication")
    p.set_defaults(run=run)
