"""Verification records: a verdict holds only for the artifact it judged; not-run never passes."""

from __future__ import annotations

import json

import pytest

from flashkit.ledger import record
from flashkit.core.errors import RecordError
from flashkit.ledger.record import TierResult

IMG = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
WHEEL = "c" * 64


def tier(name: str, verdict: str = "passed", **kw) -> TierResult:
    counts = kw.pop("counts", {"passed": 3} if verdict == "passed" else {})
    return TierResult(
        tier=name,
        verdict=verdict,
        counts=counts,
        reasons=tuple(kw.pop("reasons", ())),
        duration_s=1.0,
        judged=kw.pop("judged", {"image_id": IMG}),
        **kw,
    )


def write(tmp_path, tiers, image=IMG):
    p = tmp_path / "verified" / "cu130-torch211.json"
    record.upsert_entry(p, "h1", {"image_id": image, "wheel_sha256": WHEEL}, tiers)
    return p, record.load(p)


def test_passed_with_nothing_counted_or_said_is_refused():
    with pytest.raises(ValueError, match="positive count or a stated reason"):
        TierResult(
            tier="cpu", verdict="passed", counts={"passed": 0}, reasons=(), duration_s=0, judged={"image_id": IMG}
        )


def test_unknown_verdict_is_refused():
    with pytest.raises(ValueError, match="not one of"):
        tier("cpu", verdict="ok")


def test_all_required_passed_on_this_image(tmp_path):
    _, rec = write(tmp_path, [tier("build"), tier("abi"), tier("cpu")])
    v = record.is_verified(rec, "h1", IMG, ["build", "abi", "cpu"])
    assert v.ok, v.reason


@pytest.mark.parametrize(
    ("tiers", "required", "needle"),
    [
        ([tier("build"), tier("abi")], ["build", "abi", "cpu"], "tier cpu has no result"),
        ([tier("gpu", "not-run", reasons=["no GPU"])], ["gpu"], "tier gpu is not-run"),
        ([tier("abi", "failed", reasons=["undefined symbol `c10::X()`"])], ["abi"], "c10::X()"),
        ([tier("cpu", "error", reasons=["no report"])], ["cpu"], "tier cpu is error"),
    ],
)
def test_anything_short_of_passed_is_not_verified(tmp_path, tiers, required, needle):
    _, rec = write(tmp_path, tiers)
    v = record.is_verified(rec, "h1", IMG, required)
    assert not v.ok
    assert needle in v.reason


def test_other_image_or_input_hash_is_not_verified(tmp_path):
    _, rec = write(tmp_path, [tier("cpu")])
    assert "judged image" in record.is_verified(rec, "h1", OTHER, ["cpu"]).reason
    assert "no entry for input hash h2" in record.is_verified(rec, "h2", IMG, ["cpu"]).reason


def test_tier_that_judged_another_image_does_not_count(tmp_path):
    _, rec = write(tmp_path, [tier("cpu", judged={"image_id": OTHER})])
    v = record.is_verified(rec, "h1", IMG, ["cpu"])
    assert not v.ok and "judged image" in v.reason


def test_new_image_under_same_hash_drops_old_verdicts(tmp_path):
    p, _ = write(tmp_path, [tier("cpu")])
    record.upsert_entry(p, "h1", {"image_id": OTHER, "wheel_sha256": WHEEL}, [tier("build")])
    entry = record.load(p)["entries"]["h1"]
    assert set(entry["tiers"]) == {"build"}
    assert entry["artifact"]["image_id"] == OTHER


def test_artifact_result_for_another_wheel_is_refused(tmp_path):
    p, _ = write(tmp_path, [tier("cpu")])
    other = tier("artifact-gpu", judged={"wheel_sha256": "d" * 64})
    with pytest.raises(RecordError, match="judged wheel sha256"):
        record.add_tier_result(p, "h1", other)
    ok = tier("artifact-gpu", judged={"wheel_sha256": WHEEL})
    record.add_tier_result(p, "h1", ok)
    assert record.is_verified(record.load(p), "h1", IMG, ["cpu", "artifact-gpu"]).ok


def test_record_file_is_sorted_json_and_no_temp_left(tmp_path):
    p, _ = write(tmp_path, [tier("cpu")])
    text = p.read_text()
    assert json.loads(text)["latest"] == "h1"
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert [f.name for f in p.parent.iterdir()] == [p.name]


def test_unreadable_record_names_the_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(RecordError, match=r"x\.json is not valid JSON"):
        record.load(p)


def test_matrix_status_line_names_each_tier_and_stale_records(tmp_path):
    p = tmp_path / "verified" / "cu130-torch211.json"
    record.upsert_entry(
        p,
        "h1",
        {"image_id": IMG, "wheel_sha256": WHEEL},
        [tier("cpu"), tier("build"), tier("gpu", "not-run", reasons=["no GPU"])],
    )
    assert record.status(tmp_path, "cu130-torch211", "h1") == "build:passed cpu:passed gpu:not-run"
    assert record.status(tmp_path, "cu130-torch211", "h2").startswith("not verified (record is for h1")
    assert record.status(tmp_path, "cu124-torch27", "h1") == "not verified"
