"""`flashkit ledger merge`: CI jobs' ledger lines appended to verified/<env>.jsonl, checked, deduplicated by
fact id, in order, never overwriting what is there."""

from __future__ import annotations

import json
from pathlib import Path

from kitsupport import H1, H2, artifact, digest, verdict

from flashkit.ledger import store

ENV = "cu130-torch211"


def lines(*facts) -> str:
    return "".join(f.line() + "\n" for f in facts)


def test_merges_jobs_lines_in_order_and_only_once(cli, kit_repo, tmp_path):
    old = artifact(ENV, H1)
    store.append(kit_repo, ENV, [old, verdict(old, "build")])
    before = store.ledger_path(kit_repo, ENV).read_bytes()
    new = artifact(ENV, H2, image=digest("image2"), date="2026-12-01T10:00:00+00:00")
    other = artifact("cu124-torch27", H2)
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
    assert r.code == 14 and f"{f}:2: not a JSON object" in r.err
    assert not Path(store.ledger_path(kit_repo, ENV)).exists()
