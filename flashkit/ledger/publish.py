"""`flashkit publish <env>`: push an image to a registry only when its verification record allows it.

The gate (``gate``) is pure: it reads only the verification record, the env's
current input hash and the id of the local image, and checks every tier the
policy requires with ``record.is_verified`` -- the one judge of "verified".
Nothing touches the registry until the gate has passed.

Policy. The default policy ``full`` requires build, abi, cpu and a GPU tier
(``gpu`` or ``artifact-gpu``). A weaker policy must be named on the command
line (``--policy no-gpu`` or a tier list such as ``--policy build,abi,cpu``)
and is written into the published image's labels.

Labels without losing the judged image. Adding a label changes the image
config and so the image id, while the record judged the built image. The
published image is therefore a derived image whose Dockerfile is only
``FROM <judged image>`` plus LABELs: it adds no layer (its rootfs diff ids are
checked equal to the judged image's), its parent is the judged image, and its
labels name the judged image id (``io.flashkit.judged-image``), the input hash,
the policy and the tiers that passed. The record keeps both ids: the judged
``image_id`` and, under ``artifact.published``, the published image id and the
registry digest.

Order of operations, chosen so that an interrupted or failed publish leaves no
tag in the target repository:

1. push the derived image under a unique tag to a *staging* repository
   (``<repository>-staging``); an interruption here leaves at most upload
   fragments there, never a tag in the target repository;
2. link its blobs into the target repository (cross-repository mount) and PUT
   the manifest there *by digest*, i.e. with no tag;
3. delete the staging manifest (distribution 2.x cannot delete a single tag,
   only a manifest by digest, hence the separate repository);
4. pull the target back by digest and compare: the served manifest hashes to
   the digest, its config hashes to the published image id, its layers are the
   judged image's layers, and the pulled image id is the published image id;
5. only then PUT the same manifest bytes under the immutable input-hash tag and
   the mutable tags from the spec's ``publish_tags``;
6. record the registry digest in ``verified/<env>.json`` (``record.upsert_entry``).

An immutable tag that already exists is reused only when it names an image
derived from the same judged image under the same input hash and policy;
otherwise publishing refuses.

The registry and repository are configuration: ``--registry HOST[:PORT]/REPO``
or ``FLASHKIT_REGISTRY``. Loopback registries are spoken to over plain HTTP
(the engine treats 127.0.0.0/8 as insecure by default), others over HTTPS.
Registries that need a login are not supported yet.

Exit codes (within the image range 10-19):
  17  refused: the record does not show every required tier passed for exactly this image
  18  the push or a registry call failed (interrupted, unreachable, immutable tag taken)
  19  the image pulled back by digest is not the image that was pushed
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import hashlib
import io
import json
import logging
import os
import re
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flashkit.ledger import record
from flashkit.core.errors import EXIT_USAGE, FlashkitError
from flashkit.core.errors import ImageError

log = logging.getLogger(__name__)

GPU_TIERS = ("gpu", "artifact-gpu")
# Each requirement is a tuple of alternatives: one of them passing satisfies it.
POLICIES: dict[str, tuple[tuple[str, ...], ...]] = {
    "full": (("build",), ("abi",), ("cpu",), GPU_TIERS),
    "no-gpu": (("build",), ("abi",), ("cpu",)),
}
DEFAULT_POLICY = "full"
REGISTRY_ENV = "FLASHKIT_REGISTRY"
STAGING_SUFFIX = "-staging"
LABEL_PREFIX = "io.flashkit."

MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
)
# A repository path component, as the distribution spec defines it.
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class PublishRefused(ImageError):
    """The verification record does not allow publishing this image."""

    exit_code = 17


class PushFailed(ImageError):
    """Pushing, or a registry API call, failed; no tag was created in the target repository."""

    exit_code = 18


class PullBackMismatch(ImageError):
    """What the registry serves by digest is not the image that was pushed."""

    exit_code = 19


class UsageError(FlashkitError):
    exit_code = EXIT_USAGE


# -- policy ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    requirements: tuple[tuple[str, ...], ...]

    def describe(self) -> str:
        return ",".join("|".join(alts) for alts in self.requirements)

    @property
    def weaker_than_default(self) -> bool:
        # A default requirement is kept when some requirement here is at least as strict (fewer alternatives).
        return not all(any(set(r) <= set(d) for r in self.requirements) for d in POLICIES[DEFAULT_POLICY])


def parse_policy(text: str | None) -> Policy:
    """A named policy (``full``, ``no-gpu``) or a comma list of tiers, ``a|b`` meaning either."""
    text = (text or DEFAULT_POLICY).strip()
    if text in POLICIES:
        return Policy(text, POLICIES[text])
    reqs: list[tuple[str, ...]] = []
    for item in text.split(","):
        alts = tuple(a.strip() for a in item.split("|") if a.strip())
        if not alts:
            raise UsageError(f"--policy {text!r}: empty tier in the list")
        for a in alts:
            if a not in record.TIER_ORDER:
                near = difflib.get_close_matches(a, [*record.TIER_ORDER, *POLICIES], n=1)
                hint = f" Perhaps you meant {near[0]!r}?" if near else ""
                raise UsageError(
                    f"--policy: unknown tier {a!r}; tiers are {', '.join(record.TIER_ORDER)}, "
                    f"named policies {', '.join(POLICIES)}.{hint}"
                )
        if alts not in reqs:
            reqs.append(alts)
    return Policy("custom", tuple(reqs))


# -- the gate (pure) ---------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GateDecision:
    ok: bool
    reasons: tuple[str, ...]
    passed_tiers: tuple[str, ...]  # tiers the record shows passed for this very image

    def __bool__(self) -> bool:
        return self.ok


def gate(rec: dict[str, Any], input_hash: str, image_id: str, policy: Policy) -> GateDecision:
    """May this image be published under ``policy``? Reads only the record."""
    reasons: list[str] = []
    for alts in policy.requirements:
        verdicts = [record.is_verified(rec, input_hash, image_id, [t]) for t in alts]
        if not any(verdicts):
            reasons.append(" / ".join(v.reason for v in verdicts) if len(alts) > 1 else verdicts[0].reason)
    passed = tuple(t for t in record.TIER_ORDER if record.is_verified(rec, input_hash, image_id, [t]))
    return GateDecision(not reasons, tuple(reasons), passed)


def image_labels(env_id: str, input_hash: str, judged_image_id: str, policy: Policy, passed: Iterable[str]) -> dict:
    return {
        LABEL_PREFIX + "env": env_id,
        LABEL_PREFIX + "input-hash": input_hash,
        LABEL_PREFIX + "judged-image": judged_image_id,
        LABEL_PREFIX + "policy": f"{policy.name}:{policy.describe()}",
        LABEL_PREFIX + "verified-tiers": ",".join(passed),
    }


# -- registry configuration ---------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Target:
    host: str  # host[:port]
    repository: str  # e.g. org/flash

    @property
    def base_url(self) -> str:
        hostname = self.host.rsplit(":", 1)[0] if self.host.count(":") == 1 else self.host
        loopback = hostname in ("localhost", "::1", "[::1]") or hostname.startswith("127.")
        return f"{'http' if loopback else 'https'}://{self.host}"

    @property
    def staging(self) -> str:
        return self.repository + STAGING_SUFFIX

    def ref(self, repository: str | None = None) -> str:
        return f"{self.host}/{repository or self.repository}"

    def __str__(self) -> str:
        return self.ref()


def parse_target(text: str | None) -> Target:
    """``HOST[:PORT]/REPO`` from --registry or $FLASHKIT_REGISTRY."""
    if not text:
        raise UsageError(
            f"no registry given: pass --registry HOST[:PORT]/REPOSITORY or set {REGISTRY_ENV} "
            "(e.g. 127.0.0.1:5000/org/flash; `flashkit registry` runs one on loopback)"
        )
    host, _, repo = text.strip().partition("/")
    if not repo or not ("." in host or ":" in host or host == "localhost"):
        raise UsageError(
            f"registry {text!r}: expected HOST[:PORT]/REPOSITORY with a registry host "
            "(a name with a dot or a port, or localhost), e.g. 127.0.0.1:5000/org/flash"
        )
    bad = [c for c in repo.split("/") if not _COMPONENT.match(c)]
    if bad:
        raise UsageError(
            f"registry {text!r}: repository component {bad[0]!r} is not allowed; "
            "use lowercase letters, digits and single separators (. _ -)"
        )
    return Target(host, repo)


# -- registry HTTP API (distribution v2) --------------------------------------
class RegistryAPI:
    """The few v2 calls the docker SDK has no verb for: manifest by digest, mount, delete, tags."""

    def __init__(self, target: Target, timeout_s: float = 60.0) -> None:
        self.target = target
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, *, data: bytes | None = None, headers: dict | None = None):
        url = f"{self.target.base_url}/v2/{path}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise PushFailed(
                f"registry {self.target.host} did not answer {method} {url}: {exc}",
                hint=f"check --registry / ${REGISTRY_ENV}; `flashkit registry --port N` runs one on loopback",
            ) from exc

    def _ok(self, what: str, status: int, body: bytes, ok: Iterable[int]) -> None:
        if status not in ok:
            raise PushFailed(f"registry {self.target.host}: {what} answered HTTP {status}", detail=body[:800].decode())

    def tags(self, repository: str) -> list[str]:
        status, _h, body = self._call("GET", f"{repository}/tags/list")
        if status == 404:  # NAME_UNKNOWN: the repository has never received a manifest
            return []
        self._ok(f"tags of {repository}", status, body, (200,))
        return sorted(json.loads(body).get("tags") or [])

    def manifest(self, repository: str, reference: str) -> tuple[bytes, str, str] | None:
        """(bytes, media type, digest) of a manifest, or None when there is none."""
        status, headers, body = self._call(
            "GET", f"{repository}/manifests/{reference}", headers={"Accept": ", ".join(MANIFEST_TYPES)}
        )
        if status == 404:
            return None
        self._ok(f"manifest {repository}:{reference}", status, body, (200,))
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        served = headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise PullBackMismatch(f"{repository}:{reference}: registry says digest {served}, bytes hash to {digest}")
        return body, headers.get("Content-Type", MANIFEST_TYPES[0]).split(";")[0], digest

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str:
        status, headers, text = self._call(
            "PUT", f"{repository}/manifests/{reference}", data=body, headers={"Content-Type": media_type}
        )
        self._ok(f"PUT manifest {repository}:{reference}", status, text, (201,))
        return headers.get("Docker-Content-Digest", "")

    def mount(self, repository: str, digest: str, source: str) -> None:
        status, _h, body = self._call("POST", f"{repository}/blobs/uploads/?mount={digest}&from={source}", data=b"")
        self._ok(f"mount {digest} from {source} into {repository}", status, body, (201,))

    def blob(self, repository: str, digest: str) -> bytes:
        status, _h, body = self._call("GET", f"{repository}/blobs/{digest}")
        self._ok(f"blob {repository}@{digest}", status, body, (200,))
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise PullBackMismatch(f"blob {repository}@{digest} does not hash to its digest")
        return body

    def delete_manifest(self, repository: str, digest: str) -> None:
        status, _h, body = self._call("DELETE", f"{repository}/manifests/{digest}")
        self._ok(f"delete {repository}@{digest}", status, body, (202, 404))


# -- the publish edge ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Publication:
    target: str
    digest: str
    tags: tuple[str, ...]
    judged_image_id: str
    published_image_id: str
    policy: str
    verified_tiers: tuple[str, ...]
    reused: bool  # the immutable tag already named this derived image

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tags"], d["verified_tiers"] = list(self.tags), list(self.verified_tiers)
        d["date"] = record.utc_now()
        return d


def refuse_message(env_id: str, input_hash: str, record_file: Path, decision: GateDecision, policy: Policy) -> str:
    lines = [f"refusing to publish {env_id} (input hash {input_hash}) under policy {policy.name} ({policy.describe()})"]
    # A failed suite can list hundreds of test ids; the record keeps them all.
    lines += [f"  - {r if len(r) <= 700 else r[:700] + ' ... (the rest is in the record)'}" for r in decision.reasons]
    lines.append(f"record: {record_file}")
    return "\n".join(lines)


def refuse_hint(env_id: str, decision: GateDecision) -> str:
    text = " ".join(decision.reasons)
    gpu = any(t in text for t in GPU_TIERS)
    hint = f"run `flashkit test {env_id}` (or `flashkit verify {env_id}`) for the current inputs"
    if gpu:
        hint += (
            f"; for the GPU tier run `flashkit verify {env_id} --tiers gpu` on a GPU host or import an "
            f"artifact-gpu result (`flashkit verify import-artifact-result {env_id} RESULT.json`), "
            "or ask explicitly for a weaker policy (--policy no-gpu), which the image labels will state"
        )
    return hint


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
        # One LABEL instruction: one config-only step, so the derived image's parent is the judged image
        # (the build API's `labels=` would chain one intermediate image per label).
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


def _labels_at(api: RegistryAPI, target: Target, manifest_body: bytes) -> dict[str, str]:
    config = json.loads(api.blob(target.repository, json.loads(manifest_body)["config"]["digest"]))
    return (config.get("config") or {}).get("Labels") or {}


def _check_pulled(
    sdk, api: RegistryAPI, target: Target, digest: str, expect_id: str | None, judged: dict, labels: dict
) -> str:
    """Pull ``target@digest`` and check it is the derived image of ``judged``; returns its image id."""
    got = api.manifest(target.repository, digest)
    if got is None:
        raise PullBackMismatch(f"{target}@{digest} is not in the registry after the push")
    body, _mt, real = got
    if real != digest:
        raise PullBackMismatch(f"{target}@{digest} serves a manifest hashing to {real}")
    manifest = json.loads(body)
    config_digest = manifest["config"]["digest"]
    if expect_id is not None and config_digest != expect_id:
        raise PullBackMismatch(f"{target}@{digest} has config {config_digest}, the pushed image is {expect_id}")
    config = json.loads(api.blob(target.repository, config_digest))
    layers = config.get("rootfs", {}).get("diff_ids", [])
    if layers != judged["RootFS"]["Layers"]:
        raise PullBackMismatch(
            f"{target}@{digest} has layers {layers}, the judged image {judged['Id']} has {judged['RootFS']['Layers']}"
        )
    have = (config.get("config") or {}).get("Labels") or {}
    wrong = {k: have.get(k) for k, v in labels.items() if have.get(k) != v}
    if wrong:
        raise PullBackMismatch(f"{target}@{digest} labels differ from what was published: {wrong}")
    import docker.errors

    try:
        pulled = sdk.images.pull(f"{target}@{digest}")
    except docker.errors.APIError as exc:
        raise PullBackMismatch(f"pulling {target}@{digest} back failed: {exc}") from exc
    if pulled.id != config_digest:
        raise PullBackMismatch(f"pulled {target}@{digest} is image {pulled.id}, expected {config_digest}")
    return pulled.id


def publish_image(
    engine,
    *,
    env_id: str,
    input_hash: str,
    immutable_tag: str,
    image_ref: str,
    record_file: Path,
    policy: Policy,
    target: Target,
    tags: Iterable[str],
    dry_run: bool = False,
    say: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> Publication | GateDecision:
    """Gate, then push, pull back by digest, tag, and record. Raises on any refusal or failure."""
    import docker.errors

    tags = [immutable_tag] + [t for t in tags if t != immutable_tag]
    for t in tags:
        if not _TAG.match(t):
            raise UsageError(f"{t!r} is not a valid image tag")
    sdk = engine.sdk()
    try:
        try:
            judged = sdk.images.get(image_ref).attrs
        except docker.errors.ImageNotFound:
            raise PublishRefused(
                f"no local image {image_ref} to publish", hint=f"run `flashkit build {env_id}` and its tiers"
            ) from None
        image_id = judged["Id"]
        rec = record.load(record_file)
        decision = gate(rec, input_hash, image_id, policy)
        if not decision:
            raise PublishRefused(
                refuse_message(env_id, input_hash, record_file, decision, policy), hint=refuse_hint(env_id, decision)
            )
        say(f"gate: {env_id}@{input_hash} image {image_id}: {policy.describe()} passed ({record_file})")
        if policy.weaker_than_default:
            say(f"note: policy {policy.name} ({policy.describe()}) is weaker than the default; the labels say so")
        if dry_run:
            return decision
        labels = image_labels(env_id, input_hash, image_id, policy, decision.passed_tiers)
        api = RegistryAPI(target)
        existing = api.manifest(target.repository, immutable_tag)
        if existing is not None:
            digest, reused = existing[2], True
            say(f"{target}:{immutable_tag} exists ({digest}); checking it is this image")
            have = _labels_at(api, target, existing[0])
            differ = {k: (have.get(k), v) for k, v in labels.items() if have.get(k) != v}
            if differ:
                raise PushFailed(
                    f"the immutable tag {target}:{immutable_tag} already names {digest}, whose labels differ "
                    f"from this publication: "
                    + "; ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in differ.items()),
                    hint="an input-hash tag is never moved; publish under a new input hash or delete it in the registry",
                )
            published_id = _check_pulled(sdk, api, target, digest, None, judged, labels)
        else:
            digest, published_id, reused = _stage_and_link(sdk, api, target, image_id, labels, say)
            say(f"pulling {target}@{digest} back to compare")
            _check_pulled(sdk, api, target, digest, published_id, judged, labels)
        body, media_type, _d = api.manifest(target.repository, digest)
        for t in tags:
            api.put_manifest(target.repository, t, body, media_type)
            say(f"tagged {target}:{t} -> {digest}")
        pub = Publication(
            target=str(target),
            digest=digest,
            tags=tuple(tags),
            judged_image_id=image_id,
            published_image_id=published_id,
            policy=f"{policy.name}:{policy.describe()}",
            verified_tiers=decision.passed_tiers,
            reused=reused,
        )
        _record(record_file, input_hash, image_id, pub)
        return pub
    finally:
        sdk.close()


def _stage_and_link(sdk, api: RegistryAPI, target: Target, image_id: str, labels: dict, say) -> tuple[str, str, bool]:
    """Steps 1-3 of the module docstring: the target repository gets the manifest by digest, untagged."""
    import docker.errors

    derived = _derive(sdk, image_id, labels)
    staging_ref, staging_tag = target.ref(target.staging), f"push-{uuid.uuid4().hex[:16]}"
    sdk.images.get(derived).tag(staging_ref, staging_tag)
    staged_digest = None
    try:
        say(f"pushing {derived} to staging {staging_ref}:{staging_tag}")
        staged_digest = _push(sdk, staging_ref, staging_tag, say)
        body, media_type, _d = api.manifest(target.staging, staged_digest) or (None, None, None)
        if body is None:
            raise PushFailed(f"{staging_ref}@{staged_digest} vanished after the push")
        manifest = json.loads(body)
        for blob in [manifest["config"], *manifest["layers"]]:
            api.mount(target.repository, blob["digest"], target.staging)
        digest = api.put_manifest(target.repository, staged_digest, body, media_type) or staged_digest
        return digest, derived, False
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            sdk.images.remove(f"{staging_ref}:{staging_tag}", noprune=True)
        if staged_digest is not None:
            with contextlib.suppress(PushFailed):
                api.delete_manifest(target.staging, staged_digest)


def _record(record_file: Path, input_hash: str, image_id: str, pub: Publication) -> None:
    """Add the registry digest to the record entry that judged ``image_id`` (record.py's own writer)."""
    entry = record.load(record_file)["entries"][input_hash]
    published = dict(entry["artifact"].get("published") or {})
    published[pub.target] = pub.to_json()
    record.upsert_entry(record_file, input_hash, {"image_id": image_id, "published": published}, [])


# -- CLI ---------------------------------------------------------------------------
def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "publish", help="push an env's verified image (mutable + input-hash tags), pull back by digest, record it"
    )
    p.add_argument("env", help="env id, e.g. cu130-torch211")
    p.add_argument("--registry", help=f"HOST[:PORT]/REPOSITORY (default: ${REGISTRY_ENV})")
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        help="required tiers: full (default: build,abi,cpu,gpu|artifact-gpu), no-gpu, or a list like build,abi,cpu",
    )
    p.add_argument("--dry-run", action="store_true", help="run the gate only; touch no registry")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    from flashkit.core import paths
    from flashkit.images.build import load_result
    from flashkit.images.engine import ensure_engine
    from flashkit.plan.inputhash import input_hash, tag_suffix
    from flashkit.plan.spec import load_env

    root = paths.root_of(args)
    policy = parse_policy(args.policy)
    target = parse_target(args.registry or os.environ.get(REGISTRY_ENV))
    spec = load_env(root, args.env)
    env_id = str(spec.id)
    h = input_hash(root, spec)
    record_file = record.record_path(env_id, root)
    res = load_result(root, env_id, h)
    if res is None:
        known = ", ".join(sorted(record.load(record_file).get("entries", {}))) or "none"
        raise PublishRefused(
            f"refusing to publish {env_id}: no build for its current input hash {h} "
            f"(the inputs changed since the last build or test; record {record_file} has entries for: {known})",
            hint=f"run `flashkit test {env_id}` to build and verify the current inputs",
        )
    out = publish_image(
        ensure_engine(),
        env_id=env_id,
        input_hash=h,
        immutable_tag=tag_suffix(h),
        image_ref=res.runtime_ref,
        record_file=record_file,
        policy=policy,
        target=target,
        tags=spec.publish_tags,
        dry_run=args.dry_run,
    )
    if isinstance(out, Publication):
        print(f"{env_id}: published {out.target}@{out.digest}")
        for t in out.tags:
            print(f"  {out.target}:{t}")
        print(f"  judged image {out.judged_image_id}, published image {out.published_image_id}")
        print(f"  recorded in {record_file}")
    else:
        print(f"{env_id}: the gate passes ({', '.join(out.passed_tiers)} passed); dry run, nothing pushed")
    return 0
