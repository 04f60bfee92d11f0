"""`flashkit wheelhouse --all`: one PEP 503 index over every env's verified wheel, each env's requirements
beside it, the envs without a verified wheel listed as skipped, written whole or not at all."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from kitsupport import artifact, cached_build, fresh_venv, full_ledger, input_hash, make_wheel, pip, snapshot

LOCAL = {
    "cu130-torch211": "0.1.0+cu130torch2.11cxx11abitrue",
    "cu124-torch27": "0.1.0+cu124torch2.7cxx11abitrue",
}


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def built(repo: Path, env: str, wheel: Path) -> str:
    """A cached build result of the env's current input hash that exported ``wheel``; returns the image id."""
    h = input_hash(repo, env)
    image = "sha256:" + hashlib.sha256(env.encode()).hexdigest()
    cached_build(repo, env, h, wheel, image)
    return image


@pytest.fixture
def two_verified(kit_repo, tmp_path):
    """cu130-torch211 and cu124-torch27 built and verified; cu124-torch26 built but only its cpu tier ran."""
    wheels = {}
    for env, version in LOCAL.items():
        wheels[env] = make_wheel(tmp_path / "exported" / env, "flash_kernels", version, "flash_kernels")
        image = built(kit_repo, env, wheels[env])
        full_ledger(kit_repo, artifact(env, input_hash(kit_repo, env), image=image, wheel=sha(wheels[env])))
    w26 = make_wheel(tmp_path / "exported" / "26", "flash_kernels", "0.1.0+cu124torch2.6cxx11abifalse", "fk")
    image = built(kit_repo, "cu124-torch26", w26)
    art = artifact("cu124-torch26", input_hash(kit_repo, "cu124-torch26"), image=image, wheel=sha(w26))
    full_ledger(kit_repo, art, tiers=("cpu",))
    return kit_repo, wheels


def test_one_index_for_every_verified_wheel(cli, two_verified, tmp_path):
    repo, wheels = two_verified
    out = tmp_path / "all"
    r = cli("--repo", str(repo), "wheelhouse", "--all", "--out", str(out))
    assert r.code == 0, r.err
    skipped = len(list((repo / "envs").glob("*.yaml"))) - 2  # every other env: no verified wheel in this ledger
    assert f"2 verified wheel(s); {skipped} env(s) skipped" in r.out
    page = (out / "simple" / "flash-kernels" / "index.html").read_text()
    for env, whl in wheels.items():
        assert whl.name.startswith(f"flash_kernels-{LOCAL[env]}-")  # the local version stays in the name
        assert f'href="../../files/{whl.name}#sha256={sha(whl)}"' in page
        assert sha(out / "files" / whl.name) == sha(whl)
        assert f"{sha(whl)}  {whl.name}" in (out / "files" / "SHA256SUMS").read_text()
        # Each env keeps the layout of `flashkit wheelhouse ENV`, its requirements pinned by hash.
        req = (out / env / "requirements.txt").read_text()
        assert f"flash-kernels=={LOCAL[env]} \\\n    --hash=sha256:{sha(whl)}" in req
        assert (out / env / "py3.12.txt").is_file() and (out / env / "files" / whl.name).is_file()
    doc = json.loads((out / "wheelhouse.json").read_text())
    assert sorted(doc["envs"]) == sorted(LOCAL)
    assert "cpu: passed" not in doc["skipped"]["cu124-torch26"]
    assert "build: not verified" in doc["skipped"]["cu124-torch26"]
    assert "no wheel of its current input hash" in doc["skipped"]["cu128-torch28"]
    assert "skipped cu124-torch26:" in r.err


def test_the_index_serves_each_wheel_by_its_local_version(cli, two_verified, tmp_path):
    repo, wheels = two_verified
    out = tmp_path / "all"
    assert cli("--repo", str(repo), "wheelhouse", "--all", "--out", str(out)).code == 0
    want = f"flash-kernels=={LOCAL['cu124-torch27']}"
    py = fresh_venv(tmp_path / "venv")  # the test's own interpreter may have no pip (a uv venv)
    got = pip(py, "download", "--no-deps", "--index-url", (out / "simple").as_uri(), want, "-d", str(tmp_path / "dl"))
    assert got.returncode == 0, got.stdout + got.stderr
    (downloaded,) = (tmp_path / "dl").iterdir()
    assert sha(downloaded) == sha(wheels["cu124-torch27"])


def test_same_inputs_same_bytes_and_a_rerun_replaces_the_index_whole(cli, two_verified, tmp_path):
    repo, _ = two_verified
    out = tmp_path / "all"
    assert cli("--repo", str(repo), "wheelhouse", "--all", "--out", str(out)).code == 0
    first = snapshot(out)
    (out / "cu130-torch211" / "stray.txt").write_text("left by hand")
    assert cli("--repo", str(repo), "wheelhouse", "--all", "--out", str(out)).code == 0
    assert snapshot(out) == first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".all.")]  # no staging folder left


def test_no_verified_wheel_at_all_is_not_an_error(cli, kit_repo, tmp_path):
    out = tmp_path / "all"
    r = cli("--repo", str(kit_repo), "wheelhouse", "--all", "--out", str(out))
    assert r.code == 0, r.err
    assert json.loads((out / "wheelhouse.json").read_text())["envs"] == {}
    assert not (out / "simple").exists()


def test_a_folder_flashkit_did_not_write_is_never_replaced(cli, two_verified, tmp_path):
    repo, _ = two_verified
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = cli("--repo", str(repo), "wheelhouse", "--all", "--out", str(out))
    assert r.code == 2 and f"--out {out}" in r.err and "not a wheelhouse flashkit wrote" in r.err
    assert (out / "notes.txt").read_text() == "mine" and len(list(out.iterdir())) == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--all", "cu130-torch211"), "--all takes every env"),
        (("--all", "--wheel", "x.whl"), "--all takes every env"),
        ((), "name the env(s) to export"),
    ],
)
def test_bad_combinations_are_usage_errors(cli, kit_repo, tmp_path, args, says):
    r = cli("--repo", str(kit_repo), "wheelhouse", *args, "--out", str(tmp_path / "o"))
    assert r.code == 2 and says in r.err


def test_two_wheels_of_one_name_are_refused_with_what_to_do():
    from types import SimpleNamespace

    from flashkit.core.errors import PublishRefused
    from flashkit.publish.wheel_index import _names_unique

    def wheel(env: str, name: str, digest: str):
        return SimpleNamespace(env=env, path=Path("/x") / name, sha256=digest), {}

    bound = "flash_kernels-0.1.0+cu130torch2.11cxx11abitrue-cp310-abi3-linux_x86_64.whl"
    with pytest.raises(PublishRefused, match="share the file name") as exc:
        _names_unique([wheel("a", bound, "1" * 64), wheel("b", bound, "2" * 64)])
    assert "+cu<X>stable<A.B>" in exc.value.hint and "cxx11abi<true|false>" in exc.value.hint
    # Two envs of one CUDA major build the same stable-ABI name: their labels cannot differ.
    stable = "flash_kernels-0.1.0+cu13stable2.10-cp310-abi3-linux_x86_64.whl"
    with pytest.raises(PublishRefused) as exc:
        _names_unique([wheel("cu130-torch211", stable, "1" * 64), wheel("cu130-torch215", stable, "2" * 64)])
    assert "one wheel for every torch >= A.B with CUDA X" in exc.value.hint
    _names_unique([wheel("a", stable, "1" * 64), wheel("b", stable, "1" * 64)])  # the same bytes: one file
