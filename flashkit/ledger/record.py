"""Verification records: what was checked, on which artifact, with what result.

One JSON file per env under ``verified/<env>.json``, keyed by input hash. An
entry names the artifact it judged (image id, wheel sha256, lock hash) and the
result of every tier with counts, reasons, duration and host facts. A verdict
holds only for that exact artifact: ``is_verified`` refuses anything else, and
a tier that did not run is never counted as passed.

Files are written atomically (temp file + os.replace) so a crash never leaves
a half-written record that a publish step could misread.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flashkit.core.atomic import write_text_atomic
from flashkit.core.errors import RecordError

SCHEMA = 1
VERDICTS = ("passed", "failed", "not-run", "error")
DEFAULT_DIR = Path("verified")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as sorted, indented JSON, all or nothing."""
    write_text_atomic(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


@dataclasses.dataclass(frozen=True)
class TierResult:
    """One tier's verdict on one artifact."""

    tier: str
    verdict: str
    counts: dict[str, int]
    reasons: tuple[str, ...]
    duration_s: float
    # What was judged: {"image_id": ...} for in-image tiers, {"wheel_sha256": ...}
    # for artifact-gpu. is_verified compares these with the artifact at hand.
    judged: dict[str, str]
    host: dict[str, str] = dataclasses.field(default_factory=dict)
    date: str = dataclasses.field(default_factory=utc_now)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")
        if self.verdict == "passed" and not any(v > 0 for v in self.counts.values()) and not self.reasons:
            # A pass with nothing counted and nothing said is how "not run" sneaks in as "passed".
            raise ValueError(f"tier {self.tier}: 'passed' needs a positive count or a stated reason")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["reasons"] = list(self.reasons)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TierResult:
        return cls(
            tier=d["tier"],
            verdict=d["verdict"],
            counts=dict(d.get("counts", {})),
            reasons=tuple(d.get("reasons", ())),
            duration_s=float(d.get("duration_s", 0.0)),
            judged=dict(d.get("judged", {})),
            host=dict(d.get("host", {})),
            date=d.get("date", ""),
        )


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


def record_path(env_id: str, root: Path = Path(".")) -> Path:
    return root / DEFAULT_DIR / f"{env_id}.json"


def load(path: Path) -> dict[str, Any]:
    """The record at ``path``, or an empty one for a new env."""
    if not path.exists():
        return {"schema": SCHEMA, "env": path.stem, "entries": {}}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise RecordError(
            f"{path} is not valid JSON: {exc}", hint="restore it from git or delete it and rerun `flashkit test`"
        ) from exc
    if data.get("schema") != SCHEMA:
        raise RecordError(
            f"{path}: schema {data.get('schema')!r}, this flashkit reads schema {SCHEMA}",
            hint="rerun `flashkit test` to write a current record",
        )
    return data


def upsert_entry(path: Path, input_hash: str, artifact: dict[str, Any], tiers: Iterable[TierResult]) -> dict[str, Any]:
    """Record ``tiers`` for the artifact with ``input_hash``.

    If the stored entry names a different image or wheel, its tier results
    judged another artifact and are dropped, never carried over.
    """
    data = load(path)
    entries = data.setdefault("entries", {})
    entry = entries.get(input_hash)
    if entry is None or entry.get("artifact", {}).get("image_id") != artifact.get("image_id"):
        entry = {"input_hash": input_hash, "artifact": dict(artifact), "tiers": {}}
    else:
        entry["artifact"].update(artifact)
    for t in tiers:
        entry["tiers"][t.tier] = t.to_json()
    entry["updated"] = utc_now()
    entries[input_hash] = entry
    data["latest"] = input_hash
    write_json_atomic(path, data)
    return entry


def add_tier_result(path: Path, input_hash: str, result: TierResult) -> dict[str, Any]:
    """Attach one tier result (e.g. an imported artifact-gpu run) to an existing entry."""
    data = load(path)
    entry = data.get("entries", {}).get(input_hash)
    if entry is None:
        raise RecordError(
            f"{path} has no entry for input hash {input_hash}",
            hint="run `flashkit test <env>` first so the artifact is recorded",
        )
    wheel = entry["artifact"].get("wheel_sha256")
    judged_wheel = result.judged.get("wheel_sha256")
    if judged_wheel is not None and judged_wheel != wheel:
        raise RecordError(
            f"the result judged wheel sha256 {judged_wheel}, but {path} entry {input_hash} is for wheel {wheel}",
            hint="run the artifact check on the wheel exported by this build (see `flashkit build` output)",
        )
    entry["tiers"][result.tier] = result.to_json()
    entry["updated"] = utc_now()
    write_json_atomic(path, data)
    return entry


def is_verified(record: dict[str, Any], input_hash: str, image_id: str, required_tiers: Iterable[str]) -> Verdict:
    """Does ``record`` show every required tier passed for exactly this artifact?"""
    env = record.get("env", "?")
    entry = record.get("entries", {}).get(input_hash)
    if entry is None:
        known = ", ".join(sorted(record.get("entries", {}))) or "none"
        return Verdict(False, f"record for {env} has no entry for input hash {input_hash} (has: {known})")
    art = entry.get("artifact", {})
    if art.get("image_id") != image_id:
        return Verdict(False, f"record for {env}@{input_hash} judged image {art.get('image_id')}, not {image_id}")
    for name in required_tiers:
        t = entry.get("tiers", {}).get(name)
        if t is None:
            return Verdict(False, f"tier {name} has no result for {env}@{input_hash}; run it")
        if t.get("verdict") != "passed":
            why = "; ".join(t.get("reasons", [])) or "no reason recorded"
            return Verdict(False, f"tier {name} is {t.get('verdict')} for {env}@{input_hash}: {why}")
        judged = t.get("judged", {})
        if "image_id" in judged and judged["image_id"] != image_id:
            return Verdict(False, f"tier {name} judged image {judged['image_id']}, not {image_id}")
        if "wheel_sha256" in judged and judged["wheel_sha256"] != art.get("wheel_sha256"):
            return Verdict(
                False, f"tier {name} judged wheel {judged['wheel_sha256']}, not the recorded {art.get('wheel_sha256')}"
            )
    return Verdict(True, f"{env}@{input_hash}: {', '.join(required_tiers)} passed on image {image_id}")


TIER_ORDER = ("build", "abi", "cpu", "gpu", "artifact-gpu")


def status(repo_root: Path, env_id: str, input_hash: str) -> str:
    """One line for `flashkit matrix`: each tier's verdict for the env's current input hash."""
    data = load(record_path(env_id, Path(repo_root)))
    entry = data.get("entries", {}).get(input_hash)
    if entry is None:
        if data.get("entries"):
            return f"not verified (record is for {data.get('latest', '?')[:20]}, inputs changed since)"
        return "not verified"
    tiers = entry.get("tiers", {})
    names = [t for t in TIER_ORDER if t in tiers] + sorted(set(tiers) - set(TIER_ORDER))
    return " ".join(f"{t}:{tiers[t].get('verdict', '?')}" for t in names) or "not verified (no tier ran)"
