"""The ledger: content-addressed, append-only facts; verdicts bound to digests; the gate reads only them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kitsupport import H1, H2, REPO, artifact, digest, full_ledger, verdict

from flashkit.core.errors import RecordError, UsageError
from flashkit.core.names import Tier
from flashkit.ledger import gate, migrate, record, store
from flashkit.ledger.model import Applies, content_id

ENV = "cu130-torch211"
FULL = gate.parse_policy(None)


def lines(root: Path, env: str = ENV) -> list[str]:
    return store.ledger_path(root, env).read_text().splitlines()


# -- facts ------------------------------------------------------------------------------------------------
def test_a_fact_is_named_by_its_content():
    a = artifact()
    body = json.loads(a.line())
    assert body["id"] == content_id(body) == a.id and body["schema"] == 2 and body["kind"] == "artifact"
    assert artifact(date="2026-12-01T00:00:00+00:00").id != a.id


def test_appending_keeps_every_old_line_byte_for_byte(tmp_path):
    a = artifact()
    store.append(tmp_path, ENV, [a, verdict(a, "build")])
    before = lines(tmp_path)
    store.append(tmp_path, ENV, [verdict(a, "cpu")])
    after = lines(tmp_path)
    assert after[: len(before)] == before and len(after) == len(before) + 1
    # The same fact twice is one fact.
    _ledger, added = store.append(tmp_path, ENV, [verdict(a, "cpu")])
    assert added == [] and lines(tmp_path) == after


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda b: b.update(verdict="passed", counts={"tests": 0, "passed": 0}), "verdict"),
        (lambda b: b.update(counts={"tests": 3, "passed": 3, "failed": 1}), "verdict"),
        (lambda b: b.pop("subject"), "subject"),
        (lambda b: b.update(subject={"kind": "wheel", "digest": digest("w")}), "verdict"),  # cpu judges an image
        (lambda b: b.update(env="../../etc"), "env"),
        (lambda b: b.update(input_hash="fk1-abc\n"), "input_hash"),
        (lambda b: b["subject"].update(digest=digest("x") + "\n"), "subject.digest"),
        (lambda b: b.update(reasons=["fine", "two\nlines"]), "reasons.1"),
        (lambda b: b.update(kind="rumour"), "kind"),
        (lambda b: b.update(verdict="probably"), "verdict"),
    ],
)
def test_a_line_that_breaks_the_schema_or_the_rules_is_refused_at_read_time(tmp_path, edit, field):
    a = artifact()
    body = json.loads(verdict(a, "cpu").line())
    edit(body)
    body["id"] = content_id(body)  # a forger recomputes the id: the content checks still hold
    path = store.ledger_path(tmp_path, ENV)
    path.parent.mkdir(parents=True)
    path.write_text(a.line() + "\n" + json.dumps(body) + "\n")
    with pytest.raises(RecordError) as exc:
        store.load(tmp_path, ENV)
    assert "verified/cu130-torch211.jsonl:2:" in str(exc.value) and field in str(exc.value)


def test_an_edited_line_no_longer_matches_its_id(tmp_path):
    a = artifact()
    store.append(tmp_path, ENV, [a, verdict(a, "cpu", "failed")])
    path = store.ledger_path(tmp_path, ENV)
    path.write_text(path.read_text().replace('"verdict":"failed"', '"verdict":"error"'))
    with pytest.raises(RecordError, match=r":2: field id: .* not the sha256 of the fact's content"):
        store.load(tmp_path, ENV)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[1, 2]\n", "field (the fact)"),
        ('{"kind": "artifact", "schema": 2', "not valid JSON"),
        ("\xff\n", "not UTF-8"),
    ],
)
def test_malformed_ledger_files_name_file_and_line(tmp_path, text, needle):
    path = store.ledger_path(tmp_path, ENV)
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(RecordError, match=r"verified/cu130-torch211\.jsonl") as exc:
        store.load(tmp_path, ENV)
    assert needle in str(exc.value) and exc.value.exit_code == 14


def test_a_schema_1_record_is_refused_with_the_command_that_migrates_it(tmp_path):
    (tmp_path / "verified").mkdir()
    (tmp_path / "verified" / f"{ENV}.json").write_text("{}")
    with pytest.raises(RecordError, match="flashkit ledger migrate"):
        store.load(tmp_path, ENV)


# -- the gate -----------------------------------------------------------------------------------------------
def test_every_required_tier_on_this_exact_image(tmp_path):
    a = artifact()
    full_ledger(tmp_path, a)
    led = store.load(tmp_path, ENV)
    assert gate.gate(led, H1, a.image_id, FULL)
    assert not gate.gate(led, H1, digest("other image"), FULL)
    assert not gate.gate(led, H2, a.image_id, FULL)


@pytest.mark.parametrize("result", ["failed", "not-run", "error"])
def test_anything_short_of_passed_is_not_verified(tmp_path, result):
    a = artifact()
    store.append(
        tmp_path, ENV, [a, *(verdict(a, t) for t in ("build", "abi", "cpu")), verdict(a, "artifact-gpu", result)]
    )
    decision = gate.gate(store.load(tmp_path, ENV), H1, a.image_id, FULL)
    assert not decision and any(f"artifact-gpu: {result}" in r for r in decision.reasons)


def test_the_latest_verdict_for_a_tier_wins(tmp_path):
    a = artifact()
    full_ledger(tmp_path, a)
    store.append(tmp_path, ENV, [verdict(a, "cpu", "failed", date="2026-11-30T12:00:00+00:00")])
    decision = gate.gate(store.load(tmp_path, ENV), H1, a.image_id, FULL)
    assert not decision and "cpu: failed" in decision.reasons[0]


def test_a_rebuild_on_another_host_keeps_every_verdict_and_the_wheel_verdicts_apply(tmp_path):
    first = artifact()
    full_ledger(tmp_path, first)
    before = lines(tmp_path)
    # Another host: a different image id, the bit-identical wheel.
    second = artifact(image=digest("image on another host"), date="2026-12-01T09:00:00+00:00")
    led, added = record.append_with_applies(tmp_path, ENV, [second])
    assert lines(tmp_path)[: len(before)] == before  # nothing removed or rewritten
    applies = [f for f in added if isinstance(f, Applies)]
    assert {a.tier for a in applies} == {Tier.BUILD, Tier.ARTIFACT_GPU}  # the wheel tiers, not the image ones
    assert all("bit-identical" in a.because and a.artifact_id == second.id for a in applies)
    judged = gate.judgements(led, second)
    assert judged[Tier.ARTIFACT_GPU].passed and judged[Tier.ARTIFACT_GPU].how.startswith(
        "applies: the wheel is bit-identical"
    )
    assert not judged[Tier.ABI].passed  # the new image itself has not been judged
    decision = gate.gate(led, H1, second.image_id, FULL)
    assert not decision and "abi: not verified" in " ".join(decision.reasons)
    store.append(tmp_path, ENV, [verdict(second, t) for t in ("abi", "cpu")])
    assert gate.gate(store.load(tmp_path, ENV), H1, second.image_id, FULL)
    # Re-recording the same pair adds no second applies fact.
    _led, again = record.append_with_applies(tmp_path, ENV, [])
    assert again == []


def test_a_wheel_verdict_never_applies_to_another_wheel(tmp_path):
    first = artifact()
    full_ledger(tmp_path, first)
    other = artifact(image=digest("img2"), wheel="f" * 64, date="2026-12-01T00:00:00+00:00")
    led, added = record.append_with_applies(tmp_path, ENV, [other])
    assert added == [other]
    assert not gate.judgements(led, other)[Tier.ARTIFACT_GPU].passed


def test_an_artifact_gpu_verdict_follows_the_very_wheel_to_a_new_input_hash(tmp_path):
    """A template edit to the runtime stage moves the input hash and leaves the wheel alone: the GPU run
    judged that file, so it counts at the new hash once the new image's own build, abi and cpu passed."""
    first = artifact()
    full_ledger(tmp_path, first)
    moved = artifact(h=H2, image=digest("image at H2"), date="2026-12-01T09:00:00+00:00")
    led, added = record.append_with_applies(tmp_path, ENV, [moved])
    applies = [f for f in added if isinstance(f, Applies)]
    # Only artifact-gpu follows the wheel: the build tier is judged again at every input hash.
    assert [a.tier for a in applies] == [Tier.ARTIFACT_GPU]
    assert applies[0].input_hash == H2 and H1[:20] in applies[0].because and H2[:20] in applies[0].because
    j = gate.judgements(led, moved)[Tier.ARTIFACT_GPU]
    assert not j.passed and "only once this image's own build, abi and cpu passed" in j.how
    store.append(tmp_path, ENV, [verdict(moved, t, date="2026-12-01T10:00:00+00:00") for t in ("build", "abi")])
    assert not gate.gate(store.load(tmp_path, ENV), H2, moved.image_id, FULL)  # cpu has not run
    store.append(tmp_path, ENV, [verdict(moved, "cpu", date="2026-12-01T10:00:00+00:00")])
    led = store.load(tmp_path, ENV)
    j = gate.judgements(led, moved)[Tier.ARTIFACT_GPU]
    assert j.passed and j.relation == "same-wheel" and j.how.startswith("same wheel") and H1[:20] in j.how
    assert gate.gate(led, H2, moved.image_id, FULL)
    assert gate.summary(led, H2).tiers["artifact-gpu"] == f"passed(same-wheel:{H1[:12]})"
    # A GPU policy without "own" takes none of this env's verdicts, moved or not.
    assert not gate.judgements(led, moved, ("device-code",))[Tier.ARTIFACT_GPU].passed


def test_a_verdict_at_another_input_hash_never_reaches_another_wheel(tmp_path):
    full_ledger(tmp_path, artifact())
    other = artifact(h=H2, image=digest("img at H2"), wheel="e" * 64, date="2026-12-01T00:00:00+00:00")
    led, added = record.append_with_applies(tmp_path, ENV, [other])
    assert added == [other]
    store.append(tmp_path, ENV, [verdict(other, t, date="2026-12-01T10:00:00+00:00") for t in ("build", "abi", "cpu")])
    led = store.load(tmp_path, ENV)
    assert not gate.judgements(led, other)[Tier.ARTIFACT_GPU].passed
    assert not gate.gate(led, H2, other.image_id, FULL)


def test_a_later_failure_of_the_same_wheel_wins_at_the_new_input_hash(tmp_path):
    first = artifact()
    full_ledger(tmp_path, first)
    moved = artifact(h=H2, image=digest("image at H2"), date="2026-12-01T09:00:00+00:00")
    record.append_with_applies(
        tmp_path, ENV, [moved, *(verdict(moved, t, date="2026-12-01T10:00:00+00:00") for t in ("build", "abi", "cpu"))]
    )
    assert gate.gate(store.load(tmp_path, ENV), H2, moved.image_id, FULL)
    store.append(tmp_path, ENV, [verdict(moved, "artifact-gpu", "failed", date="2026-12-02T10:00:00+00:00")])
    decision = gate.gate(store.load(tmp_path, ENV), H2, moved.image_id, FULL)
    assert not decision and "artifact-gpu: failed" in " ".join(decision.reasons)


def test_weaker_policy_passes_only_when_asked(tmp_path):
    a = artifact()
    full_ledger(tmp_path, a, tiers=("build", "abi", "cpu"))
    led = store.load(tmp_path, ENV)
    assert not gate.gate(led, H1, a.image_id, FULL)
    weak = gate.parse_policy("no-gpu")
    assert gate.gate(led, H1, a.image_id, weak) and weak.weaker_than_default


def test_status_line_for_the_matrix(tmp_path):
    a = artifact()
    full_ledger(tmp_path, a)
    led = store.load(tmp_path, ENV)
    assert gate.status(led, H1) == "build:passed abi:passed cpu:passed artifact-gpu:passed"
    assert gate.status(led, H2).startswith("not verified at this input hash")
    assert gate.status(store.load(tmp_path, "cu124-torch27"), H1) == "not verified"


# -- migration -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env", ["cu130-torch211", "cu124-torch27"])
def test_the_committed_schema_1_records_migrate_without_loss(env, tmp_path):
    original = REPO / "verified" / "schema1" / f"{env}.json"
    data = json.loads(original.read_text())
    (tmp_path / "verified").mkdir()
    (tmp_path / "verified" / f"{env}.json").write_text(original.read_text())
    migrate.migrate_env(tmp_path, env)
    led = store.load(tmp_path, env)
    assert migrate.lost_in_migration(data, led) == []
    assert (tmp_path / "verified" / "schema1" / f"{env}.json").read_text() == original.read_text()


def test_a_second_schema_1_record_never_replaces_the_kept_original(tmp_path):
    """The original an earlier migration kept is evidence: a new verified/<env>.json (a copy, an edit) is refused."""
    env = "cu124-torch27"
    original = REPO / "verified" / "schema1" / f"{env}.json"
    (tmp_path / "verified").mkdir()
    (tmp_path / "verified" / f"{env}.json").write_text(original.read_text())
    migrate.migrate_env(tmp_path, env)
    kept = tmp_path / "verified" / "schema1" / f"{env}.json"
    (tmp_path / "verified" / f"{env}.json").write_text(original.read_text().replace('"schema"', ' "schema"', 1))
    before = store.ledger_path(tmp_path, env).read_bytes()
    with pytest.raises(RecordError, match="already holds the schema-1 original"):
        migrate.migrate_env(tmp_path, env)
    assert kept.read_text() == original.read_text() and store.ledger_path(tmp_path, env).read_bytes() == before


@pytest.mark.parametrize("entries", [{"fk1-x": []}, {"fk1-x": "text"}, {"fk1-x": {"updated": [1], "artifact": 5}}])
def test_a_schema_1_record_whose_entries_are_not_objects_is_exit_14(entries, tmp_path):
    (tmp_path / "verified").mkdir()
    (tmp_path / "verified" / "cu124-torch27.json").write_text(json.dumps({"schema": 1, "entries": entries}))
    with pytest.raises(RecordError, match="fk1-x"):
        migrate.migrate_env(tmp_path, "cu124-torch27")
    assert (tmp_path / "verified" / "cu124-torch27.json").exists() and not (tmp_path / "verified" / "schema1").exists()


@pytest.mark.parametrize("env", ["cu130-torch211", "cu124-torch27"])
def test_the_committed_ledger_holds_everything_of_its_schema_1_record(env):
    data = json.loads((REPO / "verified" / "schema1" / f"{env}.json").read_text())
    assert migrate.lost_in_migration(data, store.load(REPO, env)) == []


def test_every_committed_ledger_line_validates_against_the_committed_schema():
    import jsonschema

    schema = json.loads((REPO / "flashkit" / "ledger" / "schema" / "ledger-v2.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    files = sorted((REPO / "verified").glob("*.jsonl"))
    assert files
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            errors = list(validator.iter_errors(json.loads(line)))
            assert not errors, f"{path.name}:{n}: {errors[0].message}"
        store.load(REPO, path.stem)  # and the semantic checks


def _build(tmp_wheel, builder: dict, date: str):
    from flashkit.images.build import BuildResult

    return BuildResult(
        env="cu130-torch211", input_hash=H2, runtime_ref="flashkit/cu130-torch211:x", runtime_id=digest("img"),
        builder_ref="b", builder_id=digest("bld"), runtime_size=1, builder_size=1, wheel_path=str(tmp_wheel),
        wheel_sha256="a" * 64, lock_sha256="0" * 64, base_image_id=digest("base"), built=True, seconds=1.0,
        log_path="l", context={}, date=date, runtime_base_id=digest("rbase"), builder=builder,
    )  # fmt: skip


def test_a_build_records_its_runtime_layers_and_they_survive_the_ledger(tmp_path):
    """The runtime's diff ids go from the build result into the artifact, through a schema-valid line and
    back as a tuple; an artifact recorded without them keeps its old line and id."""
    import dataclasses

    from flashkit.images.build import _check_result
    from flashkit.ledger.record import record_build

    wheel = tmp_path / "flash_kernels-0.1.0-cp310-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"w")
    layers = (digest("base-layer"), digest("useradd"), digest("compileall"))
    who = {"host": "h (0123456789ab)", "tool": "buildah 1.28.2", "storage": "overlay:/s", "cold": True}
    res = dataclasses.replace(_build(wheel, who, "2026-12-01T10:00:00+00:00"), runtime_layers=layers)
    assert _check_result(json.loads(json.dumps(res.to_json())), "r.json") == res
    _l, art, _added = record_build(tmp_path, res)
    assert art.runtime_layers == layers
    loaded = store.load(tmp_path, "cu130-torch211").artifacts(H2)
    assert [a.runtime_layers for a in loaded] == [layers] and loaded[0].id == art.id
    old = artifact(h=H1)
    assert old.runtime_layers is None and "runtime_layers" not in json.loads(old.line())
    assert "runtime_layers" not in _build(wheel, {}, "2026-12-01T10:00:00+00:00").to_json()


def test_an_independent_build_of_the_same_image_is_recorded_as_a_confirmation(tmp_path):
    """Reproducible images: another host or storage that gets the same ids adds its own artifact; the same
    builder again adds nothing; old lines without a builder stay valid."""
    from flashkit.ledger.record import record_build

    wheel = tmp_path / "flash_kernels-0.1.0-cp310-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"w")
    a = {
        "host": "build-1 (0123456789ab)",
        "tool": "buildah 1.28.2",
        "storage": "overlay:/var/lib/containers/storage",
        "cold": True,
    }
    b = {**a, "storage": "overlay:/var/tmp/second/storage"}
    _l, first, added = record_build(tmp_path, _build(wheel, a, "2026-12-01T10:00:00+00:00"))
    assert len(added) == 1 and first.builder == a and first.runtime_base_id == digest("rbase")
    assert record_build(tmp_path, _build(wheel, {**a, "cold": False}, "2026-12-01T11:00:00+00:00"))[2] == []
    _l, second, added = record_build(tmp_path, _build(wheel, b, "2026-12-01T12:00:00+00:00"))
    assert [f.kind for f in added] == ["artifact"] and second.image_id == first.image_id
    ledger = store.load(tmp_path, "cu130-torch211")
    assert [x.builder["storage"] for x in ledger.artifacts(H2)] == [a["storage"], b["storage"]]
    old = artifact(h=H1)  # a line of before: no builder, no runtime base
    store.append(tmp_path, "cu130-torch211", [old])
    assert "builder" not in json.loads(old.line()) and store.load(tmp_path, "cu130-torch211").artifacts(H1) == [old]


@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_policy_is_refused_not_taken_for_the_default(text):
    with pytest.raises(UsageError, match="leave it out for the default"):
        gate.parse_policy(text)
    assert gate.parse_policy(None) == FULL
