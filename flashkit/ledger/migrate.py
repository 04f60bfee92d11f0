"""Migrating records of the first format (``verified/<env>.json``, schema 1) into the ledger.

Nothing is lost: every entry becomes an ``artifact`` fact, every tier result a ``verdict`` bound to the
digest its tier judges (the wheel for build and artifact-gpu, the runtime image for the others), every
publication a ``publication`` fact, each with its original date and a ``migrated`` note naming the
file and entry it came from. The original file is moved, byte for byte, to
``verified/schema1/<env>.json`` (git sees a rename, not a deletion), and
:func:`lost_in_migration` proves the ledger holds everything it held.

Schema 1 entries checked less than the ledger does at read time: a migrated verdict that would not pass
today's checks ("passed" with nothing counted) is kept as its own verdict with ``error`` and the reason,
never as "passed".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flashkit.core import safeio
from flashkit.core.errors import RecordError
from flashkit.core.names import Tier, Verdict
from flashkit.ledger import store
from flashkit.ledger.model import (
    Artifact,
    Fact,
    Publication,
    VerdictFact,
    counts_support_pass,
    image_subject,
    wheel_subject,
)
from flashkit.ledger.record import missing_applies, tidy_reasons
from flashkit.ledger.store import Ledger

ARCHIVE = "schema1"


def _artifact(env: str, h: str, entry: dict[str, Any], origin: dict[str, str]) -> Artifact:
    art = entry["artifact"]
    dates = [t.get("date", "") for t in entry.get("tiers", {}).values()] + [entry.get("updated", "")]
    return Artifact(
        env=env,
        input_hash=h,
        date=min(d for d in dates if d),
        image_id=art["image_id"],
        image_ref=art["image_ref"],
        runtime_size=art["runtime_size"],
        builder_id=art["builder_id"],
        builder_size=art["builder_size"],
        base_image_id=art.get("base_image_id"),
        wheel=art["wheel"],
        wheel_sha256=art["wheel_sha256"],
        lock_sha256=art["lock_sha256"],
        build_context={k: v for k, v in (art.get("build_context") or {}).items() if isinstance(v, str | bool)},
        migrated=origin,
    )


def _verdict(env: str, h: str, art: Artifact, t: dict[str, Any], origin: dict[str, str]) -> VerdictFact:
    tier = Tier(t["tier"])
    verdict = Verdict(t["verdict"])
    reasons = list(t.get("reasons", ()))
    counts = {k: int(v) for k, v in (t.get("counts") or {}).items()}
    if verdict is Verdict.PASSED and counts_support_pass(tier, counts):
        reasons.append(f"migrated as error: schema 1 recorded 'passed', but {counts_support_pass(tier, counts)}")
        verdict = Verdict.ERROR
    judged = t.get("judged") or {}
    subject = (
        image_subject(judged.get("image_id", art.image_id))
        if tier.subject.value == "image"
        else wheel_subject(judged.get("wheel_sha256", art.wheel_sha256))
    )
    return VerdictFact(
        env=env,
        input_hash=h,
        date=t.get("date") or art.date,
        tier=tier,
        verdict=verdict,
        subject=subject,
        counts=counts,
        reasons=tidy_reasons(reasons),
        duration_s=float(t.get("duration_s", 0.0)),
        host={k: str(v) for k, v in (t.get("host") or {}).items()},
        source="migrated",
        context={"image_id": art.image_id, "wheel_sha256": art.wheel_sha256},
        migrated=origin,
    )


def _publications(env: str, h: str, entry: dict[str, Any], verdicts: list[VerdictFact], origin) -> list[Publication]:
    out = []
    for target, pub in sorted((entry["artifact"].get("published") or {}).items()):
        tiers = tuple(pub.get("verified_tiers", ()))
        out.append(
            Publication(
                env=env,
                input_hash=h,
                date=pub["date"],
                target=pub.get("target", target),
                digest=pub["digest"],
                tags=tuple(pub["tags"]),
                judged_image_id=pub["judged_image_id"],
                published_image_id=pub["published_image_id"],
                policy=pub["policy"],
                verified_tiers=tiers,
                verdict_ids=tuple(v.id for v in verdicts if v.tier.value in tiers and v.passed),
                reused=bool(pub.get("reused", False)),
                migrated=origin,
            )
        )
    return out


def facts_of(env: str, data: dict[str, Any], source: str) -> list[Fact]:
    """The ledger facts equivalent to one schema-1 record."""
    if data.get("schema") != 1 or not isinstance(data.get("entries"), dict):
        raise RecordError(f"{source}: not a schema-1 record (no schema 1, no entries)")
    odd = next((h for h, entry in data["entries"].items() if not isinstance(entry, dict)), None)
    if odd is not None:
        raise RecordError(f"{source}: entry {odd[:80]}: not an object, so not a schema-1 entry")
    facts: list[Fact] = []
    for h, entry in sorted(data["entries"].items(), key=lambda kv: str(kv[1].get("updated", ""))):
        origin = {"from": source, "entry": h}
        try:
            art = _artifact(env, h, entry, origin)
            verdicts = [_verdict(env, h, art, t, origin) for _name, t in sorted(entry.get("tiers", {}).items())]
            pubs = _publications(env, h, entry, verdicts, origin)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"{source}: entry {h}: cannot be migrated: {type(exc).__name__} {exc}") from None
        facts += [art, *verdicts, *pubs]
    return facts


def lost_in_migration(data: dict[str, Any], ledger: Ledger) -> list[str]:
    """Every input hash, image, wheel, tier verdict and publication of ``data`` missing from ``ledger``."""
    lost = []
    for h, entry in data["entries"].items():
        arts = [a for a in ledger.artifacts(h) if a.image_id == entry["artifact"]["image_id"]]
        if not arts or arts[0].wheel_sha256 != entry["artifact"]["wheel_sha256"]:
            lost.append(f"{h}: artifact")
            continue
        for name, t in entry.get("tiers", {}).items():
            dated = [
                v
                for v in ledger.verdicts(h)
                if v.tier == name and v.date == t.get("date") and v.counts == t.get("counts", {})
            ]
            if not dated:
                lost.append(f"{h}: tier {name}")
        for target, pub in (entry["artifact"].get("published") or {}).items():
            if not any(
                p.digest == pub["digest"] and p.target == pub.get("target", target) for p in ledger.publications(h)
            ):
                lost.append(f"{h}: publication to {target}")
    return lost


def migrate_env(root: Path, env: str) -> tuple[int, Path]:
    """Convert ``verified/<env>.json`` into the ledger and archive it; returns (facts added, archive)."""
    legacy = store.legacy_path(root, env)
    shown = safeio.describe(legacy, root)
    data = safeio.read_json(
        legacy,
        what="schema-1 record",
        error=RecordError,
        max_bytes=store.MAX_LEDGER_BYTES,
        root=root,
        hint="restore it from git",
    )
    if not isinstance(data, dict):
        raise RecordError(f"{shown}: a record is a JSON object, not {type(data).__name__}")
    archive = Path(root) / store.DIR / ARCHIVE / f"{env}.json"
    origin = f"{store.DIR}/{ARCHIVE}/{env}.json"
    facts = facts_of(env, data, origin)
    if os.path.lexists(archive):  # the original an earlier migration kept: evidence, never replaced
        raise RecordError(
            f"{shown}: {safeio.describe(archive, root)} already holds the schema-1 original of an earlier "
            "migration; migrating this file would replace it",
            hint=f"compare the two: if they are the same record, remove {shown} (its facts are in the ledger already)",
        )
    archive.parent.mkdir(parents=True, exist_ok=True)
    os.replace(legacy, archive)  # before appending: store.load refuses while the schema-1 file is in place
    try:
        ledger, added = store.append(root, env, facts)
        ledger, more = store.append(root, env, missing_applies(ledger))
    except BaseException:
        os.replace(archive, legacy)
        raise
    lost = lost_in_migration(data, ledger)
    if lost:
        raise RecordError(f"{shown}: migration would lose {', '.join(lost)}; the ledger was written, check it")
    return len(added) + len(more), archive
