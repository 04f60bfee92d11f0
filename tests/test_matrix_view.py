"""`flashkit matrix`: per env, each tier's verdict at the current input hash, the wheel's local version and the
published tags, in an 80-column terminal by default; the details with --wide and --json."""

from __future__ import annotations

import json

import pytest
from kitsupport import H1, artifact, digest, full_ledger, input_hash, verdict

from flashkit.core.errors import RecordError
from flashkit.ledger import store
from flashkit.ledger.model import Publication

ENV = "cu130-torch211"
WHEEL = "flash_kernels-0.1.0+cu130torch2.11cxx11abitrue-cp310-abi3-linux_x86_64.whl"
TAGS = ("fk2-" + "e" * 60, "torch2.11-cu13.0", "torch2.11-cu13.0-py3.11-a-very-long-spec-tag-indeed")


@pytest.fixture
def recorded(kit_repo):
    """cu130-torch211 verified and published at its current input hash; cu124-torch27 only at an older one;
    cu124-torch26 with a failed cpu tier and a gpu tier that could not run."""
    art = artifact(ENV, input_hash(kit_repo, ENV))
    art = type(art)(**{**art.__dict__, "wheel": WHEEL})
    full_ledger(kit_repo, art)
    pub = Publication(
        env=ENV, input_hash=art.input_hash, date="2026-11-30T12:00:00+00:00", target="registry.test/flash",
        digest=digest("manifest"), tags=TAGS, judged_image_id=art.image_id, published_image_id=art.image_id,
        policy="full:build,abi,cpu,gpu|artifact-gpu", verified_tiers=("build", "abi", "cpu", "artifact-gpu"),
        verdict_ids=(), reused=False,
    )  # fmt: skip
    store.append(kit_repo, ENV, [pub])
    full_ledger(kit_repo, artifact("cu124-torch27", H1))
    a26 = artifact("cu124-torch26", input_hash(kit_repo, "cu124-torch26"))
    store.append(kit_repo, "cu124-torch26", [a26, verdict(a26, "build"), verdict(a26, "cpu", "failed")])
    store.append(kit_repo, "cu124-torch26", [verdict(a26, "gpu", "not-run")])
    return kit_repo


def test_the_default_fits_80_columns(cli, recorded):
    r = cli("--repo", str(recorded), "matrix")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    too_wide = [(len(x), x) for x in lines if len(x) > 80]
    assert not too_wide, too_wide
    row = next(x for x in lines if x.startswith(ENV + " "))
    assert "PPP.P." in row  # build, abi, cpu passed; gpu no verdict; artifact-gpu passed; no triton-aot verdict
    assert " +cu130t2.11-cxx11 " in row  # the local version, abbreviated (the legend says how)
    assert "fk2-eeee" in row and row.endswith("+2")  # the first tag, abbreviated, and how many more
    assert "P.F-.." in next(x for x in lines if x.startswith("cu124-torch26 "))
    assert "cu124-torch27: verdicts only at older input hashes" in lines
    assert lines[-1] == "details: flashkit matrix --wide (or --json)"
    assert not any("stable ABI" in x for x in lines)  # said only where a stable-ABI wheel is shown


def test_a_stable_abi_wheel_is_shown_whole_and_explained(cli, kit_repo):
    from flashkit.cli.matrix_cmd import STABLE_LEGEND, short_local

    assert short_local("cu13stable2.10") == "cu13stable2.10"
    stable = "flash_kernels-0.1.0+cu13stable2.10-cp310-abi3-linux_x86_64.whl"
    art = artifact(ENV, input_hash(kit_repo, ENV))
    art = type(art)(**{**art.__dict__, "wheel": stable})
    full_ledger(kit_repo, art)
    lines = cli("--repo", str(kit_repo), "matrix").out.splitlines()
    assert all(len(x) <= 80 for x in lines)
    assert " +cu13stable2.10 " in next(x for x in lines if x.startswith(ENV + " "))
    assert STABLE_LEGEND in lines


def test_a_rejected_env_still_fits_and_names_its_rule(cli, recorded):
    p = recorded / "envs" / "cu124-torch27.yaml"
    p.write_text(p.read_text().replace("cxx11_abi: true", "cxx11_abi: false"))
    r = cli("--repo", str(recorded), "matrix")
    assert r.code == 4
    assert "cu124-torch27: rejected by pypi-torch-abi" in r.out
    assert all(len(x) <= 80 for x in r.out.splitlines())


def test_wide_and_json_have_the_details(cli, recorded):
    wide = cli("--repo", str(recorded), "matrix", "--wide").out
    assert WHEEL in wide and TAGS[2] in wide and "render+lock only" in wide
    rows = {r["env"]: r for r in json.loads(cli("--repo", str(recorded), "matrix", "--json").out)}
    mine = rows[ENV]
    assert mine["tiers"] == {"build": "passed", "abi": "passed", "cpu": "passed", "artifact-gpu": "passed"}
    assert mine["wheel"] == WHEEL and mine["wheel_local"] == "cu130torch2.11cxx11abitrue"
    assert mine["published"] == list(TAGS)
    assert rows["cu124-torch26"]["tiers"]["cpu"] == "failed" and rows["cu124-torch26"]["tiers"]["gpu"] == "not-run"
    assert rows["cu124-torch27"]["tiers"] == {} and rows["cu124-torch27"]["wheel"] is None


def test_an_unreadable_ledger_is_shown_not_hidden(cli, recorded):
    """The other envs are shown; the exit code is the ledger's, as `flashkit ledger show` exits for it."""
    store.ledger_path(recorded, "cu124-torch26").write_text("{not json\n")
    r = cli("--repo", str(recorded), "matrix")
    assert r.code == RecordError.exit_code == cli("--repo", str(recorded), "ledger", "show", "cu124-torch26").code
    assert "cu124-torch26: ledger unreadable: verified/cu124-torch26.jsonl:1: not valid JSON" in r.err
    assert "?????" in next(x for x in r.out.splitlines() if x.startswith("cu124-torch26 "))
    assert all(len(x) <= 80 for x in r.out.splitlines())
