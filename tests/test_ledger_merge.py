"""`flashkit ledger merge`: CI jobs' ledger lines appended to verified/<env>.jsonl, checked, deduplicated by
fact id, in order, never overwriting what is there."""

from __future__ import annotations

import json
from pathlib import Path

from kitsupport import H1, H2, artifact, digest, verdict

from flashkit.evidence import device_code
from flashkit.ledger import store
from flashkit.ledger.model import content_id

ENV = "cu130-torch211"


def lines(*facts) -> str:
    return "".join(f.line() + "\n" for f in facts)


def test_merges_jobs_lines_in_order_and_only_once(cli, kit_repo, tmp_path):
    old = artifact(ENV, H1)
    store.append(kit_repo, ENV, [old, verdict(old, "build")])
    before = store.ledger_path(kit_repo, ENV).read_bytes()
    new = artifact(ENV, H2, image=digest("image2"), date="2026-12-01T10:00:00+00:00")
    other = artifact("cu124-torch27", "fk1-" + "27" * 32)  # an input hash is one env's: its spec is in it
    jobs = tmp_path / "ledger-in"
    jobs.mkdir()
    # The build job's lines (one already in the ledger: a job that started from an older checkout), the gpu
    # job's, and another env's.
    (jobs / f"{ENV}-build.jsonl").write_text(lines(old, new, verdict(new, "build"), verdict(new, "cpu")))
    (jobs / f"{ENV}-gpu.jsonl").write_text(lines(verdict(new, "gpu")))
    (jobs / "cu124-torch27-build.jsonl").write_text(lines(other))
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(jobs))
    assert r.code == 0, r.err
    assert f"{ENV}: 4 of 5 facts added" in r.out and "cu124-torch27: 1 of 1 facts added" in r.out
    after = store.ledger_path(kit_repo, ENV).read_bytes()
    assert after.startswith(before)  # appended: the old lines are untouched
    ids = [f.id for f in store.load(kit_repo, ENV).facts]
    want = [old, verdict(old, "build"), new, verdict(new, "build"), verdict(new, "cpu"), verdict(new, "gpu")]
    assert ids == [f.id for f in want]
    again = cli("--repo", str(kit_repo), "ledger", "merge", str(jobs))
    assert again.code == 0 and f"{ENV}: 0 of 5 facts added" in again.out
    assert store.ledger_path(kit_repo, ENV).read_bytes() == after


def test_an_edited_line_merges_nothing(cli, kit_repo, tmp_path):
    a = artifact(ENV, H1)
    good = tmp_path / "a.jsonl"
    good.write_text(lines(a))
    body = json.loads(verdict(a, "cpu").line())
    body["counts"]["passed"] = 4  # edited after it was recorded: its id no longer matches
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps(body) + "\n")
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(good), str(bad))
    assert r.code == 14 and f"{bad}:1: field id" in r.err and "Traceback" not in r.err
    assert not store.ledger_path(kit_repo, ENV).exists()  # the good file was not merged either


def test_facts_of_an_env_this_checkout_does_not_have_are_refused(cli, kit_repo, tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text(lines(artifact("cu999-torch99", H1)))
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(f))
    assert r.code == 14 and "cu999-torch99" in r.err and "envs/cu999-torch99.yaml" in r.err


def test_missing_or_empty_inputs_are_named(cli, kit_repo, tmp_path):
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(tmp_path / "nope.jsonl"))
    assert r.code == 14 and "nope.jsonl" in r.err and "does not exist" in r.err
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(empty))
    assert r.code == 14 and "no *.jsonl" in r.err


def test_not_json_names_the_line(cli, kit_repo, tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text(lines(artifact(ENV, H1)) + "{not json\n")
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(f))
    assert r.code == 14 and f"{f}:2: not valid JSON" in r.err
    assert not Path(store.ledger_path(kit_repo, ENV)).exists()


# --- hostile lines: each is refused with its rule and file:line, and nothing of the merge is written
def forged(fact, **changes) -> str:
    """``fact``'s line with ``changes``, its id recomputed: a line that hashes correctly but lies."""
    body = json.loads(fact.line())
    body.update(changes)
    body["id"] = content_id(body)
    return json.dumps(body)


def test_a_gpu_pass_on_an_image_no_build_produced_is_refused(cli, kit_repo, tmp_path):
    a = artifact(ENV, H1)
    store.append(kit_repo, ENV, [a])
    before = store.ledger_path(kit_repo, ENV).read_bytes()
    gpu = verdict(a, "gpu")
    made_up = forged(gpu, subject={"kind": "image", "digest": digest("made up")})
    f = tmp_path / f"{ENV}-gpu.jsonl"
    f.write_text(lines(verdict(a, "cpu")) + made_up + "\n")
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(f))
    assert r.code == 14 and f"{f}:2: field subject: gpu verdict on image {digest('made up')}" in r.err
    assert "no build (artifact)" in r.err and "nothing was merged" in r.err
    assert store.ledger_path(kit_repo, ENV).read_bytes() == before  # the good cpu line was not merged either
    # The same verdict on the build of this merge's own lines is fine: the subject is the build it names.
    b = artifact(ENV, H2, image=digest("image2"))
    f.write_text(lines(b, verdict(b, "gpu")))
    assert cli("--repo", str(kit_repo), "ledger", "merge", str(f)).code == 0


def test_a_file_named_for_one_env_holding_another_envs_lines_is_refused(cli, kit_repo, tmp_path):
    f = tmp_path / "cu124-torch27.jsonl"
    f.write_text(lines(artifact("cu124-torch27", H1), artifact(ENV, H1)))
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(f))
    assert r.code == 14 and f"{f}:2: field env: a fact of '{ENV}'" in r.err
    assert not store.ledger_path(kit_repo, "cu124-torch27").exists()
    # A CI job's upload is named <env>-<part>.jsonl; the longest env id the name starts with is the one.
    g = tmp_path / "cu130-torch211-py313-build.jsonl"
    g.write_text(lines(artifact(ENV, H1)))
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(g))
    assert r.code == 14 and "a fact of 'cu130-torch211' in the ledger of 'cu130-torch211-py313'" in r.err


def test_non_finite_numbers_are_not_json(cli, kit_repo, tmp_path):
    a = artifact(ENV, H1)
    inf = forged(verdict(a, "cpu"), duration_s=float("inf"))  # its id is right: Python hashes what it reads back
    cases = (forged(verdict(a, "cpu"), duration_s=float("nan")), inf, inf.replace("Infinity", "1e999"))
    for line in (*cases, forged(verdict(a, "cpu"), duration_s=-float("inf"))):
        f = tmp_path / "x.jsonl"
        f.write_text(lines(a) + line + "\n")
        r = cli("--repo", str(kit_repo), "ledger", "merge", str(f))
        assert r.code == 14 and f"{f}:2: not strict JSON" in r.err, (line, r.err)
        assert not store.ledger_path(kit_repo, ENV).exists()


def test_a_deeply_nested_line_is_refused_not_a_crash(cli, kit_repo, tmp_path):
    f = tmp_path / "x.jsonl"
    for depth in (20, 100_000):  # past any fact; and past Python's recursion limit, inside the 256 KiB cap
        f.write_text("[" * depth + "]" * depth + "\n")
        r = cli("--repo", str(kit_repo), "ledger", "merge", str(f))
        assert r.code == 14 and f"{f}:1: nested deeper than" in r.err, r.err


def test_a_lock_file_that_is_a_symlink_is_refused(cli, kit_repo, tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text(lines(artifact(ENV, H1)))
    lock = Path(str(store.ledger_path(kit_repo, ENV)) + ".lock")
    lock.parent.mkdir(parents=True)
    lock.symlink_to(lock.name)  # a loop: the lock names itself
    r = cli("--repo", str(kit_repo), "ledger", "merge", str(f))
    assert r.code == 14 and "lock" in r.err and "symlink" in r.err and "Traceback" not in r.err
    victim = tmp_path / "victim"
    victim.write_text("precious")
    lock.unlink()
    lock.symlink_to(victim)  # taking the lock would truncate the file it points to
    assert cli("--repo", str(kit_repo), "ledger", "merge", str(f)).code == 14
    assert victim.read_text() == "precious" and not store.ledger_path(kit_repo, ENV).exists()


def test_applies_and_device_code_of_a_build_merge_but_not_of_a_made_up_one(cli, kit_repo, tmp_path):
    from flashkit.ledger import record
    from flashkit.ledger.model import Applies

    a = artifact(ENV, H1)
    code = record.device_code_fact(a, device_code.of_files({}), {})
    v = verdict(a, "build")
    local = Applies(env=ENV, input_hash=H1, date=v.date, tier=v.tier, verdict_id=v.id, artifact_id=a.id,
                    subject=v.subject, because="a rebuild of the same wheel")  # fmt: skip
    f = tmp_path / f"{ENV}.jsonl"
    f.write_text(lines(a, v, code, local))
    assert cli("--repo", str(kit_repo), "ledger", "merge", str(f)).code == 0
    g = tmp_path / "more.jsonl"
    for fact, field in ((code, "artifact_id"), (local, "artifact_id"), (local, "verdict_id")):
        g.write_text(forged(fact, **{field: digest("nothing")}) + "\n")
        r = cli("--repo", str(kit_repo), "ledger", "merge", str(g))
        assert r.code == 14 and f"{g}:1: field {field}: {digest('nothing')} is no " in r.err, r.err
