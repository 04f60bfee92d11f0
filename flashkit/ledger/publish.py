"""Publishing an image to a registry only when the ledger allows it.

The gate (:func:`flashkit.ledger.gate.gate`) reads only the ledger, the env's current input hash and
the id of the local image: no cached build result is needed, so publishing works from any clone that
has ``verified/`` and the image. Nothing touches the registry until the gate has passed.

Labels without losing the judged image. Adding a label changes the image config and so the image id,
while the ledger judged the built image. The published image is therefore a derived image whose
Dockerfile is only ``FROM <judged image>`` plus LABELs: it adds no layer (its rootfs diff ids are
checked equal to the judged image's), its parent is the judged image, and its labels name the judged
image id (``io.flashkit.judged-image``), the input hash, the policy and the tiers that passed.

Order of operations, so that an interrupted or failed publish leaves no tag in the target repository:

1. push the derived image under a unique tag to a *staging* repository (``<repository>-staging``);
2. link its blobs into the target repository (cross-repository mount) and PUT the manifest there
   *by digest*, i.e. with no tag;
3. delete the staging manifest (distribution 2.x deletes manifests by digest only, hence the
   separate repository);
4. pull the target back by digest and compare: the manifest hashes to the digest, its config to the
   published image id, its layers are the judged image's layers, the pulled image id matches;
5. only then PUT the same manifest bytes under the immutable input-hash tag and the spec's tags;
6. append a ``publication`` fact to the ledger.

Steps 1-5 run under a host-wide lock per registry repository (``FLASHKIT_LOCK_DIR``, default
``~/.cache/flashkit/locks``), and the immutable tag is looked at again under that lock: two publishes
from this host can never both create it. An immutable tag that already exists is reused only when it
names an image derived from the same judged image under the same input hash and policy; otherwise
publishing refuses. Registries shared by several hosts should also enforce tag immutability
themselves (Harbor, ECR and GHCR can): no client-side lock spans hosts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from flashkit.core.atomic import utc_now
from flashkit.core.errors import PublishRefused, PullBackMismatch, PushFailed, UsageError
from flashkit.core.names import label
from flashkit.ledger import store
from flashkit.ledger.gate import GPU_TIERS, GateDecision, Policy, gate
from flashkit.ledger.model import Publication
from flashkit.ledger.record import append_with_applies
from flashkit.ledger.registry_api import RegistryAPI, Target, config_labels, manifest_parts

_TAG_MAX = 128
LOCK_DIR_ENV = "FLASHKIT_LOCK_DIR"
LOCK_TIMEOUT_S = 1800


def image_labels(env_id: str, input_hash: str, judged_image_id: str, policy: Policy, passed: Iterable[str]) -> dict:
    return {
        label("env"): env_id,
        label("input-hash"): input_hash,
        label("judged-image"): judged_image_id,
        label("policy"): f"{policy.name}:{policy.describe()}",
        label("verified-tiers"): ",".join(passed),
    }


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
            "or ask explicitly for a weaker policy (--policy no-gpu), which the image labels will state"
        )
    return hint


def check_gate(root: Path, env_id: str, input_hash: str, image_id: str, policy: Policy) -> GateDecision:
    decision = gate(store.load(root, env_id), input_hash, image_id, policy)
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


def _push(sdk, ref: str, tag: str, on_line: Callable[[str], None]) -> str:
    """docker push; returns the manifest digest, raises on any error line."""
    import docker.errors

    digest = None
    try:
        for line in sdk.api.push(ref, tag=tag, stream=True, decode=True):
            if "error" in line:
                raise PushFailed(f"pushing {ref}:{tag} failed: {line['error']}")
            if "status" in line and line.get("id") is None:
                on_line(line["status"])
            digest = (line.get("aux") or {}).get("Digest", digest)
    except docker.errors.APIError as exc:
        raise PushFailed(f"pushing {ref}:{tag} failed: {exc}") from exc
    if not digest:
        raise PushFailed(f"pushing {ref}:{tag} ended without a manifest digest")
    return digest


def _derive(sdk, judged_id: str, labels: dict[str, str]) -> str:
    """Build ``FROM <judged image>`` + labels (no layer) and return the new image id."""
    import docker.errors

    # FROM needs a name; a throwaway local tag names exactly the judged id.
    tmp_repo, tmp_tag = "flashkit-publish-src", uuid.uuid4().hex[:12]
    sdk.images.get(judged_id).tag(tmp_repo, tmp_tag)
    try:
        # One LABEL instruction: one config-only step, so the derived image's parent is the judged image.
        label_line = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
        dockerfile = io.BytesIO(f"FROM {tmp_repo}:{tmp_tag}\nLABEL {label_line}\n".encode())
        image, _logs = sdk.images.build(fileobj=dockerfile, pull=False, rm=True, forcerm=True)
        if image.attrs.get("Parent") != judged_id or image.attrs["RootFS"] != sdk.images.get(judged_id).attrs["RootFS"]:
            raise PushFailed(f"the labelled image {image.id} is not a config-only child of {judged_id}")
        return image.id
    except docker.errors.BuildError as exc:
        raise PushFailed(f"could not derive the labelled image from {judged_id}: {exc}") from exc
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            sdk.images.remove(f"{tmp_repo}:{tmp_tag}", noprune=True)


def _check_pulled(
    sdk, api: RegistryAPI, target: Target, digest: str, expect_id: str | None, judged: dict, labels: dict
) -> str:
    """Pull ``target@digest`` and check it is the derived image of ``judged``; returns its image id."""
    import docker.errors

    got = api.manifest(target.repository, digest)
    if got is None:
        raise PullBackMismatch(f"{target}@{digest} is not in the registry after the push")
    body, _mt, real = got
    if real != digest:
        raise PullBackMismatch(f"{target}@{digest} serves a manifest hashing to {real}")
    config_digest, _layers = manifest_parts(f"{target}@{digest}", body)
    if expect_id is not None and config_digest != expect_id:
        raise PullBackMismatch(f"{target}@{digest} has config {config_digest}, the pushed image is {expect_id}")
    config = api.config(target.repository, body)
    layers = (config.get("rootfs") or {}).get("diff_ids", [])
    if layers != judged["RootFS"]["Layers"]:
        raise PullBackMismatch(
            f"{target}@{digest} has layers {layers}, the judged image {judged['Id']} has {judged['RootFS']['Layers']}"
        )
    have = config_labels(config)
    wrong = {k: have.get(k) for k, v in labels.items() if have.get(k) != v}
    if wrong:
        raise PullBackMismatch(f"{target}@{digest} labels differ from what was published: {wrong}")
    try:
        pulled = sdk.images.pull(f"{target}@{digest}")
    except docker.errors.APIError as exc:
        raise PullBackMismatch(f"pulling {target}@{digest} back failed: {exc}") from exc
    if pulled.id != config_digest:
        raise PullBackMismatch(f"pulled {target}@{digest} is image {pulled.id}, expected {config_digest}")
    return pulled.id


def _stage_and_link(sdk, api: RegistryAPI, target: Target, image_id: str, labels: dict, say) -> tuple[str, str]:
    """Steps 1-3 of the module docstring: the target repository gets the manifest by digest, untagged."""
    import docker.errors

    derived = _derive(sdk, image_id, labels)
    staging_ref, staging_tag = target.ref(target.staging), f"push-{uuid.uuid4().hex[:16]}"
    sdk.images.get(derived).tag(staging_ref, staging_tag)
    staged_digest = None
    try:
        say(f"pushing {derived} to staging {staging_ref}:{staging_tag}")
        staged_digest = _push(sdk, staging_ref, staging_tag, say)
        staged = api.manifest(target.staging, staged_digest)
        if staged is None:
            raise PushFailed(f"{staging_ref}@{staged_digest} vanished after the push")
        body, media_type, _d = staged
        config, layers = manifest_parts(f"{staging_ref}@{staged_digest}", body)
        for blob in (config, *layers):
            api.mount(target.repository, blob, target.staging)
        digest = api.put_manifest(target.repository, staged_digest, body, media_type) or staged_digest
        return digest, derived
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            sdk.images.remove(f"{staging_ref}:{staging_tag}", noprune=True)
        if staged_digest is not None:
            with contextlib.suppress(PushFailed):
                api.delete_manifest(target.staging, staged_digest)


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


def _reuse(sdk, api: RegistryAPI, req: PublishRequest, existing, judged: dict, labels: dict, say) -> tuple[str, str]:
    digest = existing[2]
    say(f"{req.target}:{req.immutable_tag} exists ({digest}); checking it is this image")
    have = config_labels(api.config(req.target.repository, existing[0]))
    differ = {k: (have.get(k), v) for k, v in labels.items() if have.get(k) != v}
    if differ:
        raise PushFailed(
            f"the immutable tag {req.target}:{req.immutable_tag} already names {digest}, whose labels differ "
            "from this publication: " + "; ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in differ.items()),
            hint="an input-hash tag is never moved; publish under a new input hash or delete it in the registry",
        )
    return digest, _check_pulled(sdk, api, req.target, digest, None, judged, labels)


def publish_image(engine, req: PublishRequest, *, dry_run: bool = False, say: Callable[[str], None] = lambda s: None):
    """Gate, then push, pull back by digest, tag, and record. Returns the Publication (or the
    GateDecision of a dry run); raises on any refusal or failure."""
    import docker.errors

    tags = [req.immutable_tag] + [t for t in req.tags if t != req.immutable_tag]
    for t in tags:
        if not (0 < len(t) <= _TAG_MAX) or not all(c.isalnum() or c in "_.-" for c in t) or t[0] in ".-":
            raise UsageError(f"{t!r} is not a valid image tag")
    require_a_build(req)
    sdk = engine.sdk()
    try:
        try:
            judged = sdk.images.get(req.image_ref).attrs
        except docker.errors.ImageNotFound:
            raise PublishRefused(
                f"no local image {req.image_ref} to publish", hint=f"run `flashkit build {req.env_id}` and its tiers"
            ) from None
        image_id = judged["Id"]
        decision = check_gate(req.root, req.env_id, req.input_hash, image_id, req.policy)
        say(f"gate: {req.env_id}@{req.input_hash} image {image_id}: {req.policy.describe()} passed")
        for j in decision.passed:
            say(f"  {j.line()}")
        if req.policy.weaker_than_default:
            say(
                f"note: policy {req.policy.name} ({req.policy.describe()}) is weaker than the default; the labels say so"
            )
        if dry_run:
            return decision
        labels = image_labels(req.env_id, req.input_hash, image_id, req.policy, decision.passed_tiers)
        api = RegistryAPI(req.target)
        with registry_lock(req.target):
            existing = api.manifest(req.target.repository, req.immutable_tag)
            if existing is not None:
                digest, published_id = _reuse(sdk, api, req, existing, judged, labels, say)
            else:
                digest, published_id = _stage_and_link(sdk, api, req.target, image_id, labels, say)
                say(f"pulling {req.target}@{digest} back to compare")
                _check_pulled(sdk, api, req.target, digest, published_id, judged, labels)
            body, media_type, _d = api.manifest(req.target.repository, digest) or (None, None, None)
            if body is None:
                raise PushFailed(f"{req.target}@{digest} vanished before it was tagged")
            for t in tags:
                api.put_manifest(req.target.repository, t, body, media_type)
                say(f"tagged {req.target}:{t} -> {digest}")
        pub = Publication(
            env=req.env_id,
            input_hash=req.input_hash,
            date=utc_now(),
            target=str(req.target),
            digest=digest,
            tags=tuple(tags),
            judged_image_id=image_id,
            published_image_id=published_id,
            policy=f"{req.policy.name}:{req.policy.describe()}",
            verified_tiers=decision.passed_tiers,
            verdict_ids=tuple(j.verdict.id for j in decision.passed if j.verdict is not None),
            reused=existing is not None,
        )
        append_with_applies(req.root, req.env_id, [pub])
        return pub
    finally:
        sdk.close()
