"""Publishing an image to a registry only when the ledger allows it, with a signed attestation beside it.

The gate (:func:`flashkit.ledger.gate.gate`) reads only the ledger, the env's current input hash and
the id of the local image: no cached build result is needed, so publishing works from any clone that
has ``verified/`` and the image. Nothing touches the registry until the gate has passed.

The published image is the judged image itself, unchanged: its config digest (the image id) is the
one the verdicts name and the one a second builder gets from the same inputs. What the gate decided
(tiers, counts, policy, where each tier ran) travels beside it as a signed attestation
(:mod:`flashkit.publish.attest`), not in labels. The registry client is skopeo
(:mod:`flashkit.publish.registry`), with the user's credentials.

Order of operations, so that a refused, failed or interrupted publish leaves no tag:

1. copy the judged image out of the engine into a local OCI layout (layers gzip-compressed; the config,
   hence the image id, unchanged) and read its manifest digest D;
2. push it to the repository *by digest* (no tag);
3. pull ``@D`` back into a second layout (skopeo checks every blob's digest) and compare: the manifest
   hashes to D and its config is the judged image id;
4. sign the provenance and verification statements, push the attestation under ``sha256-<hex>.att``,
   fetch it back and verify its signatures and subject;
5. only then point the immutable input-hash tag, the card tag (``torch2.11-cu13.0``) and the spec's
   tags at D;
6. append a ``publication`` fact to the ledger.

Steps 1-5 run under a host-wide lock per registry repository (``FLASHKIT_LOCK_DIR``, default
``~/.cache/flashkit/locks``), and the immutable tag is looked at again under that lock: two publishes
from this host can never both create it. An immutable tag that already exists is reused only when its
image is the judged image (same config digest); otherwise publishing refuses. Registries shared by
several hosts should also enforce tag immutability themselves (Harbor, ECR and GHCR can): no
client-side lock spans hosts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flashkit.core.atomic import utc_now
from flashkit.core.errors import PublishRefused, PullBackMismatch, PushFailed, UsageError
from flashkit.ledger import store
from flashkit.ledger.gate import GPU_TIERS, GateDecision, Policy, gate
from flashkit.ledger.model import RELATION_DEVICE_CODE, RELATION_SAME_WHEEL, Publication
from flashkit.ledger.record import append_with_applies
from flashkit.publish import attest
from flashkit.publish.registry import (
    Registry,
    Target,
    access,
    engine_to_layout,
    layout_blob,
    layout_manifest,
    manifest_parts,
)

_TAG_MAX = 128
LOCK_DIR_ENV = "FLASHKIT_LOCK_DIR"
LOCK_TIMEOUT_S = 1800


def refuse_message(env_id: str, input_hash: str, ledger_file: str, decision: GateDecision, policy: Policy) -> str:
    lines = [f"refusing to publish {env_id} (input hash {input_hash}) under policy {policy.name} ({policy.describe()})"]
    # A failed suite can list hundreds of test ids; the ledger keeps them all.
    lines += [f"  - {r if len(r) <= 700 else r[:700] + ' ... (the rest is in the ledger)'}" for r in decision.reasons]
    lines.append(f"ledger: {ledger_file}")
    return "\n".join(lines)


def refuse_hint(env_id: str, decision: GateDecision) -> str:
    text = " ".join(decision.reasons)
    hint = f"run `flashkit test {env_id}` (or `flashkit verify {env_id}`) for the current inputs"
    if any(t.value in text for t in GPU_TIERS):
        hint += (
            f"; for the GPU tier run `flashkit verify {env_id} --tiers gpu` on a GPU host or import an "
            f"artifact-gpu result (`flashkit verify import-artifact-result {env_id} RESULT.json`), "
            "or ask explicitly for a weaker policy (--policy no-gpu), which the signed attestation will state"
        )
    return hint


def check_gate(
    root: Path, env_id: str, input_hash: str, image_id: str, policy: Policy, accepts: tuple[str, ...] | None = None
) -> GateDecision:
    decision = gate(store.load(root, env_id), input_hash, image_id, policy, accepts)
    if not decision:
        shown = store.DIR + f"/{env_id}.jsonl"
        raise PublishRefused(
            refuse_message(env_id, input_hash, shown, decision, policy), hint=refuse_hint(env_id, decision)
        )
    return decision


def require_a_build(req: PublishRequest) -> None:
    """Refuse before any engine or registry is touched when the ledger has no build at this input hash."""
    ledger = store.load(req.root, req.env_id)
    if not ledger.artifacts(req.input_hash):
        known = ", ".join(h[:20] for h in ledger.input_hashes()) or "none"
        raise PublishRefused(
            f"refusing to publish {req.env_id}: no build in its ledger at its current input hash {req.input_hash} "
            f"(the inputs changed since the last test; the ledger has input hashes: {known})",
            hint=f"run `flashkit test {req.env_id}` to build and verify the current inputs",
        )


@contextlib.contextmanager
def registry_lock(target: Target):
    """One publish at a time per registry repository on this host."""
    from filelock import FileLock, Timeout

    base = Path(os.environ.get(LOCK_DIR_ENV) or Path.home() / ".cache" / "flashkit" / "locks")
    base.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(str(target).encode()).hexdigest()[:24]
    try:
        with FileLock(str(base / f"publish-{name}.lock"), timeout=LOCK_TIMEOUT_S):
            yield
    except Timeout:
        raise PushFailed(f"another publish to {target} held the lock for {LOCK_TIMEOUT_S}s") from None


@dataclasses.dataclass(frozen=True)
class PublishRequest:
    root: Path
    env_id: str
    input_hash: str
    immutable_tag: str
    image_ref: str
    policy: Policy
    target: Target
    tags: tuple[str, ...]
    signing_key: Path | None = None  # required unless dry_run
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)  # the plan's input-hash manifest
    gpu_evidence: tuple[str, ...] | None = None  # the spec's gpu_evidence: which GPU evidence the gate accepts


def _check_tags(tags: list[str]) -> None:
    for t in tags:
        if not (0 < len(t) <= _TAG_MAX) or not all(c.isalnum() or c in "_.-" for c in t) or t[0] in ".-":
            raise UsageError(f"{t!r} is not a valid image tag")


def _stage_and_check(reg: Registry, image_id: str, tmp: Path, say) -> tuple[str, int]:
    """Steps 1-3 of the module docstring: the repository holds the image by digest, untagged, checked."""
    out, back = tmp / "out", tmp / "back"
    say(f"reading image {image_id} out of the engine")
    engine_to_layout(image_id, out)
    body, digest = layout_manifest(out)
    config, _layers = manifest_parts(f"the manifest of {image_id}", body)
    if config != image_id:
        raise PushFailed(f"copying {image_id} out of the engine changed its config (now {config})")
    say(f"pushing {reg.target}@{digest} (no tag)")
    reg.push(out, "image", digest)
    shutil.rmtree(out)
    say(f"pulling {reg.target}@{digest} back to compare")
    reg.fetch(digest, back)
    got, got_digest = layout_manifest(back)
    config_back, _l = manifest_parts(f"{reg.target}@{digest}", got)
    if got_digest != digest or got != body:
        raise PullBackMismatch(f"{reg.target}@{digest} serves another manifest ({got_digest})")
    layout_blob(back, config_back)  # present and hashing to its name
    if config_back != image_id:
        raise PullBackMismatch(f"{reg.target}@{digest} is image {config_back}, the judged image is {image_id}")
    shutil.rmtree(back)
    return digest, len(body)


def relation(j, art) -> dict[str, str]:
    """What a verdict that reached this image through another artifact stands on, and what it does not cover."""
    assert j.verdict is not None
    out = {"kind": j.relation, "source_env": str(j.source_env), "judged_wheel": j.verdict.subject.digest}
    if j.relation == RELATION_SAME_WHEEL:
        out.update(
            judged_at_input_hash=j.verdict.input_hash,
            covers="this very wheel (bit-identical), judged at another input hash of this env; this image's "
            "torch binding ran in its own build, abi and cpu tiers",
        )
    if j.relation == RELATION_DEVICE_CODE:
        out.update(
            device_code=str(j.device_code),
            this_wheel="sha256:" + art.wheel_sha256,
            covers="the GPU code only (every cubin and PTX payload, identical); this image's torch binding "
            "(host code) ran only in its own build, abi and cpu tiers",
        )
    return out


def judgement_entry(j) -> dict[str, Any]:
    """One verdict the gate relied on, as an attestation states it: tier, result, what it judged, where and when
    it ran, its ledger fact and how it reaches the published artifact."""
    v = j.verdict
    assert v is not None
    return {
        "tier": v.tier.value,
        "verdict": v.verdict.value,
        "subject": {"kind": v.subject.kind.value, "digest": v.subject.digest},
        "counts": v.counts,
        "where": v.host,
        "date": v.date,
        "source": v.source,
        "fact": v.id,
        "how": j.how,
    }


def predicates(req: PublishRequest, decision: GateDecision, image_id: str, digest: str) -> dict[str, dict]:
    """The provenance and verification predicates of this publication, from the plan and the ledger."""
    ledger = store.load(req.root, req.env_id)
    builds = [a for a in ledger.artifacts(req.input_hash) if a.image_id == image_id]
    first = min(builds, key=lambda a: a.date)
    provenance = {
        "buildDefinition": {
            "buildType": attest.BUILD_TYPE,
            "externalParameters": {"env": req.env_id, "input_hash": req.input_hash},
            "internalParameters": {"inputs": req.inputs},
            "resolvedDependencies": [
                {"name": f"base image ({stage})", "digest": {"sha256": d.removeprefix("sha256:")}}
                for stage, d in (("builder", first.base_image_id), ("runtime", first.runtime_base_id))
                if d
            ],
        },
        "runDetails": {
            "builder": {"id": "https://flashkit.invalid/builder", "version": dict(first.builder or {})},
            "metadata": {"invocationId": first.id, "startedOn": first.date},
            "byproducts": [
                {"name": "wheel", "digest": {"sha256": first.wheel_sha256}},
                {"name": "builder image", "digest": {"sha256": first.builder_id.removeprefix("sha256:")}},
            ],
        },
        "builds": [{"fact": a.id, "date": a.date, **(a.builder or {})} for a in builds],
    }
    tiers = [
        {**judgement_entry(j), **({"relation": relation(j, builds[0])} if j.relation else {})} for j in decision.passed
    ]
    verification = {
        "verifier": {"id": "https://flashkit.invalid/gate"},
        "timeVerified": utc_now(),
        "env": req.env_id,
        "input_hash": req.input_hash,
        "image_id": image_id,
        "policy": {
            "name": req.policy.name,
            "requires": req.policy.describe(),
            "weaker_than_default": req.policy.weaker_than_default,
        },
        "tiers": tiers,
    }
    return {attest.PROVENANCE_TYPE: provenance, attest.VERIFICATION_TYPE: verification}


def _attach(reg: Registry, req: PublishRequest, preds: dict[str, dict], digest: str, size: int, tmp: Path, say) -> dict:
    """Step 4: sign, push under sha256-<hex>.att, fetch back and verify. Returns what the ledger records."""
    signer = attest.load_signer(req.signing_key)  # type: ignore[arg-type]
    name = str(reg.target)
    envelopes = [(t, attest.sign(signer, attest.statement(name, digest, t, p))) for t, p in preds.items()]
    att_dir, back = tmp / "att", tmp / "att-back"
    att_digest = attest.write_layout(att_dir, digest, size, envelopes)
    tag = attest.att_tag(digest)
    say(f"attaching the signed attestation {reg.target}:{tag}")
    reg.push(att_dir, "att", tag)
    reg.fetch(tag, back, "att")
    body, got = layout_manifest(back, "att")
    if got != att_digest:
        raise PushFailed(f"{reg.target}:{tag} serves {got}, the pushed attestation is {att_digest}")
    checked = attest.read_artifact(body, lambda d: layout_blob(back, d), digest, signer.public_key)
    return {
        "digest": att_digest,
        "tag": tag,
        "key_id": attest.key_id(signer.public_key),
        "predicate_types": sorted(checked),
    }


def _existing(reg: Registry, req: PublishRequest, image_id: str, say) -> str | None:
    """The digest the immutable tag already names, after checking it is the judged image (else refuse)."""
    got = reg.manifest(req.immutable_tag)
    if got is None:
        return None
    _body, digest = got
    _c, config = reg.config(digest)
    if config != image_id:
        raise PushFailed(
            f"the immutable tag {req.target}:{req.immutable_tag} already names {digest}, image {config}, "
            f"not the judged image {image_id}",
            hint="an input-hash tag is never moved; publish under a new input hash or delete it in the registry",
        )
    say(f"{req.target}:{req.immutable_tag} already names this image ({digest}); attaching and tagging again")
    return digest


def publish_image(engine, req: PublishRequest, *, dry_run: bool = False, say: Callable[[str], None] = lambda s: None):
    """Gate, then push by digest, pull back, attach the signed attestation, tag, and record. Returns the
    Publication (or the GateDecision of a dry run); raises on any refusal or failure."""
    import docker.errors

    tags = list(dict.fromkeys([req.immutable_tag, *req.tags]))
    _check_tags(tags)
    require_a_build(req)
    if not dry_run:
        attest.load_signer(_signing_key(req))  # a missing or bad key is refused before any push
    sdk = engine.sdk()
    try:
        image_id = sdk.images.get(req.image_ref).id
    except docker.errors.ImageNotFound:
        raise PublishRefused(
            f"no local image {req.image_ref} to publish", hint=f"run `flashkit build {req.env_id}` and its tiers"
        ) from None
    finally:
        sdk.close()
    decision = check_gate(req.root, req.env_id, req.input_hash, image_id, req.policy, req.gpu_evidence)
    say(f"gate: {req.env_id}@{req.input_hash} image {image_id}: {req.policy.describe()} passed")
    for j in decision.passed:
        say(f"  {j.line()}")
    if req.policy.weaker_than_default:
        say(
            f"note: policy {req.policy.name} ({req.policy.describe()}) is weaker than the default; the attestation says so"
        )
    if dry_run:
        return decision
    req = dataclasses.replace(req, signing_key=_signing_key(req))
    with (
        access(req.target) as acc,
        registry_lock(req.target),
        tempfile.TemporaryDirectory(prefix="flashkit-publish-") as t,
    ):
        reg, tmp = Registry(req.target, acc), Path(t)
        existing = _existing(reg, req, image_id, say)
        if existing is None:
            digest, size = _stage_and_check(reg, image_id, tmp, say)
        else:
            digest, size = existing, len(reg.manifest(existing)[0])  # type: ignore[index]
        att = _attach(reg, req, predicates(req, decision, image_id, digest), digest, size, tmp, say)
        for tag in tags:
            reg.tag(digest, tag)
            say(f"tagged {req.target}:{tag} -> {digest}")
    pub = Publication(
        env=req.env_id,
        input_hash=req.input_hash,
        date=utc_now(),
        target=str(req.target),
        digest=digest,
        tags=tuple(tags),
        judged_image_id=image_id,
        published_image_id=image_id,
        policy=f"{req.policy.name}:{req.policy.describe()}",
        verified_tiers=decision.passed_tiers,
        verdict_ids=tuple(j.verdict.id for j in decision.passed if j.verdict is not None),
        reused=existing is not None,
        attestation=att,
    )
    append_with_applies(req.root, req.env_id, [pub])
    return pub


def _signing_key(req: PublishRequest) -> Path:
    key = req.signing_key or (
        Path(os.environ[attest.SIGNING_KEY_ENV]) if os.environ.get(attest.SIGNING_KEY_ENV) else None
    )
    if key is None:
        raise UsageError(
            f"publishing signs an attestation: pass --signing-key PATH or set {attest.SIGNING_KEY_ENV}",
            hint="make a key pair once with `flashkit key generate DIR` (outside the repository)",
        )
    return key
