"""`flashkit resolve`: the verified build that fits a named torch/CUDA/Python, or why none does.

Ledgers are written in a throwaway checkout with the kit's own fact constructors and `store.append`, at
each env's real current input hash (or another one, for "not verified at this hash").
"""

from __future__ import annotations

import json

import pytest
from kitsupport import H1, artifact, digest, full_ledger, input_hash, wheel_publication

from flashkit.core.errors import EXIT_CODES, NoVerifiedFit
from flashkit.ledger import store
from flashkit.ledger.model import Publication

ENV = "cu130-torch211"  # torch 2.11.0, CUDA 13.0, image Python 3.11, requirements for 3.10-3.14, cxx11 ABI
NO_FIT = NoVerifiedFit.exit_code


@pytest.fixture
def verified(kit_repo):
    """kit_repo with cu130-torch211 verified (build, abi, cpu, artifact-gpu passed) at its current input hash, and
    its wheel published at https://flash.example/."""
    art = artifact(ENV, input_hash(kit_repo, ENV))
    full_ledger(kit_repo, art)
    store.append(kit_repo, ENV, [wheel_publication(art)])
    return kit_repo, art


URL = f"https://flash.example/requirements/{ENV}"


def resolve(cli, repo, *args):
    return cli("--repo", str(repo), "resolve", *args)


def test_exit_33_is_in_the_table():
    assert NO_FIT == 33 and dict(EXIT_CODES)["33"].startswith("resolve: no verified build fits")


def test_a_verified_env_gives_the_exact_pip_line_for_that_python(cli, verified):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.12")
    assert r.code == 0, r.err
    # One command on stdout, the published file that pins torch and the kernel wheel; the rest is explanation.
    assert r.out.splitlines() == [f"pip install --require-hashes -r {URL}/py3.12.txt"]
    assert f"fits: {ENV}" in r.err
    assert f"or, with uv: uv pip install --require-hashes -r {URL}/py3.12.txt" in r.err
    assert (
        f"into a new venv only (it uninstalls what the file does not list): uv pip sync --require-hashes {URL}/py3.12.txt"
        in r.err
    )
    assert f"pip install --require-hashes -r {URL}/py3.12-test.txt" in r.err


def test_verified_but_not_published_says_so_and_how_to_build_it(cli, kit_repo):
    full_ledger(kit_repo, artifact(ENV, input_hash(kit_repo, ENV)))
    r = resolve(cli, kit_repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.12")
    assert r.code == 35 and r.out == ""
    assert f"verified, not published: {ENV}" in r.err
    assert "nothing of it is published yet" in r.err and f"nox -s test-{ENV}" in r.err


def test_a_local_version_names_the_cuda_and_a_patch_is_only_a_note(cli, verified):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", "2.11.1+cu130", "--python", "3.13", "--cxx11-abi")
    assert r.code == 0, r.err
    assert f"{URL}/py3.13.txt" in r.out
    assert "note: torch patch 2.11.0 (here 2.11.1)" in r.err


@pytest.mark.parametrize(
    ("torch", "note"),
    [
        ("2.11.0a0+b4e4ee81d3", "note: torch patch 2.11.0 (here 2.11.0a0)"),  # as NGC's torch spells itself
        ("2.11.0+git1234abc", None),  # a source build's local label is the builder's, not part of the version
    ],
)
def test_a_pre_release_or_a_builders_label_is_a_torch_version(cli, verified, torch, note):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", torch, "--cuda", "13.0", "--python", "3.12")
    assert r.code == 0, r.err
    assert f"{URL}/py3.12.txt" in r.out
    assert (note in r.err) if note else ("torch patch" not in r.err), r.err


def test_json_of_a_fit(cli, verified):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.11", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    (fit,) = doc["fits"]
    assert fit["env"] == ENV and fit["verified"] and fit["requirements"] == f"{URL}/py3.11.txt"
    assert fit["tests"] == f"{URL}/py3.11-test.txt" and fit["unpublished"] is False
    assert doc["reason"] is None and doc["query"]["torch"] == "2.11.0"


def test_a_torch_outside_the_matrix_says_so(cli, verified):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", "2.4.1", "--cuda", "12.4", "--python", "3.12")
    assert r.code == NO_FIT and r.out == ""
    assert (
        "torch 2.4 is not in the matrix (it has torch 2.6, 2.7, 2.8, 2.9, 2.10, 2.11, 2.12, 2.13, 2.14, 2.15)" in r.err
    )
    assert "Traceback" not in r.err
    doc = json.loads(resolve(cli, repo, "--torch", "2.4.1", "--python", "3.12", "--json").out)
    assert doc["fits"] == [] and doc["others"] == [] and "not in the matrix" in doc["reason"]


def test_in_the_matrix_but_not_verified(cli, kit_repo):
    r = resolve(cli, kit_repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.12")
    assert r.code == NO_FIT
    assert f"does not fit: {ENV}" in r.err and "not verified" in r.err
    assert (
        "torch 2.11 is in the matrix (cu130-torch211, cu130-torch211-py313), but no verified build of it fits" in r.err
    )


def test_verified_only_at_an_older_input_hash_does_not_count(cli, kit_repo):
    full_ledger(kit_repo, artifact(ENV, H1))
    r = resolve(cli, kit_repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.12", "--json")
    assert r.code == NO_FIT
    others = {o["env"]: o for o in json.loads(r.out)["others"]}
    assert sorted(others) == [ENV, f"{ENV}-py313"]  # the same torch in a Python 3.13 image, never verified here
    assert others[ENV]["verified"] is False
    assert any("not verified at this input hash" in w for w in others[ENV]["why_not"])


def test_a_weaker_policy_is_asked_for_by_name(cli, kit_repo):
    art = artifact(ENV, input_hash(kit_repo, ENV))
    full_ledger(kit_repo, art, tiers=("build", "abi", "cpu"))
    store.append(kit_repo, ENV, [wheel_publication(art)])
    args = ("--torch", "2.11.0", "--cuda", "13.0", "--python", "3.12")
    r = resolve(cli, kit_repo, *args)
    assert r.code == NO_FIT and "gpu: not verified" in r.err
    assert resolve(cli, kit_repo, *args, "--policy", "no-gpu").code == 0


def test_a_python_the_env_does_not_cover(cli, verified):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.9")
    assert r.code == NO_FIT
    assert "no requirements for python 3.9 (torch 2.11.0 has no wheels for Python 3.9" in r.err


def test_another_cuda_major_or_abi_rules_the_build_out(cli, verified):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", "2.11.0", "--cuda", "12.8", "--python", "3.12", "--json")
    assert r.code == NO_FIT
    other = {o["env"]: o for o in json.loads(r.out)["others"]}[ENV]
    assert other["verified"] is True and other["why_not"] == ["CUDA 13.0 (torch here uses 12.8)"]
    r = resolve(cli, repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.12", "--no-cxx11-abi")
    assert r.code == NO_FIT and "cxx11_abi true (torch here: false)" in r.err
    r = resolve(cli, repo, "--torch", "2.11.0", "--rocm", "6.4", "--python", "3.12")
    assert r.code == NO_FIT and "accelerator cuda (here rocm)" in r.err


def test_a_published_image_is_named_for_the_image_python(cli, verified):
    repo, art = verified
    pub = Publication(
        env=ENV, input_hash=art.input_hash, date="2026-11-30T12:00:00+00:00", target="registry.test/flash",
        digest=digest("manifest"), tags=("torch2.11-cu13.0",), judged_image_id=art.image_id,
        published_image_id=art.image_id, policy="full:build,abi,cpu,gpu|artifact-gpu",
        verified_tiers=("build", "abi", "cpu", "artifact-gpu"), verdict_ids=(), reused=False,
    )  # fmt: skip
    store.append(repo, ENV, [pub])
    r = resolve(cli, repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.11")
    assert r.code == 0, r.err
    # Check the card's tag, then pull the digest it names (a tag can move after the check).
    assert r.out.splitlines()[1:] == [
        "flashkit verify-image registry.test/flash:torch2.11-cu13.0 --key flashkit.pub",
        f"docker pull registry.test/flash@{digest('manifest')}",
    ]
    # On another Python the image does not fit, the requirements still do.
    assert "verify-image" not in resolve(cli, repo, "--torch", "2.11.0", "--python", "3.12").out


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (("--torch", "two"), "--torch two"),
        (("--torch", "2.11.0", "--cuda", "13"), "--cuda 13"),
        (("--torch", "2.11.0", "--python", "3"), "--python 3"),
        (("--torch", "2.11.0", "--policy", "fulll"), "--policy"),
    ],
)
def test_bad_input_names_the_flag(cli, kit_repo, args, names):
    r = resolve(cli, kit_repo, *args)
    assert r.code == 2 and names in r.err and "Traceback" not in r.err
