"""Turning builds and tier outcomes into ledger facts, and appending them.

A build appends an ``artifact`` (unless the ledger already holds the same build: a re-run adds no
artifact); every tier run appends a ``verdict`` bound to the digest its tier judges. After each append,
every earlier verdict whose digest a newer artifact also holds (a bit-identical wheel from a rebuild on
another host) gets an ``applies`` fact that names both and says why, so that inheritance is recorded,
not implied.

Across envs: a wheel built on torch's stable C ABI loads on every torch >= 2.10 of its CUDA
major, so an env may install the wheel another env built instead of compiling its own (its artifact's
``wheel_from``). Its build then inherits the source env's wheel verdicts (build, artifact-gpu) on that
very sha256, each as an ``applies`` with ``source_env`` in the consumer's own ledger; image verdicts
never cross envs, the consumer's image is judged in its own right. Both orders are covered: a consumer's
build inherits the verdicts its source has (:func:`inherited_applies`, on every append to the consumer),
and a wheel verdict appended to a source later reaches every consumer ledger that names it
(:func:`propagate`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from flashkit.core.atomic import utc_now, write_text_atomic
from flashkit.core.errors import FlashkitError
from flashkit.core.names import Subject, Tier, Verdict
from flashkit.evidence import devicecode
from flashkit.images.build import BuildResult
from flashkit.ledger import store
from flashkit.ledger.model import (
    RELATION_DEVICE_CODE,
    Applies,
    Artifact,
    DeviceCodeFact,
    Fact,
    VerdictFact,
    source_subject,
    where_it_ran,
)
from flashkit.ledger.store import Ledger
from flashkit.plan.envid import EnvId
from flashkit.verify.tiers import TierOutcome

MAX_REASONS = 200
MAX_REASON_CHARS = 4000


def artifact_of(res: BuildResult) -> Artifact:
    """The identity a build adds to the ledger: ids and digests, no host paths."""
    return Artifact(
        env=res.env,
        input_hash=res.input_hash,
        date=res.date,
        image_id=res.runtime_id,
        image_ref=res.runtime_ref,
        runtime_size=res.runtime_size,
        builder_id=res.builder_id,
        builder_size=res.builder_size,
        base_image_id=res.base_image_id,
        wheel=Path(res.wheel_path).name,
        wheel_sha256=res.wheel_sha256,
        lock_sha256=res.lock_sha256,
        build_context={k: v for k, v in res.context.items() if isinstance(v, str | bool)},
        runtime_base_id=res.runtime_base_id,
        builder=dict(res.builder) or None,
        wheel_from=dict(res.wheel_from) if res.wheel_from else None,
        runtime_layers=tuple(res.runtime_layers) if res.runtime_layers else None,
    )


def tidy_reasons(reasons: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Reasons as the ledger stores them: one line each (control characters shown, not kept), bounded."""
    out = []
    for r in list(reasons)[:MAX_REASONS]:
        text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in str(r).replace("\n", " | "))
        out.append(text[:MAX_REASON_CHARS])
    return tuple(out)


def verdict_of(outcome: TierOutcome, artifact: Artifact, *, source: str = "build-host") -> VerdictFact:
    return VerdictFact(
        env=artifact.env,
        input_hash=artifact.input_hash,
        date=utc_now(),
        tier=outcome.tier,
        verdict=outcome.verdict,
        subject=artifact.subject(outcome.tier.subject),
        counts=dict(outcome.counts),
        reasons=tidy_reasons(outcome.reasons),
        duration_s=outcome.duration_s,
        host={k: tidy_reasons([v])[0][:200] for k, v in outcome.host.items()},
        source=source,
        context={"image_id": artifact.image_id, "wheel_sha256": artifact.wheel_sha256},
    )


def missing_applies(ledger: Ledger) -> list[Applies]:
    """An ``applies`` fact for every (verdict, later artifact) pair that shares the judged digest: a build at
    the verdict's input hash in another image, and, for artifact-gpu, a build at any input hash of this env
    whose wheel is the very file judged (see :func:`same_wheel_because`)."""
    done = {(a.verdict_id, a.artifact_id) for a in ledger.applies()}
    out = []
    for v in ledger.verdicts():
        if v.tier.subject is Subject.SOURCE:
            continue  # judged at its input hash, whichever build: nothing to carry to a later build
        arts = ledger.artifacts() if v.tier is Tier.ARTIFACT_GPU else ledger.artifacts(v.input_hash)
        for art in arts:
            if art.subject(v.tier.subject) != v.subject or (v.id, art.id) in done:
                continue
            if art.input_hash != v.input_hash:
                out.append(_applies(v, art, same_wheel_because(art, v)))
                continue
            if v.context.get("image_id") in (None, art.image_id):
                continue
            what = "wheel" if v.tier.subject.value == "wheel" else "image"
            because = (
                f"the {what} of build {art.id[7:19]} ({art.date}) is bit-identical ({v.subject.digest}) "
                f"to the {what} this {v.tier} verdict judged in image {v.context.get('image_id', '?')[7:19]}"
            )
            out.append(_applies(v, art, because))
    return out


def same_wheel_because(art: Artifact, v: VerdictFact) -> str:
    """Why an artifact-gpu verdict at another input hash of this env holds for ``art``, and what it leaves out.

    The artifact-gpu tier judges a wheel file on a GPU host, under that host's torch, whatever image the
    wheel came out of: when an edit that leaves the wheel alone (the runtime stage, a runtime lock) moves
    the input hash, the file judged is still this build's file, byte for byte. The new image's torch
    binding is judged by its own build, abi and cpu tiers, which the gate requires before this counts."""
    return (
        f"the wheel sha256:{art.wheel_sha256} of build {art.id[7:19]} at input hash {art.input_hash[:20]}… is "
        f"the very file (bit-identical) that this env's {v.tier} verdict {v.id[7:19]} judged at input hash "
        f"{v.input_hash[:20]}… on {where_it_ran(v.host)}; the input hash moved and the wheel did not. It counts "
        f"once this build's own build, abi and cpu tiers passed"
    )


def _applies(v: VerdictFact, art: Artifact, because: str, source_env: str | None = None) -> Applies:
    """The fact that verdict ``v`` holds for build ``art`` (recorded in ``art``'s env, at its input hash)."""
    return Applies(
        env=art.env,
        input_hash=art.input_hash,
        date=max(v.date, art.date),
        tier=v.tier,
        verdict_id=v.id,
        artifact_id=art.id,
        subject=v.subject,
        because=because,
        source_env=source_env,
    )


def cross_env_because(art: Artifact, v: VerdictFact) -> str:
    """Why ``v`` (a wheel verdict of another env) holds for ``art``, without claiming it ran in ``art``'s env."""
    src = art.wheel_from or {}
    at = (
        "" if v.input_hash == src.get("input_hash") else f" (recorded at its input hash {v.input_hash}: the same bytes)"
    )
    return (
        f"the wheel sha256:{art.wheel_sha256} of this build is the file {src.get('env')}@{src.get('input_hash')} "
        f"built (wheel_from); a stable-ABI wheel is the same artifact under every torch >= 2.10 of its CUDA major, "
        f"so that env's {v.tier} verdict {v.id[7:19]}{at} on it applies here; the {v.tier} ran in {v.env} on "
        f"{where_it_ran(v.host)}, not in this env"
    )


def inherited_applies(root: Path, ledger: Ledger) -> list[Applies]:
    """A cross-env ``applies`` for every (artifact with ``wheel_from``, wheel verdict of its source env on
    exactly its wheel sha256) pair the ledger does not record yet. The source's verdicts at any of its input
    hashes count, since the digest is what was judged; those at the input hash ``wheel_from`` names come
    first. A source env with no ledger here gives none (nothing is claimed until its verdicts are)."""
    done = {(a.verdict_id, a.artifact_id) for a in ledger.applies()}
    sources: dict[str, Ledger] = {}
    out = []
    for art in ledger.artifacts():
        if not art.wheel_from:
            continue
        src = art.wheel_from["env"]
        if src not in sources:
            sources[src] = store.load_own(root, src)
        subject = art.subject(Subject.WHEEL)
        found = [v for v in sources[src].verdicts() if v.tier.subject is Subject.WHEEL and v.subject == subject]
        found.sort(key=lambda v: v.input_hash != art.wheel_from["input_hash"])  # stable: append order kept
        for v in found:
            if (v.id, art.id) in done:
                continue
            done.add((v.id, art.id))
            out.append(_applies(v, art, cross_env_because(art, v), source_env=src))
    return out


def env_ledgers(root: Path) -> list[str]:
    """The envs with a ledger (files in verified/ whose name is not an env id are not ledgers)."""
    out = []
    for env in store.ledger_envs(root):
        try:
            EnvId.parse(env)
        except FlashkitError:
            continue
        out.append(env)
    return out


def consumers(root: Path, source_env: str) -> list[Ledger]:
    """The ledgers of the other envs with a build that installs a wheel of ``source_env`` (``wheel_from``)."""
    out = []
    for env in env_ledgers(root):
        # Only ledgers that can name it are read (facts are written as canonical JSON): an unrelated env's
        # ledger neither slows nor breaks recording a verdict here.
        text = store.raw_text(root, env) or ""
        if env == source_env or "wheel_from" not in text or f'"{source_env}"' not in text:
            continue
        ledger = store.load(root, env)
        if any(a.wheel_from and a.wheel_from["env"] == source_env for a in ledger.artifacts()):
            out.append(ledger)
    return out


def propagate(root: Path, source_env: str, added: list[Fact]) -> dict[str, list[Fact]]:
    """After ``added`` was appended to ``source_env``: the cross-env applies its wheel verdicts bring to the
    envs whose builds install that very wheel, appended to their ledgers (by env; only what was new)."""
    wheels = {f.subject for f in added if isinstance(f, VerdictFact) and f.tier.subject is Subject.WHEEL}
    if not wheels:
        return {}
    out: dict[str, list[Fact]] = {}
    for ledger in consumers(root, source_env):
        extra = [a for a in inherited_applies(root, ledger) if a.source_env == source_env and a.subject in wheels]
        if extra:
            _ledger, more = store.append(root, ledger.env, extra)
            if more:
                out[ledger.env] = more
    return out


def applied_elsewhere(root: Path, verdict: VerdictFact) -> list[Applies]:
    """The cross-env applies that name ``verdict`` in the ledgers of the envs that install its wheel."""
    return [
        a
        for ledger in consumers(root, verdict.env)
        for a in ledger.applies()
        if a.source_env == verdict.env and a.verdict_id == verdict.id
    ]


def append_with_applies(root: Path, env: str, facts: list[Fact]) -> tuple[Ledger, list[Fact]]:
    """Append ``facts`` and the applies they bring: within the env (a bit-identical digest), inherited by it
    (its build installs another env's wheel), carried by identical device code, and, for new wheel verdicts
    or device code, to the other envs they reach (see :func:`propagate`). Returns this env's ledger and what
    was added to it."""
    ledger, added = store.append(root, env, facts)
    extra = missing_applies(ledger) + inherited_applies(root, ledger) + device_code_applies(root, ledger)
    if extra:
        ledger, more = store.append(root, env, extra)
        added += more
    propagate(root, env, added)
    propagate_device_code(root, env, ledger, added)
    return ledger, added


# -- device code -------------------------------------------------------------------------------------------
def device_code_fact(
    art: Artifact, code: devicecode.DeviceCode, toolchain: dict[str, str], *, extracted_on: str = "build-host"
) -> DeviceCodeFact:
    return DeviceCodeFact(
        env=art.env,
        input_hash=art.input_hash,
        date=utc_now(),
        artifact_id=art.id,
        wheel=art.wheel,
        wheel_sha256=art.wheel_sha256,
        digest=code.digest,
        extensions=code.as_json(),
        toolchain=toolchain,
        extracted_on=extracted_on,
    )


def record_device_code(
    root: Path, art: Artifact, code: devicecode.DeviceCode, toolchain: dict[str, str]
) -> tuple[Ledger, list[Fact]]:
    """Append the device code of ``art``'s wheel (once per wheel) and the relations it brings either way."""
    current = store.load(root, art.env)
    if current.device_code_of(art.wheel_sha256) == code.digest:
        return current, []
    return append_with_applies(root, art.env, [device_code_fact(art, code, toolchain)])


def accepts_device_code(root: Path, env: str) -> bool:
    """Does ``env``'s spec let GPU verdicts reach it through identical device code (``gpu_evidence``)?"""
    from flashkit.plan.specfile import load_env

    try:
        return "device-code" in load_env(root, env).gpu_evidence
    except FlashkitError:
        return False  # no spec (a removed env), or one that does not read: nothing is claimed for it


def device_code_because(art: Artifact, digest: str, v: VerdictFact) -> str:
    """Why ``v`` (another env's artifact-gpu on another wheel) holds for ``art``, and what it does not cover."""
    return (
        f"the wheel sha256:{art.wheel_sha256} of this build carries device code {digest}: the same cubins and PTX, "
        f"byte for byte, as the wheel {v.subject.digest} that {v.env}'s {v.tier} verdict {v.id[7:19]} judged; it "
        f"ran in {v.env} on {where_it_ran(v.host)}, not in this env. It covers the GPU code only: this env's torch "
        f"binding (host code) is judged by its own build, abi and cpu tiers"
    )


def ledgers_naming(root: Path, digests: set[str], skip: str | None = None) -> list[Ledger]:
    """The envs' ledgers (their own facts; ``skip``'s left out) that name one of ``digests`` as device code,
    in a device-code fact or a device-code relation."""
    out = []
    for env in env_ledgers(root):
        if env == skip:
            continue
        text = store.raw_text(root, env) or ""
        if '"device-code"' in text and any(d in text for d in digests):
            out.append(store.load_own(root, env))
    return out


def device_code_applies(root: Path, ledger: Ledger) -> list[Applies]:
    """A device-code ``applies`` for every (build here, another env's own artifact-gpu verdict) pair whose
    wheels carry the same recorded device code, when this env's spec accepts such evidence."""
    mine = {a.id: ledger.device_code_of(a.wheel_sha256) for a in ledger.artifacts()}
    digests = {d for d in mine.values() if d}
    if not digests or not accepts_device_code(root, ledger.env):
        return []
    done = {(a.verdict_id, a.artifact_id) for a in ledger.applies()}
    out = []
    for other in ledgers_naming(root, digests, ledger.env):
        for v in other.verdicts():
            if v.tier is not Tier.ARTIFACT_GPU:
                continue
            code = other.device_code_of(v.subject.digest.removeprefix("sha256:"))
            for art in ledger.artifacts():
                if code is None or mine[art.id] != code or (v.id, art.id) in done:
                    continue
                done.add((v.id, art.id))
                applies = _applies(v, art, device_code_because(art, code, v), source_env=other.env)
                out.append(dataclasses.replace(applies, relation=RELATION_DEVICE_CODE, device_code=code))
    return out


def propagate_device_code(root: Path, env: str, ledger: Ledger, added: list[Fact]) -> dict[str, list[Fact]]:
    """After ``added`` reached ``env``: the device-code relations it brings to the other envs (a new GPU verdict
    on a wheel whose device code they share, or new device code that matches a verdict's), by env."""
    digests = {f.digest for f in added if isinstance(f, DeviceCodeFact)}
    for f in added:
        if isinstance(f, VerdictFact) and f.tier is Tier.ARTIFACT_GPU:
            code = ledger.device_code_of(f.subject.digest.removeprefix("sha256:"))
            if code:
                digests.add(code)
    out: dict[str, list[Fact]] = {}
    if not digests:
        return out
    for other in ledgers_naming(root, digests, env):
        extra = device_code_applies(root, other)  # its own facts are all this reads: no second load
        if extra:
            more = store.append(root, other.env, extra)[1]
            if more:
                out[other.env] = more
    return out


def record_build(root: Path, res: BuildResult) -> tuple[Ledger, Artifact, list[Fact]]:
    """Append the build's artifact (once per distinct build) and the applies facts it brings, among them,
    for a build with ``wheel_from``, the source env's wheel verdicts on that wheel."""
    art = artifact_of(res)
    current = store.load(root, res.env)
    same = next((a for a in current.artifacts(res.input_hash) if a.same_build(art)), None)
    if same is not None:
        # A re-run adds no artifact, but may find source verdicts that reached this checkout without
        # passing through it (a `git pull` of the source's ledger): they are recorded now.
        inherited = inherited_applies(root, current)
        if not inherited:
            return current, same, []
        ledger, added = store.append(root, res.env, inherited)
        return ledger, same, added
    ledger, added = append_with_applies(root, res.env, [art])
    return ledger, art, added


def record_outcomes(root: Path, artifact: Artifact, outcomes: list[TierOutcome]) -> tuple[Ledger, list[Fact]]:
    return append_with_applies(root, artifact.env, [verdict_of(o, artifact) for o in outcomes])


EVIDENCE_DIR = "evidence"


def evidence_path(root: Path, sha256_hex: str) -> Path:
    """Where a verdict's evidence file lives, named by its own sha256 (so it is checked, never replaced)."""
    return Path(root) / store.DIR / EVIDENCE_DIR / f"{sha256_hex}.json"


def record_source_verdict(
    root: Path,
    env: str,
    input_hash: str,
    sources_sha256: str,
    outcome: TierOutcome,
    report: bytes,
    context: dict[str, str],
) -> tuple[Ledger, VerdictFact, Path]:
    """Append a source tier's verdict (it judged the kernel sources at ``input_hash``, no build) and keep
    its report beside the ledger, content-addressed: the verdict names the report by sha256."""
    sha = hashlib.sha256(report).hexdigest()
    path = evidence_path(root, sha)
    if not path.is_file():
        write_text_atomic(path, report.decode("utf-8"))
    fact = VerdictFact(
        env=env,
        input_hash=input_hash,
        date=utc_now(),
        tier=outcome.tier,
        verdict=outcome.verdict,
        subject=source_subject(sources_sha256),
        counts=dict(outcome.counts),
        reasons=tidy_reasons(outcome.reasons),
        duration_s=outcome.duration_s,
        host={k: tidy_reasons([v])[0][:200] for k, v in outcome.host.items()},
        source="build-host",
        context={k: tidy_reasons([v])[0][:200] for k, v in context.items()},
        evidence={"report_sha256": sha},
    )  # fmt: skip
    ledger, _added = store.append(root, env, [fact])
    return ledger, fact, path


def not_passed(outcomes: list[TierOutcome], required: tuple[Tier, ...]) -> list[TierOutcome]:
    """The outcomes of ``required`` tiers that did not pass."""
    return [o for o in outcomes if o.tier in required and o.verdict is not Verdict.PASSED]
