"""This project's hosts are data (flashkit/plan/hosts.toml, shipped with the package): read through the readers'
limits, checked field by field, and the only source of what `flashkit matrix` says the hosts can do."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from kitsupport import REPO

from flashkit.core.errors import SpecError
from flashkit.plan import hosts
from flashkit.plan.specfile import load_env

PACKAGED = REPO / "flashkit" / "plan" / hosts.DATA
GOOD = PACKAGED.read_text()


def test_the_packaged_facts_read_and_ship_with_the_package():
    facts = hosts.load()
    assert facts.gpu.accelerator == "cuda" and facts.gpu.cuda_major == int(facts.gpu.cuda.split(".")[0])
    assert set(facts.unreachable) <= {"ngc", "cuda", "rocm", "debian"}
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert hosts.DATA in package_data["flashkit.plan"]


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ('sm = "9.0"', "sm = 9.0", "gpu_host.sm: 9.0 is not valid"),
        ('sm = "9.0"', 'sm = "sm_90"', "gpu_host.sm: 'sm_90' is not valid"),
        ('cuda = "13.0"\n', "", "gpu_host.cuda: missing"),
        ('gpu = "H200"', 'gpu = "H200"\nmemory = "141 GB"', "gpu_host.memory: unknown field"),
        ('accelerator = "cuda"', 'accelerator = "metal"', "gpu_host.accelerator: 'metal' is not valid"),
        ("rocm = ", "rocmm = ", "build_host.unreachable.rocmm: unknown field"),
        ('ngc = "nvcr.io is unreachable from the build host"', 'ngc = ""', "build_host.unreachable.ngc: ''"),
        ("[gpu_host]", "[gpu_hosts]", "gpu_hosts: unknown table"),
        ('torch = "2.11"', 'torch = "2.11', "not valid TOML"),
    ],
)
def test_bad_facts_name_the_file_and_the_field(tmp_path: Path, old: str, new: str, field: str):
    assert old in GOOD
    path = tmp_path / hosts.DATA
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(SpecError) as info:
        hosts.load(path)
    assert f"{path}: {field}" in str(info.value)
    assert info.value.hint and str(path) in info.value.hint


def test_the_file_is_read_through_the_readers_limits(tmp_path: Path):
    big = tmp_path / "big.toml"
    big.write_text(GOOD + "#" * hosts.MAX_BYTES)
    with pytest.raises(SpecError, match="larger than 16 KiB"):
        hosts.load(big)
    with pytest.raises(SpecError, match="is a directory"):
        hosts.load(tmp_path)


def test_what_the_hosts_can_do_follows_the_facts():
    spec = load_env(REPO, "cu130-torch211")
    facts = hosts.load()
    assert hosts.support(spec, facts).summary() == "build, cpu+gpu tests"
    newer = dataclasses.replace(facts, gpu=dataclasses.replace(facts.gpu, torch="2.12", cuda="13.1"))
    moved = hosts.support(spec, newer)  # a stable-ABI wheel of torch 2.11 still loads under torch 2.12
    assert moved.gpu_tier and "under its torch 2.12" in moved.why[-1]
    no_gpu = dataclasses.replace(facts, gpu=dataclasses.replace(facts.gpu, sm="10.0"))
    assert hosts.support(spec, no_gpu).summary() == "build, cpu tests"
    docker_hub = dataclasses.replace(facts, unreachable={**facts.unreachable, "debian": "no mirror"})
    assert hosts.support(spec, docker_hub).why[0] == "image not buildable here: no mirror"


def test_matrix_says_which_host_fact_is_wrong(kit_repo, cli, monkeypatch, tmp_path: Path):
    bad = tmp_path / hosts.DATA
    bad.write_text(GOOD.replace('sm = "9.0"', "sm = 9.0"))
    real = hosts.load.__wrapped__  # the reader itself, uncached, given the bad file in place of the packaged one
    monkeypatch.setattr(hosts, "load", lambda: real(bad))
    res = cli("--repo", str(kit_repo), "matrix")
    assert res.code == SpecError.exit_code
    assert f"{bad}: gpu_host.sm: 9.0 is not valid; expected its compute capability" in res.err
