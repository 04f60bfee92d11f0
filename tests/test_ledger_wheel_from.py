"""Envs that install another env's wheel (``wheel_from``): they inherit that env's wheel verdicts on the
very same sha256, recorded as cross-env applies in their own ledger; their images are judged on their own."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from kitsupport import H1, H2, REPO, artifact, digest, verdict

from flashkit.core.errors import BuildError, RecordError
from flashkit.core.names import Tier
from flashkit.images.build import BuildResult, _check_result
from flashkit.ledger import gate, record, store
from flashkit.ledger.model import Applies, Artifact, content_id
from flashkit.ledger.store import check_body

SRC = "cu130-torch211"  # builds the wheel; the GPU host runs its torch
USER = "cu130-torch215"  # installs SRC's wheel
OTHER = "cu130-torch213"  # installs it too
WHEEL = "ab" * 32
FULL = gate.parse_policy(None)
H200 = {"gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "python": "3.12.3"}


def source(root: Path, tiers=("build", "abi", "cpu", "artifact-gpu"), result: str = "passed") -> Artifact:
    """SRC's build of WHEEL with ``tiers`` recorded; its artifact-gpu ran on the H200."""
    art = artifact(SRC, H1, image=digest("src image"), wheel=WHEEL)
    facts = [art]
    for t in tiers:
        v = verdict(art, t, result)
        facts.append(dataclasses.replace(v, host=H200, source="imported") if t == "artifact-gpu" else v)
    store.append(root, SRC, facts)
    return art


def user_build(env: str = USER, wheel: str = WHEEL, date: str = "2026-12-01T10:00:00+00:00", **changes) -> BuildResult:
    """A build result of a consumer env: its own image, SRC's wheel file."""
    fields = dict(
        env=env, input_hash=H2, runtime_ref=f"flashkit/{env}:x", runtime_id=digest(f"{env} image"),
        builder_ref="b", builder_id=digest(f"{env} builder"), runtime_size=1, builder_size=1,
        wheel_path="/w/flash_kernels-0.1.0+cu13stable2.10-cp310-abi3-linux_x86_64.whl", wheel_sha256=wheel,
        lock_sha256="0" * 64, base_image_id=None, built=True, seconds=1.0, log_path="l", context={}, date=date,
        wheel_from={"env": SRC, "input_hash": H1},
    )  # fmt: skip
    return BuildResult(**{**fields, **changes})


def cross(ledger: store.Ledger) -> list[Applies]:
    return [a for a in ledger.applies() if a.source_env]


def write_lines(root: Path, env: str, *bodies: dict) -> None:
    path = store.ledger_path(root, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for body in bodies:
            f.write(json.dumps({**body, "id": content_id(body)}, sort_keys=True) + "\n")


# -- the facts -----------------------------------------------------------------------------------------------
def test_old_lines_read_back_byte_for_byte_and_keep_their_ids():
    """The new fields are optional and left out when None: every committed line is the line its fact writes."""
    files = sorted((REPO / "verified").glob("*.jsonl"))
    assert files
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            fact = check_body(json.loads(line))
            assert fact.line() == line and fact.id == json.loads(line)["id"], f"{path.name}:{n}"
    old = artifact()
    assert "wheel_from" not in json.loads(old.line())
    assert dataclasses.replace(old, wheel_from={"env": SRC, "input_hash": H1}).id != old.id


def test_a_build_result_carries_wheel_from_and_old_result_files_still_load():
    res = user_build()
    data = res.to_json()
    assert _check_result(json.loads(json.dumps(data)), "r.json") == res
    assert record.artifact_of(res).wheel_from == {"env": SRC, "input_hash": H1}
    own = dataclasses.replace(res, wheel_from=None)
    assert "wheel_from" not in own.to_json()  # an env that builds its own wheel writes the file of before
    assert _check_result(own.to_json(), "r.json") == own and record.artifact_of(own).wheel_from is None
    with pytest.raises(BuildError, match=r"r\.json: field wheel_from"):
        _check_result({**data, "wheel_from": {"env": "../etc", "input_hash": H1}}, "r.json")


# -- inheriting ----------------------------------------------------------------------------------------------
def test_a_consumer_build_inherits_the_source_wheel_verdicts_on_that_sha_only(tmp_path):
    src = source(tmp_path)
    # The same source env also built another wheel (another input hash), judged on the GPU too: not ours.
    other = artifact(SRC, H2, image=digest("src image 2"), wheel="cd" * 32)
    store.append(tmp_path, SRC, [other, verdict(other, "build"), verdict(other, "artifact-gpu")])
    led, art, added = record.record_build(tmp_path, user_build())
    assert art.wheel_from == {"env": SRC, "input_hash": H1} and added[0] == art
    inherited = cross(led)
    assert {a.tier for a in inherited} == {Tier.BUILD, Tier.ARTIFACT_GPU}  # never abi, cpu or gpu
    src_verdicts = {v.id: v for v in store.load(tmp_path, SRC).verdicts()}
    for a in inherited:
        v = src_verdicts[a.verdict_id]
        assert a.source_env == SRC and a.env == USER and a.artifact_id == art.id and a.input_hash == H2
        assert v.subject == a.subject == art.subject(a.tier.subject) and v.input_hash == H1 and v.env == SRC
        assert f"the file {SRC}@{H1} built (wheel_from)" in a.because and f"sha256:{WHEEL}" in a.because
        assert f"ran in {SRC} on" in a.because and "not in this env" in a.because and USER not in a.because
    (gpu,) = [a for a in inherited if a.tier is Tier.ARTIFACT_GPU]
    assert "NVIDIA H200 (compute capability 9.0), torch 2.11.0+cu130, CUDA 13.0" in gpu.because
    assert set(led.foreign) == {a.verdict_id for a in inherited} and src.id not in led.foreign
    # Recording the same build again adds nothing.
    assert record.record_build(tmp_path, user_build())[2] == []
    assert len(cross(store.load(tmp_path, USER))) == 2


def test_a_consumer_of_another_wheel_inherits_nothing(tmp_path):
    source(tmp_path)
    led, _art, added = record.record_build(tmp_path, user_build(wheel="ef" * 32))
    assert [f.kind for f in added] == ["artifact"] and cross(led) == []
    j = gate.judgements(led, led.artifacts()[0])
    assert not j[Tier.ARTIFACT_GPU].passed and not j[Tier.BUILD].passed


def test_a_gpu_verdict_that_arrives_after_the_consumer_build_reaches_every_consumer(tmp_path):
    src = source(tmp_path, tiers=("build", "abi", "cpu"))
    record.record_build(tmp_path, user_build())
    record.record_build(tmp_path, user_build(OTHER))
    record.record_build(tmp_path, user_build("cu130-torch212", wheel="ef" * 32))  # another wheel: untouched
    assert {a.tier for a in cross(store.load(tmp_path, USER))} == {Tier.BUILD}
    gpu = dataclasses.replace(verdict(src, "artifact-gpu", date="2026-12-02T00:00:00+00:00"), host=H200)
    _led, added = record.append_with_applies(tmp_path, SRC, [gpu])  # as import-artifact-result appends it
    assert added == [gpu]  # the source's own ledger gets the verdict only
    for env in (USER, OTHER):
        got = [a for a in cross(store.load(tmp_path, env)) if a.verdict_id == gpu.id]
        assert len(got) == 1 and got[0].tier is Tier.ARTIFACT_GPU and got[0].date == gpu.date
    assert cross(store.load(tmp_path, "cu130-torch212")) == []
    assert {a.env for a in record.applied_elsewhere(tmp_path, gpu)} == {USER, OTHER}
    # Propagating again (a re-import of the same result) adds no second applies.
    assert record.propagate(tmp_path, SRC, [gpu]) == {}


def test_a_re_run_records_source_verdicts_that_came_with_a_pull(tmp_path):
    record.record_build(tmp_path, user_build())
    source(tmp_path)  # the source's lines arrived by `git pull`, not through this checkout's commands
    assert cross(store.load(tmp_path, USER)) == []
    _led, _same, added = record.record_build(tmp_path, user_build(date="2026-12-03T00:00:00+00:00"))
    assert {a.tier for a in added} == {Tier.BUILD, Tier.ARTIFACT_GPU}


# -- the gate --------------------------------------------------------------------------------------------------
def test_the_gate_needs_the_consumer_image_tiers_and_takes_the_wheel_tiers_from_the_source(tmp_path):
    source(tmp_path, tiers=("build", "abi", "cpu", "gpu", "artifact-gpu"))
    _led, art, _added = record.record_build(tmp_path, user_build())
    led = store.load(tmp_path, USER)
    decision = gate.gate(led, H2, art.image_id, FULL)
    assert not decision  # the consumer's own image has not been judged: the source's abi and cpu do not count
    assert "abi: not verified" in " ".join(decision.reasons) and "cpu: not verified" in " ".join(decision.reasons)
    store.append(tmp_path, USER, [verdict(art, "abi")])
    assert not gate.gate(store.load(tmp_path, USER), H2, art.image_id, FULL)
    store.append(tmp_path, USER, [verdict(art, "cpu")])
    led = store.load(tmp_path, USER)
    decision = gate.gate(led, H2, art.image_id, FULL)
    assert decision and decision.passed_tiers == ("build", "abi", "cpu", "artifact-gpu")
    j = gate.judgements(led, art)[Tier.ARTIFACT_GPU]
    assert j.source_env == SRC and j.how.startswith(f"applies from {SRC}: ") and "NVIDIA H200" in j.how
    assert gate.status(led, H2) == (
        f"build:passed(applies:{SRC}) abi:passed cpu:passed artifact-gpu:passed(applies:{SRC})"
    )
    assert gate.summary(led, H2).tiers["artifact-gpu"] == f"passed(applies:{SRC})"
    # The source's GPU tier in its own container judged its own image: never this one's.
    assert not gate.gate(led, H2, art.image_id, gate.parse_policy("gpu"))


def test_a_later_failure_of_the_source_wheel_reaches_the_consumer_gate(tmp_path):
    src = source(tmp_path)
    _led, art, _added = record.record_build(tmp_path, user_build())
    store.append(tmp_path, USER, [verdict(art, "abi"), verdict(art, "cpu")])
    assert gate.gate(store.load(tmp_path, USER), H2, art.image_id, FULL)
    failed = dataclasses.replace(verdict(src, "artifact-gpu", "failed", date="2026-12-05T00:00:00+00:00"), host=H200)
    record.append_with_applies(tmp_path, SRC, [failed])
    decision = gate.gate(store.load(tmp_path, USER), H2, art.image_id, FULL)
    assert not decision and f"artifact-gpu: failed (applies from {SRC}" in " ".join(decision.reasons)


def test_a_source_without_an_artifact_gpu_verdict_leaves_the_consumer_refused(tmp_path):
    source(tmp_path, tiers=("build", "abi", "cpu"))
    _led, art, _added = record.record_build(tmp_path, user_build())
    store.append(tmp_path, USER, [verdict(art, "abi"), verdict(art, "cpu")])
    led = store.load(tmp_path, USER)
    decision = gate.gate(led, H2, art.image_id, FULL)
    assert not decision and "artifact-gpu: not verified" in decision.reasons[0]
    assert gate.gate(led, H2, art.image_id, gate.parse_policy("no-gpu"))  # build came from the source


# -- tampering ------------------------------------------------------------------------------------------------
OTHER_WHEEL = artifact(SRC, H2, image=digest("src image 2"), wheel="cd" * 32)
OTHER_GPU = verdict(OTHER_WHEEL, "artifact-gpu")  # the source's verdict on another of its wheels


def _inherited_line(root: Path) -> dict:
    source(root)
    store.append(root, SRC, [OTHER_WHEEL, OTHER_GPU])
    record.record_build(root, user_build())
    path = store.ledger_path(root, USER)
    body = json.loads(path.read_text().splitlines()[-1])
    assert body["kind"] == "applies" and body["source_env"] == SRC
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:-1]))  # drop it
    return body


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda b: b.update(verdict_id=digest("no such verdict")), "field verdict_id: verified/cu130-torch211.jsonl has no fact"),
        (lambda b: b.update(verdict_id=OTHER_GPU.id), "field subject: this applies names artifact-gpu on wheel"),
        (lambda b: b.update(subject={"kind": "wheel", "digest": digest("another wheel")}), "field artifact_id"),
        (lambda b: b.update(tier="build"), "field tier: this applies names build on wheel"),
        (lambda b: b.update(source_env="cu124-torch27"), "field artifact_id"),  # the build names another source
        (lambda b: b.update(source_env=USER), "field source_env: names this env itself"),
        (lambda b: b.update(tier="cpu", subject={"kind": "image", "digest": digest("src image")}), "field tier"),
        (lambda b: b.update(artifact_id=digest("no such build")), "field artifact_id"),
    ],
)  # fmt: skip
def test_a_tampered_cross_env_applies_is_an_error_naming_file_and_line(tmp_path, edit, needle):
    body = _inherited_line(tmp_path)
    assert body["tier"] == "artifact-gpu"  # the last one recorded; the edits start from it
    edit(body)
    body.pop("id")
    write_lines(tmp_path, USER, body)
    n = len(store.ledger_path(tmp_path, USER).read_text().splitlines())
    with pytest.raises(RecordError) as exc:
        store.load(tmp_path, USER)
    assert f"verified/{USER}.jsonl:{n}: " in str(exc.value) and needle in str(exc.value)


def test_a_fact_id_that_is_not_a_verdict_is_refused(tmp_path):
    body = _inherited_line(tmp_path)
    body.update(verdict_id=store.load(tmp_path, SRC).artifacts()[0].id)
    body.pop("id")
    write_lines(tmp_path, USER, body)
    with pytest.raises(RecordError, match=f"field verdict_id: verified/{SRC}.jsonl has a fact of kind artifact"):
        store.load(tmp_path, USER)


def test_appending_an_unresolvable_cross_env_applies_is_refused_and_writes_nothing(tmp_path):
    body = _inherited_line(tmp_path)
    before = store.ledger_path(tmp_path, USER).read_bytes()
    good = check_body({**body, "id": content_id(body)})
    assert isinstance(good, Applies)
    bad = dataclasses.replace(good, verdict_id=digest("gone"))
    with pytest.raises(RecordError, match=f"refusing to append applies .* to verified/{USER}.jsonl: field verdict_id"):
        store.append(tmp_path, USER, [bad])
    assert store.ledger_path(tmp_path, USER).read_bytes() == before
    store.append(tmp_path, USER, [good])  # the genuine one is accepted
    assert good.verdict_id in store.load(tmp_path, USER).foreign


def test_a_source_ledger_that_does_not_read_is_named(tmp_path):
    _inherited_line(tmp_path)
    record.record_build(tmp_path, user_build(date="2026-12-04T00:00:00+00:00"))  # the applies again
    src = store.ledger_path(tmp_path, SRC)
    src.write_text(src.read_text().replace('"verdict":"passed"', '"verdict":"failed"', 1))
    with pytest.raises(
        RecordError, match=f"field source_env: the ledger of {SRC} is unreadable: verified/{SRC}.jsonl:2"
    ):
        store.load(tmp_path, USER)


def test_one_level_only_a_source_own_cross_env_applies_are_not_followed(tmp_path):
    """A source that inherits in turn (a chain) is read for its own verdicts only; its applies stay unresolved."""
    source(tmp_path)
    _led, user_art, _added = record.record_build(tmp_path, user_build())
    mine = verdict(user_art, "build", date="2026-12-02T00:00:00+00:00")  # USER's own build tier on the wheel
    store.append(tmp_path, USER, [mine])
    led, _art, _added = record.record_build(tmp_path, user_build(OTHER, wheel_from={"env": USER, "input_hash": H2}))
    # USER's own verdict applies; the SRC verdicts USER inherited do not pass on through it.
    assert [a.verdict_id for a in cross(led)] == [mine.id]
    store.ledger_path(tmp_path, SRC).unlink()
    with pytest.raises(RecordError, match=f"field source_env: {SRC} has no ledger"):
        store.load(tmp_path, USER)
    assert gate.judgements(store.load(tmp_path, OTHER), led.artifacts()[0])[Tier.BUILD].source_env == USER


# -- the command line -------------------------------------------------------------------------------------------
def test_ledger_show_prints_cross_env_applies(cli, kit_repo):
    source(kit_repo)
    record.record_build(kit_repo, user_build())
    r = cli("--repo", str(kit_repo), "ledger", "show", USER)
    assert r.code == 0, r.err
    assert f"wheel from {SRC}@{H1}" in r.out
    assert f"artifact-gpu: passed (applies from {SRC}: " in r.out
    assert f"applies from {SRC}: its artifact-gpu verdict" in r.out and "NVIDIA H200" in r.out
    assert "abi: not verified" in r.out


def test_merge_brings_the_applies_a_ci_job_did_not_upload(cli, kit_repo, tmp_path):
    """The source's GPU lines come from one job, the consumer's build from another: the merge links them."""
    src_art = artifact(SRC, H1, image=digest("src image"), wheel=WHEEL)
    store.append(kit_repo, SRC, [src_art])
    record.record_build(kit_repo, user_build())
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    gpu = dataclasses.replace(verdict(src_art, "artifact-gpu"), host=H200)
    (jobs / f"{SRC}-gpu.jsonl").write_text(gpu.line() + "\n")
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(jobs))
    assert r.code == 0, r.err
    assert f"{USER}: 1 applies of other envs' verdicts added" in r.out
    (a,) = cross(store.load(kit_repo, USER))
    assert a.verdict_id == gpu.id


def test_merge_appends_a_consumer_applies_after_the_source_verdict_it_names(cli, kit_repo, tmp_path):
    """Lines recorded elsewhere, consumer first by name: the source env's lines are merged before."""
    elsewhere = tmp_path / "elsewhere"
    source(elsewhere)
    record.record_build(elsewhere, user_build())
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for env in (SRC, USER):
        (jobs / f"{env}.jsonl").write_bytes(store.ledger_path(elsewhere, env).read_bytes())
    (jobs / f"{USER}.jsonl").rename(jobs / "a-first.jsonl")  # the consumer's file sorts first
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(jobs))
    assert r.code == 0, r.err
    assert len(cross(store.load(kit_repo, USER))) == 2
