"""Importing an artifact-gpu result: forged, mismatched or incomplete results are refused, each with its code.

The results and JUnit reports here are made the way a GPU host makes them: the report by a real pytest run,
the result with the fields ``python -m flashkit.evidence.artifact_check`` writes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from kitsupport import H2, artifact, digest, input_hash, snapshot

from flashkit.core.names import Tier
from flashkit.ledger import store

ENV = "cu130-torch211"
HOST = {
    "gpu": "NVIDIA H200",
    "driver": "580.159.04",
    "torch": "2.11.0+cu130",
    "torch_cuda": "13.0",
    "capability": "9.0",
    "cuda_available": "True",
    "python": "3.12.3",
}


@pytest.fixture(scope="module")
def junit_reports(tmp_path_factory) -> dict[str, bytes]:
    """Real pytest JUnit reports: one that passes (3 passed, 1 skipped) and one with a failure."""
    d = tmp_path_factory.mktemp("suite")
    (d / "test_ok.py").write_text(
        "import pytest\n"
        "def test_a(): pass\ndef test_b(): pass\ndef test_c(): pass\n"
        "@pytest.mark.skip(reason='needs another GPU')\ndef test_d(): pass\n"
    )
    (d / "test_bad.py").write_text("def test_a(): pass\ndef test_b(): assert 1 == 2, 'max err 0.5 > 0.01'\n")
    out = {}
    for name in ("ok", "bad"):
        report = d / f"{name}.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                str(d / f"test_{name}.py"),
                f"--junitxml={report}",
            ],
            capture_output=True,
            cwd=d,
        )
        out[name] = report.read_bytes()
    return out


@pytest.fixture
def repo(kit_repo):
    """kit_repo with a build of ENV in its ledger at the current input hash."""
    h = input_hash(kit_repo, ENV)
    store.append(kit_repo, ENV, [artifact(ENV, h, wheel="ab" * 32)])
    return kit_repo


def write_result(where: Path, repo: Path, report: bytes | None, **changes) -> Path:
    """A result.json (+ its JUnit report beside it) as artifact_check writes them, then ``changes``."""
    where.mkdir(parents=True, exist_ok=True)
    result = {
        "schema": 2,
        "tier": "artifact-gpu",
        "env": ENV,
        "input_hash": input_hash(repo, ENV),
        "wheel": "flash_kernels-0.1.0-cp310-abi3-linux_x86_64.whl",
        "judged": {"wheel_sha256": "ab" * 32},
        "host": dict(HOST),
        "verdict": "passed",
        "counts": {"tests": 4, "passed": 3, "skipped": 1, "failed": 0, "errors": 0},
        "reasons": ["3 passed, 1 skipped of 4 on NVIDIA H200"],
        "evidence": {},
        "duration_s": 12.5,
        "date": "2026-12-01T12:00:00+00:00",
    }
    if report is not None:
        (where / "result.junit.xml").write_bytes(report)
        result["evidence"] = {"junit": "result.junit.xml", "junit_sha256": hashlib.sha256(report).hexdigest()}
    for key, value in changes.items():
        if value is KeyError:
            result.pop(key)
        elif isinstance(value, dict) and isinstance(result.get(key), dict) and key != "judged":
            result[key] = {**result[key], **value}
        else:
            result[key] = value
    (where / "result.json").write_text(json.dumps(result))
    return where / "result.json"


def run_import(cli, repo: Path, result: Path, *extra: str):
    before = snapshot(repo)
    res = cli("--repo", str(repo), "verify", "import-artifact-result", ENV, str(result), *extra)
    assert "Traceback" not in res.err and res.code != 1, res.err
    return res, before


def test_a_real_result_is_imported_with_counts_recomputed_from_its_report(repo, cli, tmp_path, junit_reports):
    result = write_result(tmp_path / "r", repo, junit_reports["ok"])
    res, _ = run_import(cli, repo, result)
    assert res.code == 0, res.err
    (v,) = store.load(repo, ENV).verdicts()
    assert v.tier == "artifact-gpu" and v.passed and v.source == "imported"
    assert v.counts == {"tests": 4, "passed": 3, "skipped": 1, "failed": 0, "errors": 0}
    assert v.evidence["junit_sha256"] == hashlib.sha256(junit_reports["ok"]).hexdigest()
    assert v.evidence["result_sha256"] == hashlib.sha256(result.read_bytes()).hexdigest()
    assert "counts recomputed from the JUnit report" in res.out


def test_a_failed_run_is_evidence_too(repo, cli, tmp_path, junit_reports):
    counts = {"tests": 2, "passed": 1, "skipped": 0, "failed": 1, "errors": 0}
    result = write_result(tmp_path / "r", repo, junit_reports["bad"], verdict="failed", counts=counts)
    res, _ = run_import(cli, repo, result)
    assert res.code == 16
    (v,) = store.load(repo, ENV).verdicts()
    assert v.verdict == "failed" and v.counts == counts


def test_a_not_run_result_without_a_report_is_recorded_as_not_run(repo, cli, tmp_path):
    result = write_result(
        tmp_path / "r",
        repo,
        None,
        verdict="not-run",
        counts={},
        reasons=["host torch 2.7.1 is not the env's torch 2.11.x"],
    )
    res, _ = run_import(cli, repo, result)
    assert res.code == 16 and store.load(repo, ENV).verdicts()[0].verdict == "not-run"


def test_an_imported_verdict_reaches_the_envs_that_install_that_wheel(repo, cli, tmp_path, junit_reports):
    """cu130-torch215 installs the wheel cu130-torch211 built (wheel_from); the H200 runs torch 2.11, so the
    result is imported for cu130-torch211 and applies, recorded as such, in cu130-torch215's own ledger."""
    import dataclasses

    from flashkit.ledger import gate

    user = dataclasses.replace(
        artifact("cu130-torch215", H2, image=digest("215 image"), wheel="ab" * 32),
        wheel_from={"env": ENV, "input_hash": input_hash(repo, ENV)},
    )
    store.append(repo, "cu130-torch215", [user])
    res, _ = run_import(cli, repo, write_result(tmp_path / "r", repo, junit_reports["ok"]))
    assert res.code == 0, res.err
    assert "applies to cu130-torch215 too" in res.out and "verified/cu130-torch215.jsonl" in res.out
    (v,) = store.load(repo, ENV).verdicts()
    led = store.load(repo, "cu130-torch215")
    (applies,) = led.applies()
    assert applies.source_env == ENV and applies.verdict_id == v.id and applies.artifact_id == user.id
    assert "NVIDIA H200" in applies.because and "torch 2.11.0+cu130" in applies.because
    assert gate.judgements(led, user)[Tier.ARTIFACT_GPU].passed
    # Imported again: no second applies.
    run_import(cli, repo, write_result(tmp_path / "r", repo, junit_reports["ok"]))
    assert len(store.load(repo, "cu130-torch215").applies()) == 1


FORGED = {
    # exit 23: the result disagrees with the report it came with
    "counts-inflated": (23, "field counts", {"counts": {"tests": 1501, "passed": 1208, "skipped": 293}}),
    "passed-but-report-failed": (23, "field counts", {}),  # the bad report under a passing result
    "report-tampered": (23, "evidence.junit_sha256", {"evidence": {"junit_sha256": "0" * 64}}),
    "report-missing": (23, "field evidence.junit", {"evidence": {"junit": "gone.junit.xml"}}),
    "report-name-escapes": (23, "field evidence.junit", {"evidence": {"junit": "../../etc/passwd"}}),
    # exit 24: ran on something else than the env
    "another-env": (24, "field env", {"env": "cu124-torch27"}),
    "another-torch": (24, "field host.torch", {"host": {"torch": "2.7.1+cu126"}}),
    "another-cuda": (24, "field host.torch_cuda", {"host": {"torch_cuda": "12.8"}}),
    "gpu-not-in-targets": (24, "field host.capability", {"host": {"capability": "7.5"}}),
    "no-capability": (24, "field host.capability", {"host": {"capability": ""}}),
    # exit 25: judged a wheel no build produced
    "unknown-wheel": (25, "field judged.wheel_sha256", {"judged": {"wheel_sha256": "cd" * 32}}),
    "unknown-input-hash": (25, "field judged.wheel_sha256", {"input_hash": "fk1-" + "ee" * 32}),
    # exit 22: not a complete, well-formed result
    "env-with-dotdot": (22, "field env", {"env": "../../../tmp/x"}),
    "env-with-newline": (22, "field env", {"env": ENV + "\n"}),
    "judged-empty": (22, "field judged", {"judged": {}}),
    "judged-extra-key": (22, "field judged", {"judged": {"wheel_sha256": "ab" * 32, "image_id": "x"}}),
    "input-hash-garbage": (22, "field input_hash", {"input_hash": "sha256:abc"}),
    "verdict-unknown": (22, "field verdict", {"verdict": "mostly"}),
    "negative-count": (22, "field counts.passed", {"counts": {"passed": -3}}),
    "bool-count": (22, "field counts.tests", {"counts": {"tests": True}}),
    "host-control-char": (22, "field host.gpu", {"host": {"gpu": "H200\x1b[31m"}}),
    "host-odd-key": (22, "field host", {"host": {"a b": "x"}}),
    "reasons-not-text": (22, "field reasons", {"reasons": [1, 2]}),
    "date-garbage": (22, "field date", {"date": "yesterday"}),
    "wrong-tier": (22, "field tier", {"tier": "cpu"}),
    "wrong-schema": (22, "field schema", {"schema": 1}),
    "duration-text": (22, "field duration_s", {"duration_s": "12s"}),
}


@pytest.mark.parametrize("case", FORGED, ids=list(FORGED))
def test_forged_mismatched_or_incomplete_results_are_refused(case, repo, cli, tmp_path, junit_reports):
    code, field, changes = FORGED[case]
    report = junit_reports["bad" if case == "passed-but-report-failed" else "ok"]
    result = write_result(tmp_path / "r", repo, report, **changes)
    res, before = run_import(cli, repo, result)
    assert res.code == code, res.err
    assert field in res.err and str(result.parent) in res.err
    assert snapshot(repo) == before  # nothing written, not even outside verified/
    assert store.load(repo, ENV).verdicts() == []


@pytest.mark.parametrize("key", ["env", "input_hash", "judged", "host", "verdict", "counts", "evidence", "date"])
def test_a_result_missing_a_field_is_refused(key, repo, cli, tmp_path, junit_reports):
    result = write_result(tmp_path / "r", repo, junit_reports["ok"], **{key: KeyError})
    res, before = run_import(cli, repo, result)
    assert res.code == 22 and f"field {key}: missing" in res.err
    assert snapshot(repo) == before


@pytest.mark.parametrize(
    "text, needle",
    [("[1, 2, 3]", "a result is a JSON object"), ('{"schema": 2, "tier": ', "not valid JSON"), ("", "not valid JSON")],
)
def test_a_result_that_is_not_a_result_object_is_refused(text, needle, repo, cli, tmp_path):
    p = tmp_path / "result.json"
    p.write_text(text)
    res, before = run_import(cli, repo, p)
    assert res.code == 22 and needle in res.err and str(p) in res.err
    assert snapshot(repo) == before


def test_a_report_with_entity_declarations_is_refused(repo, cli, tmp_path):
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>'
        b'<testsuites><testsuite tests="1"><testcase classname="a" name="b">&lol2;</testcase></testsuite></testsuites>'
    )
    result = write_result(
        tmp_path / "r", repo, bomb, counts={"tests": 1, "passed": 1, "skipped": 0, "failed": 0, "errors": 0}
    )
    res, _ = run_import(cli, repo, result)
    assert res.code == 23 and "declares a DTD or entities" in res.err


def test_the_report_may_be_named_on_the_command_line(repo, cli, tmp_path, junit_reports):
    result = write_result(tmp_path / "r", repo, junit_reports["ok"])
    moved = tmp_path / "elsewhere.xml"
    (tmp_path / "r" / "result.junit.xml").rename(moved)
    assert run_import(cli, repo, result)[0].code == 23
    res, _ = run_import(cli, repo, result, "--junit", str(moved))
    assert res.code == 0, res.err


_IMPORT_LOOP = """
import sys
from flashkit.cli.main import main
repo, env, *results = sys.argv[1:]
for r in results:
    code = main(["--repo", repo, "verify", "import-artifact-result", env, r])
    if code != 0:
        sys.exit(code)
"""


def test_two_importers_at_once_lose_nothing(repo, tmp_path, junit_reports):
    """Two real processes append 12 results each to one ledger at the same time: all 24 are there."""
    batches = []
    for who in ("a", "b"):
        batch = []
        for i in range(12):
            result = write_result(
                tmp_path / who / str(i), repo, junit_reports["ok"], date=f"2026-12-01T12:{i:02d}:0{ord(who) % 10}+00:00"
            )
            batch.append(str(result))
        batches.append(batch)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _IMPORT_LOOP, str(repo), ENV, *b], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for b in batches
    ]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
    ledger = store.load(repo, ENV)
    assert len(ledger.verdicts()) == 24
    text = store.ledger_path(repo, ENV).read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 25  # the artifact and 24 verdicts, whole lines
