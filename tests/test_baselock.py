"""The base lock: parsed, checked against the spec, and the drift between a lock and what was installed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from flashkit.core.errors import EngineError
from flashkit.plan import baselock
from flashkit.plan.plan import load_plan
from flashkit.plan.specfile import load_env

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env", ["cu130-torch211", "cu124-torch27"])
def test_committed_locks_fit_their_specs_and_round_trip(env):
    spec = load_env(REPO, env)
    text = (REPO / "lockfiles" / f"{env}/base.txt").read_text()
    assert baselock.check(spec, text) == []
    lock, problems = baselock.parse(text)
    assert problems == [] and baselock.format_lock(spec, lock) == text
    for stage in baselock.STAGES:
        assert set(baselock.requested(spec)[stage]) <= set(lock.pins(stage))


def test_the_base_lock_is_part_of_the_input_hash(kit_repo):
    before = load_plan(kit_repo, "cu130-torch211")
    p = kit_repo / "lockfiles" / "cu130-torch211" / "base.txt"
    p.write_text(p.read_text().replace("\nbash=", "\nbash=9:", 1))
    after = load_plan(kit_repo, "cu130-torch211")
    assert after.input_hash != before.input_hash
    assert after.manifest()["lock"]["base_sha256"] != before.manifest()["lock"]["base_sha256"]


def test_a_missing_base_lock_says_how_to_make_it(kit_repo, cli):
    (kit_repo / "lockfiles" / "cu130-torch211" / "base.txt").unlink()
    r = cli("--repo", str(kit_repo), "hash", "cu130-torch211")
    assert r.code == 5 and "flashkit base lock cu130-torch211" in r.err


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda t: t.replace("suite bookworm", "suite trixie"), "the spec needs bookworm"),
        (lambda t: t.replace("\npython3=3.11.2-1+b1\n", "\n"), "does not hold python3=3.11.2-1+b1"),
        (lambda t: t.replace("\nbash=", "\nBash!=", 1), "not a `name=version` pin"),
        (lambda t: t.replace("[runtime]", "[other]"), "section [other] is unknown"),
        (lambda t: t.replace("requested g++", "requested clang g++", 1), "other packages than the spec asks"),
    ],
)
def test_a_lock_that_does_not_fit_the_spec_is_stale(kit_repo, cli, monkeypatch, edit, needle):
    def no_engine(**_):
        raise EngineError("no engine on this host")

    # Refused before any engine is looked for: the same answer on a host that has none.
    monkeypatch.setattr("flashkit.cli.image_cmd.ensure_engine", no_engine)
    p = kit_repo / "lockfiles" / "cu130-torch211" / "base.txt"
    p.write_text(edit(p.read_text()))
    spec = load_env(kit_repo, "cu130-torch211")
    problems = baselock.check(spec, p.read_text())
    assert any(needle in q for q in problems), problems
    r = cli("--repo", str(kit_repo), "build", "cu130-torch211")
    assert r.code == 5 and "flashkit base lock cu130-torch211" in r.err


def test_drift_names_each_package():
    locked = (("bash", "5.2.15-2+b13"), ("dash", "0.5.12-2"))
    installed = (("bash", "5.2.15-2+b14"), ("zsh", "5.9-4"))
    assert baselock.drift(locked, installed) == [
        "bash: locked 5.2.15-2+b13, installed 5.2.15-2+b14",
        "dash: locked 0.5.12-2, installed (absent)",
        "zsh: locked (absent), installed 5.9-4",
    ]
    assert baselock.drift(locked, locked) == []
    assert baselock.parse_installed("dash=0.5.12-2\nbash=5.2.15-2+b13\n\n") == locked


def test_requested_packages_follow_the_compiler_source():
    pypi, debian = load_env(REPO, "cu130-torch211"), load_env(REPO, "cu124-torch27")
    assert not any(p.startswith("nvidia-cuda-toolkit") for p in baselock.requested(pypi)["builder"])
    assert "nvidia-cuda-toolkit=12.4.131~12.4.1-2" in baselock.requested(debian)["builder"]
    assert baselock.components(debian) == ("main", "contrib", "non-free")
    assert baselock.requested(dataclasses.replace(pypi))["runtime"] == (
        "python3-venv=3.11.2-1+b1",
        "python3=3.11.2-1+b1",
    )
