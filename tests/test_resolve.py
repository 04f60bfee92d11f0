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


# -- when nothing fits: the nearest fit first, or "nothing near" ---------------------------------------------


def _stderr_after_header(err: str) -> list[str]:
    lines = err.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("flashkit resolve:")) + 1 :]


def test_another_cuda_major_names_the_nearest_fit_first(cli, verified):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", "2.11.0", "--cuda", "12.8", "--python", "3.12")
    assert r.code == NO_FIT and r.out == ""
    first, changes, ask = _stderr_after_header(r.err)[:3]
    assert first == f"nearest fit: torch 2.11.0 with CUDA 13.0, Python 3.12 ({ENV})"
    assert changes == "  changes: CUDA 12.8 -> 13.0 (driver >= 580.65.06)"
    assert ask == "  ask: flashkit resolve --torch 2.11.0 --cuda 13.0 --python 3.12"
    # What it names is a fit: asked as it says, resolve answers with that env.
    again = resolve(cli, repo, *ask.split()[3:])
    assert again.code != NO_FIT and f"fits: {ENV}" in again.err
    # The closing advice is for a user: no maintainer's work (a new spec), and doctor for the symptom.
    assert "envs/<id>.yaml" not in r.err and "nox -s" not in r.err
    assert "`flashkit doctor`" in r.err.splitlines()[-1] and "undefined symbol" in r.err.splitlines()[-1]


def test_json_of_no_fit_has_the_nearest_fit_and_the_maintainers_hint(cli, verified):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", "2.11.0", "--cuda", "12.8", "--python", "3.12", "--json")
    assert r.code == NO_FIT
    doc = json.loads(r.out)
    assert doc["nearest"] == {
        "env": ENV,
        "query": {
            "accelerator": "cuda", "torch": "2.11.0", "accel_version": "13.0", "cxx11_abi": None, "python": "3.12",
            "driver": None, "capabilities": [],
        },
        "changes": ["CUDA 12.8 -> 13.0 (driver >= 580.65.06)"],
        "published": True,
    }  # fmt: skip
    assert doc["nothing_near"] is None and "envs/<id>.yaml" in doc["maintainer_hint"]
    fit = json.loads(resolve(cli, repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.12", "--json").out)
    assert fit["nearest"] is None and fit["maintainer_hint"] is None


@pytest.mark.parametrize(
    ("args", "first", "changes"),
    [
        # A torch outside the matrix: its torch (and the CUDA that torch's requirements bring).
        (
            ("--torch", "2.4.1", "--cuda", "12.4", "--python", "3.12"),
            f"torch 2.11.0 with CUDA 13.0, Python 3.12 ({ENV})",
            "torch 2.4 -> 2.11; CUDA 12.4 -> 13.0 (driver >= 580.65.06)",
        ),
        # A Python the env does not cover: the nearest one it does.
        (
            ("--torch", "2.11.0", "--cuda", "13.0", "--python", "3.9"),
            f"torch 2.11.0 with CUDA 13.0, Python 3.10 ({ENV})",
            "Python 3.9 -> 3.10",
        ),
        # The other C++ ABI: named, as the query named one.
        (
            ("--torch", "2.11.1", "--cuda", "13.0", "--python", "3.12", "--no-cxx11-abi"),
            f"torch 2.11.1 with CUDA 13.0, Python 3.12, cxx11 ABI ({ENV})",
            "C++ ABI pre-cxx11 -> cxx11",
        ),
    ],
)
def test_the_nearest_fit_changes_only_what_it_must(cli, verified, args, first, changes):
    repo, _ = verified
    r = resolve(cli, repo, *args)
    assert r.code == NO_FIT
    got = _stderr_after_header(r.err)
    assert got[:2] == [f"nearest fit: {first}", f"  changes: {changes}"]
    again = resolve(cli, repo, *got[2].split()[3:])
    assert again.code != NO_FIT and f"fits: {ENV}" in again.err, got[2]


def test_fewest_changes_first_then_the_newest_torch(cli, kit_repo):
    """torch 2.6 on CUDA 13: cu124-torch26 (another CUDA major) and cu130-torch211/212 (another torch) each
    need one change; the newest torch wins. With Python 3.9, which torch 2.11 and 2.12 do not cover,
    cu124-torch26 needs one change and they two: the fewest changes win."""
    for env in ("cu124-torch26", ENV, "cu130-torch212"):
        art = artifact(env, input_hash(kit_repo, env))
        full_ledger(kit_repo, art)
        store.append(kit_repo, env, [wheel_publication(art, pythons=("3.9", "3.10", "3.11", "3.12", "3.13"))])
    r = resolve(cli, kit_repo, "--torch", "2.6.0", "--cuda", "13.0", "--python", "3.12")
    assert _stderr_after_header(r.err)[0] == "nearest fit: torch 2.12.0 with CUDA 13.0, Python 3.12 (cu130-torch212)"
    r = resolve(cli, kit_repo, "--torch", "2.6.0", "--cuda", "13.0", "--python", "3.9")
    assert _stderr_after_header(r.err)[:2] == [
        "nearest fit: torch 2.6.0 with CUDA 12.4, Python 3.9 (cu124-torch26)",
        "  changes: CUDA 13.0 -> 12.4 (driver >= 525.60.13)",
    ]


def test_nothing_near_is_said_and_a_gpu_vendor_is_never_changed(cli, verified, kit_repo):
    repo, _ = verified
    r = resolve(cli, repo, "--torch", "2.7.1", "--rocm", "6.4", "--python", "3.12")
    assert r.code == NO_FIT
    assert _stderr_after_header(r.err)[0] == (
        "nothing near: no ROCm env of the matrix is verified and installable (rocm64-torch27)"
    )
    assert "nearest fit" not in r.err  # a verified CUDA build is no answer for an AMD GPU
    assert "`flashkit matrix`" in r.err.splitlines()[-1] and "`flashkit doctor`" in r.err.splitlines()[-1]
    doc = json.loads(resolve(cli, repo, "--torch", "2.7.1", "--rocm", "6.4", "--python", "3.12", "--json").out)
    assert doc["nearest"] is None and doc["nothing_near"].startswith("no ROCm env")


def test_not_verified_anywhere_is_nothing_near(cli, kit_repo):
    r = resolve(cli, kit_repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.12")
    assert r.code == NO_FIT
    assert _stderr_after_header(r.err)[0].startswith("nothing near: no CUDA env of the matrix is verified")


def test_the_seed_user_fits(cli, kit_repo):
    """PyPI's torch 2.7.1 reports CUDA 12.6 (its lockfile's runtime) beside the env's nvcc 12.4: a fit, verified
    in this repository's ledger (through identical device code); published, its one command."""
    import shutil

    from kitsupport import REPO

    r = cli("--repo", str(REPO), "resolve", "--torch", "2.7.1", "--cuda", "12.6", "--python", "3.11")
    assert r.code == 35 and "verified, not published: cu124-torch27" in r.err, r.err  # nothing published here
    shutil.copytree(REPO / "verified", kit_repo / "verified")
    shutil.rmtree(kit_repo / "flash_kernels")
    shutil.copytree(REPO / "flash_kernels", kit_repo / "flash_kernels")  # the real sources: the real input hash
    art = store.load(kit_repo, "cu124-torch27").artifacts(input_hash(kit_repo, "cu124-torch27"))[-1]
    store.append(kit_repo, "cu124-torch27", [wheel_publication(art, pythons=("3.11",))])
    r = cli("--repo", str(kit_repo), "resolve", "--torch", "2.7.1", "--cuda", "12.6", "--python", "3.11")
    assert r.code == 0, r.err
    assert r.out == "pip install --require-hashes -r https://flash.example/requirements/cu124-torch27/py3.11.txt\n"


def test_a_5000_digit_torch_is_a_usage_error(cli, kit_repo):
    r = resolve(cli, kit_repo, "--torch", "2." + "9" * 5000, "--python", "3.12")
    assert r.code == 2 and "--torch" in r.err and "Traceback" not in r.err


@pytest.mark.parametrize("json_out", [False, True])
def test_an_unreadable_ledger_gives_its_own_exit_code_after_the_answer(cli, verified, json_out):
    """As `flashkit ledger show` gives it (14): the answer among the other envs is still printed."""
    repo, _ = verified
    (repo / "verified" / "cu124-torch27.jsonl").write_text('{"kind": "artifact", "not": "a fact"}\n')
    r = resolve(cli, repo, "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.12", *(["--json"] if json_out else []))
    assert r.code == 14, r.err
    assert "cu124-torch27: ledger unreadable" in r.err
    assert (json.loads(r.out)["fits"][0]["env"] if json_out else r.out.split()[-1]).startswith(
        ENV if json_out else "https://flash.example/"
    )
