"""The ledger's facts: typed, content-addressed values, each one line of ``verified/<env>.jsonl``.

Five kinds, written only by appending (schema 2, ``schema/ledger-v2.schema.json``):

- ``artifact``: what a build produced for an input hash: the runtime image id, the builder and base
  ids, the exported wheel's name and sha256, the lock hash, the (credential-free) build context, and who
  built it (``builder``: host, tool, storage, cold or not). Builds are reproducible, so a second builder
  that gets the same image id appends its own artifact: an independent build confirming the digest.
- ``verdict``: one tier's result, bound to the one digest it judged (``subject``: the runtime image id
  for image tiers, the wheel's sha256 for wheel tiers), with counts, reasons, host and evidence.
- ``applies``: a later artifact holds a digest an earlier verdict judged (a bit-identical wheel from a
  rebuild on another host): the verdict applies to it, and the ledger says so and why. With
  ``source_env`` set, the verdict is in another env's ledger: this env's image installs the very wheel
  that env built (``wheel_from``), and only wheel tiers are inherited that way (see
  :mod:`flashkit.ledger.record`).
- ``device-code``: the device code of a build's wheel (every cubin and PTX payload, and their digest). With
  ``relation="device-code"``, an ``applies`` carries another env's artifact-gpu verdict on another wheel whose
  device code is identical (:mod:`flashkit.ledger.device_code`).
- ``publication``: an image pushed to a registry: repository, manifest digest, tags, policy, the
  judged and the published image ids, the verdicts the gate relied on, and the signed attestation
  attached to the digest (its manifest digest, tag, key id and predicate types).

A fact's ``id`` is ``sha256:`` of its canonical JSON without the id (sorted keys, no spaces, ASCII),
so facts are named by content: the same fact appended twice is one fact, and an edited line no
longer matches its id. Reading checks every line against the JSON Schema and then what a schema
cannot say: the id, a subject of the right kind for the tier, and that "passed" has tests behind it.
A bad line is an error naming the file, line and field, never a fact silently dropped or accepted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from flashkit.core.names import Subject, Tier, Verdict
from flashkit.evidence import devicecode

SCHEMA = 2


def canonical(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def content_id(body: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical({k: v for k, v in body.items() if k != "id"}).encode()).hexdigest()


@dataclass(frozen=True)
class SubjectRef:
    kind: Subject
    digest: str  # "sha256:<64 hex>" for both kinds

    def short(self) -> str:
        return f"{self.kind.value} {self.digest[7:19]}"


def wheel_subject(sha256_hex: str) -> SubjectRef:
    return SubjectRef(Subject.WHEEL, "sha256:" + sha256_hex)


def image_subject(image_id: str) -> SubjectRef:
    return SubjectRef(Subject.IMAGE, image_id)


def source_subject(sha256_hex: str) -> SubjectRef:
    return SubjectRef(Subject.SOURCE, "sha256:" + sha256_hex)


@dataclass(frozen=True)
class Fact:
    kind: ClassVar[str]
    env: str
    input_hash: str
    date: str

    def body(self) -> dict[str, Any]:
        # Optional fields left at None are omitted (a fact that was never migrated says nothing about it);
        # required ones that may be None (a base image id) are written as null.
        omit = {f.name for f in dataclasses.fields(self) if f.default is None and getattr(self, f.name) is None}
        data = {k: v for k, v in dataclasses.asdict(self).items() if k not in omit}
        data.update(schema=SCHEMA, kind=self.kind)
        return _plain(data)

    @property
    def id(self) -> str:
        return content_id(self.body())

    def line(self) -> str:
        body = self.body()
        return canonical({**body, "id": content_id(body)})


@dataclass(frozen=True)
class Artifact(Fact):
    kind: ClassVar[str] = "artifact"
    image_id: str
    image_ref: str
    runtime_size: int
    builder_id: str
    builder_size: int
    base_image_id: str | None
    wheel: str
    wheel_sha256: str
    lock_sha256: str
    build_context: dict[str, Any] = field(default_factory=dict)
    migrated: dict[str, str] | None = None
    runtime_base_id: str | None = None  # the runtime stage's base (the builder's is base_image_id)
    builder: dict[str, Any] | None = None  # host, tool, storage, cold: who made this build
    # {"env", "input_hash"}: the build of another env whose wheel this image installs (the same file, same
    # sha256: a stable-ABI wheel serves every torch >= 2.10 of its CUDA major). None: built its own wheel.
    wheel_from: dict[str, str] | None = None
    # The runtime image's rootfs diff ids, base first (None in builds recorded before this field): two
    # builds of one input hash with two image ids are compared layer by layer, so the step that differs
    # is named from the ledger alone.
    runtime_layers: tuple[str, ...] | None = None

    def subject(self, kind: Subject) -> SubjectRef:
        if kind is Subject.SOURCE:
            raise ValueError("a build names its sources by input hash, not by a source digest")
        return image_subject(self.image_id) if kind is Subject.IMAGE else wheel_subject(self.wheel_sha256)

    def builder_key(self) -> tuple[str, str, str]:
        b = self.builder or {}
        return (str(b.get("host")), str(b.get("tool")), str(b.get("storage")))

    def same_build(self, other: Artifact) -> bool:
        """The same images and wheel under the same input hash from the same builder (a re-run, not new
        evidence). The same digests from another host or storage are an independent build, and count."""
        keys = ("env", "input_hash", "image_id", "builder_id", "wheel_sha256", "lock_sha256")
        return all(getattr(self, k) == getattr(other, k) for k in keys) and self.builder_key() == other.builder_key()


@dataclass(frozen=True)
class VerdictFact(Fact):
    kind: ClassVar[str] = "verdict"
    tier: Tier
    verdict: Verdict
    subject: SubjectRef
    counts: dict[str, int]
    reasons: tuple[str, ...]
    duration_s: float
    host: dict[str, str]
    source: str  # "build-host" | "imported" | "migrated"
    context: dict[str, str] = field(default_factory=dict)  # the other digests around the subject
    evidence: dict[str, str] = field(default_factory=dict)  # e.g. the JUnit report's sha256
    migrated: dict[str, str] | None = None

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASSED


@dataclass(frozen=True)
class Applies(Fact):
    kind: ClassVar[str] = "applies"
    tier: Tier
    verdict_id: str
    artifact_id: str
    subject: SubjectRef
    because: str
    # The env whose ledger holds the verdict (None: this one). Only for wheel tiers, and one level deep: the
    # verdict named is that env's own, never one it inherited in turn.
    source_env: str | None = None
    # None: the verdict judged this very wheel (a rebuild, or the wheel_from file). "device-code": it judged
    # another wheel whose device code is identical (``device_code``, the digest both device-code facts
    # record); ``subject`` is then the wheel the verdict judged, not this build's.
    relation: str | None = None
    device_code: str | None = None


@dataclass(frozen=True)
class Publication(Fact):
    kind: ClassVar[str] = "publication"
    target: str  # registry host[:port]/repository, never with credentials
    digest: str
    tags: tuple[str, ...]
    judged_image_id: str
    published_image_id: str
    policy: str
    verified_tiers: tuple[str, ...]
    verdict_ids: tuple[str, ...]
    reused: bool  # the immutable tag already named this image
    migrated: dict[str, str] | None = None
    attestation: dict[str, Any] | None = None  # digest, tag, key_id, predicate_types of the signed attestation


@dataclass(frozen=True)
class WheelPublication(Fact):
    """An env's verified wheel put on a package index, with requirement files that install it by hash.

    ``base_url`` is where the publication folder is served (its ``index.json``, the requirement files, and
    for a ``static`` index the index itself); ``index_url`` is the PEP 503 index pip reads the wheel from
    (the folder's own ``simple/``, or an index ``server`` with a login, never with credentials in it).
    ``files`` maps every file this fact names under ``base_url`` to its sha256; ``requirements`` and
    ``tests`` name, per Python, the production file (torch, its dependencies and the wheel) and the file of
    what only the kernel suite's CPU tier needs. ``publication`` is the sha256 of the folder's
    ``index.json``: a later publication to the same ``base_url`` replaces the folder, so only the facts of
    the latest one there still describe what is served."""

    kind: ClassVar[str] = "wheel-publication"
    wheel: str
    wheel_sha256: str
    index: str  # "static" | "server"
    index_url: str
    base_url: str
    publication: str
    files: dict[str, str]
    requirements: dict[str, str]
    tests: dict[str, str]
    policy: str
    verified_tiers: tuple[str, ...]
    verdict_ids: tuple[str, ...]
    attestation: dict[str, Any] | None = None  # path, sha256, key_id, predicate_types of the signed statement

    def url(self, path: str) -> str:
        return self.base_url + path


@dataclass(frozen=True)
class DeviceCodeFact(Fact):
    """The device code of a build's wheel (:mod:`flashkit.evidence.devicecode`): every cubin and PTX payload
    per extension, and their digest. Content-addressed twice: the fact by its id, the code by ``digest``,
    which reading recomputes from ``extensions`` (an edited listing no longer matches)."""

    kind: ClassVar[str] = "device-code"
    artifact_id: str  # the build whose exported wheel was read
    wheel: str
    wheel_sha256: str
    digest: str
    extensions: dict[str, list[dict[str, Any]]]
    toolchain: dict[str, str] = field(default_factory=dict)  # what made the code: compiler, flags source
    extracted_on: str = "build-host"  # "build-host" | "gpu-host"

    def summary(self) -> str:
        return devicecode.DeviceCode.summary_of(self.extensions)


KINDS: dict[str, type[Fact]] = {
    c.kind: c for c in (Artifact, VerdictFact, Applies, Publication, DeviceCodeFact, WheelPublication)
}
RELATION_DEVICE_CODE = "device-code"
# Not a field value: the gate's name for an applies (relation None) that carries this env's artifact-gpu
# verdict on the very wheel from another input hash (flashkit.ledger.gate).
RELATION_SAME_WHEEL = "same-wheel"


def _plain(value: Any) -> Any:
    """JSON-ready data: tuples become lists, enums their plain string."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, str) else value


def where_it_ran(host: dict[str, str]) -> str:
    """Where a verdict ran, from its host facts: the GPU, torch and CUDA when they are named, and the host."""
    parts = []
    if host.get("gpu"):
        parts.append(host["gpu"] + (f" (compute capability {host['capability']})" if host.get("capability") else ""))
    if host.get("torch"):
        parts.append(f"torch {host['torch']}")
    if host.get("torch_cuda"):
        parts.append(f"CUDA {host['torch_cuda']}")
    if host.get("cuda_runtime"):
        parts.append(f"the extension on CUDA runtime {host['cuda_runtime']}")
    if host.get("driver"):
        parts.append(f"driver {host['driver']}")
    if host.get("hostname"):
        parts.append(f"host {host['hostname']}")
    return ", ".join(parts) or "a host the verdict does not describe"


# -- semantic checks a JSON Schema cannot express ---------------------------------------------------------
def counts_support_pass(tier: Tier, counts: dict[str, int]) -> str | None:
    """Why ``counts`` cannot back a "passed" verdict of ``tier`` (None when they can)."""
    if tier.runs_a_suite:
        tests, passed = counts.get("tests", 0), counts.get("passed", 0)
        failed, errors, skipped = counts.get("failed", 0), counts.get("errors", 0), counts.get("skipped", 0)
        if tests <= 0 or passed <= 0:
            return f"'passed' with {passed} passed of {tests} tests: nothing was verified"
        if failed or errors:
            return f"'passed' with {failed} failed and {errors} errors"
        if passed + skipped + failed + errors != tests:
            return f"counts do not add up: {passed} passed + {skipped} skipped != {tests} tests"
        return None
    checked, failed = counts.get("checked", 0), counts.get("failed", 0)
    if checked <= 0:
        return "'passed' with nothing checked"
    if failed:
        return f"'passed' with {failed} failed checks"
    return None


def semantic_problem(fact: Fact) -> str | None:
    """What is wrong with a well-formed fact beyond its schema (None when nothing is). A text that does not
    start with "field " is about the verdict and its counts."""
    if isinstance(fact, VerdictFact):
        if fact.subject.kind is not fact.tier.subject:
            return f"tier {fact.tier} judges a {fact.tier.subject}, but this verdict names a {fact.subject.kind}"
        if fact.passed:
            return counts_support_pass(fact.tier, fact.counts)
    if isinstance(fact, Applies):
        if fact.subject.kind is not fact.tier.subject:
            return f"tier {fact.tier} judges a {fact.tier.subject}, but this names a {fact.subject.kind}"
        if (fact.relation is None) != (fact.device_code is None):
            return "field relation: a device-code relation names its digest in device_code, and only it does"
        if fact.relation is not None and (fact.source_env is None or fact.tier is not Tier.ARTIFACT_GPU):
            return "field relation: a device-code relation carries another env's artifact-gpu verdict (source_env)"
        if fact.source_env is not None:
            return cross_env_problem(fact)
    if isinstance(fact, DeviceCodeFact):
        try:
            recomputed = devicecode.digest_of(fact.extensions)
        except (TypeError, ValueError) as exc:
            return f"field extensions: not a device-code listing ({exc})"
        if recomputed != fact.digest:
            return f"field digest: {fact.digest} is not the digest of the listed payloads ({recomputed})"
    if isinstance(fact, WheelPublication):
        return wheel_publication_problem(fact)
    if isinstance(fact, Artifact):
        return artifact_problem(fact)
    return None


def artifact_problem(fact: Artifact) -> str | None:
    """What is wrong with a build fact beyond its schema (None when nothing is)."""
    if fact.wheel_from is not None and fact.wheel_from.get("env") == fact.env:
        return f"field wheel_from.env: names this env itself ({fact.env}); a build's own wheel has no wheel_from"
    # flashkit names every image it builds <namespace>/<env>:<tag>: a build line moved to another env's ledger
    # (its env changed, its id recomputed) still names the env it was built for.
    repository = fact.image_ref.rpartition(":")[0] if ":" in fact.image_ref.rpartition("/")[2] else fact.image_ref
    if repository.rpartition("/")[2] != fact.env:
        return f"field image_ref: {fact.image_ref} is not an image of {fact.env} (<namespace>/{fact.env}:<tag>)"
    return None


def wheel_publication_problem(fact: WheelPublication) -> str | None:
    """What a schema cannot say of a wheel publication: its files stay under its folder, and every
    requirement file it names is one of its files."""
    for path in fact.files:
        if path.startswith("/") or ".." in path.split("/"):
            return f"field files: {path!r} is not a path inside the publication folder"
    for field_name, named in (("requirements", fact.requirements), ("tests", fact.tests)):
        for python, path in named.items():
            if path not in fact.files:
                return f"field {field_name}.{python}: {path!r} is not one of the publication's files"
    if fact.attestation is not None and fact.attestation.get("path") not in fact.files:
        return "field attestation.path: not one of the publication's files"
    return None


def cross_env_problem(fact: Applies) -> str | None:
    """Why an applies naming another env's verdict cannot hold whatever that ledger says (None: it can)."""
    if fact.source_env == fact.env:
        return f"field source_env: names this env itself ({fact.env}); a verdict of this ledger has no source_env"
    if fact.tier.subject is not Subject.WHEEL:
        # The image is this env's own: its tiers are judged here, never inherited from another env.
        return f"field tier: {fact.tier} judges this env's own image; only wheel tiers apply from another env"
    return None


def from_body(body: dict[str, Any]) -> Fact:
    """The typed fact of a schema-valid body (the schema has been checked by the caller)."""
    cls = KINDS[body["kind"]]
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in body.items() if k in names}
    if "subject" in values:
        values["subject"] = SubjectRef(Subject(values["subject"]["kind"]), values["subject"]["digest"])
    if "tier" in values:
        values["tier"] = Tier(values["tier"])
    if "verdict" in values:
        values["verdict"] = Verdict(values["verdict"])
    if isinstance(values.get("attestation"), dict) and "predicate_types" in values["attestation"]:
        values["attestation"] = {
            **values["attestation"],
            "predicate_types": tuple(values["attestation"]["predicate_types"]),
        }
    for name in ("reasons", "tags", "verified_tiers", "verdict_ids", "runtime_layers"):
        if name in values:
            values[name] = tuple(values[name])
    return cls(**values)
