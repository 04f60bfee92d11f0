"""Turning builds and tier outcomes into ledger facts, and appending them.

A build appends an ``artifact`` (unless the ledger already holds the same build: a re-run adds no
artifact); every tier run appends a ``verdict`` bound to the digest its tier judges. After each append,
every earlier verdict whose digest a newer artifact also holds (a bit-identical wheel from a rebuild on
another host) gets an ``applies`` fact that names both and says why, so that inheritance is recorded,
not implied.
"""

from __future__ import annotations

from pathlib import Path

from flashkit.core.atomic import utc_now
from flashkit.core.names import Tier, Verdict
from flashkit.images.build import BuildResult
from flashkit.images.tiers import TierOutcome
from flashkit.ledger import store
from flashkit.ledger.model import Applies, Artifact, Fact, VerdictFact
from flashkit.ledger.store import Ledger

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
    """An ``applies`` fact for every (verdict, later artifact) pair that shares the judged digest."""
    done = {(a.verdict_id, a.artifact_id) for a in ledger.applies()}
    out = []
    for v in ledger.verdicts():
        for art in ledger.artifacts(v.input_hash):
            if art.subject(v.tier.subject) != v.subject or v.context.get("image_id") in (None, art.image_id):
                continue
            if (v.id, art.id) in done:
                continue
            what = "wheel" if v.tier.subject.value == "wheel" else "image"
            out.append(
                Applies(
                    env=v.env,
                    input_hash=v.input_hash,
                    date=max(v.date, art.date),
                    tier=v.tier,
                    verdict_id=v.id,
                    artifact_id=art.id,
                    subject=v.subject,
                    because=(
                        f"the {what} of build {art.id[7:19]} ({art.date}) is bit-identical ({v.subject.digest}) "
                        f"to the {what} this {v.tier} verdict judged in image {v.context.get('image_id', '?')[7:19]}"
                    ),
                )
            )
    return out


def append_with_applies(root: Path, env: str, facts: list[Fact]) -> tuple[Ledger, list[Fact]]:
    ledger, added = store.append(root, env, facts)
    extra = missing_applies(ledger)
    if extra:
        ledger, more = store.append(root, env, extra)
        added += more
    return ledger, added


def record_build(root: Path, res: BuildResult) -> tuple[Ledger, Artifact, list[Fact]]:
    """Append the build's artifact (once per distinct build) and the applies facts it brings."""
    art = artifact_of(res)
    current = store.load(root, res.env)
    same = next((a for a in current.artifacts(res.input_hash) if a.same_build(art)), None)
    if same is not None:
        return current, same, []
    ledger, added = append_with_applies(root, res.env, [art])
    return ledger, art, added


def record_outcomes(root: Path, artifact: Artifact, outcomes: list[TierOutcome]) -> tuple[Ledger, list[Fact]]:
    return append_with_applies(root, artifact.env, [verdict_of(o, artifact) for o in outcomes])


def not_passed(outcomes: list[TierOutcome], required: tuple[Tier, ...]) -> list[TierOutcome]:
    """The outcomes of ``required`` tiers that did not pass."""
    return [o for o in outcomes if o.tier in required and o.verdict is not Verdict.PASSED]
