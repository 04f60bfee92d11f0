"""`flashkit wheelhouse`: the gate, the PEP 503 index, and `pip install --require-hashes` on a fresh venv.

The wheels are small real wheels written here (a stand-in flash_kernels and one
dependency); pip is the real pip of a fresh venv, offline (--no-index), so the
test checks what a user's install does: hashes enforced, exactly the pinned set.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
from kitsupport import artifact, cached_build, fresh_venv, input_hash, make_wheel, pip, verdict

from flashkit.ledger import store

ENV = "cu130-torch211"
IMAGE = "sha256:" + "3" * 64


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def setup(kit_repo, cli, tmp_path):
    """kit_repo whose env locks one real dependency wheel, with a cached build result and a ledger."""
    deps = tmp_path / "deps"
    dep = make_wheel(deps, "toydep", "1.0", "toydep")
    # The image's own set (Python 3.11) locks the toy dependency; the other Pythons' sets are left out.
    for p in [kit_repo / "lockfiles" / f"{ENV}.txt", *(kit_repo / "lockfiles" / ENV).glob("py*.txt")]:
        p.unlink()
    (kit_repo / "lockfiles" / ENV / "py3.11.txt").write_text(
        f"# flashkit lock {ENV} (test)\ntoydep==1.0 \\\n    --hash=sha256:{sha(dep)}\n    # via test\n"
    )
    wheel = make_wheel(tmp_path / "exported", "flash_kernels", "0.1.0", "flash_kernels")
    h = input_hash(kit_repo, ENV)
    cached_build(kit_repo, ENV, h, wheel, IMAGE)
    art = artifact(ENV, h, image=IMAGE, wheel=sha(wheel))
    store.append(kit_repo, ENV, [art])

    def verdicts(**v: str) -> None:
        store.append(kit_repo, ENV, [verdict(art, t.replace("_", "-"), x) for t, x in v.items()])

    return {"repo": kit_repo, "cli": cli, "deps": deps, "wheel": wheel, "hash": h, "verdicts": verdicts}


def test_verified_set_installs_by_hash_on_a_fresh_venv(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    out = tmp_path / "wh"
    r = s["cli"]("--repo", str(s["repo"]), "wheelhouse", ENV, "--out", str(out))
    assert r.code == 0, r.err
    d = out / ENV
    req = (d / "requirements.txt").read_text()
    assert f"flash-kernels==0.1.0 \\\n    --hash=sha256:{sha(s['wheel'])}" in req
    assert "toydep==1.0" in req and s["hash"] in req
    assert (d / "files" / "SHA256SUMS").read_text() == f"{sha(s['wheel'])}  {s['wheel'].name}\n"
    page = (d / "simple" / "flash-kernels" / "index.html").read_text()
    assert f"../../files/{s['wheel'].name}#sha256={sha(s['wheel'])}" in page

    py = fresh_venv(tmp_path / "venv")
    # Run from elsewhere: `--find-links files` resolves relative to the requirements file.
    res = pip(
        py,
        "install",
        "--require-hashes",
        "--no-index",
        "--find-links",
        str(s["deps"]),
        "-r",
        str(d / "requirements.txt"),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    frozen = pip(py, "freeze").stdout.split()
    assert sorted(frozen) == ["flash_kernels==0.1.0", "toydep==1.0"]

    # The PEP 503 index serves the same bytes.
    got = pip(py, "download", "--no-deps", "--index-url", (d / "simple").as_uri(), "flash-kernels==0.1.0",
              "-d", str(tmp_path / "dl"))  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert sha(tmp_path / "dl" / s["wheel"].name) == sha(s["wheel"])


def test_a_tampered_wheel_does_not_install(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    out = tmp_path / "wh"
    assert s["cli"]("--repo", str(s["repo"]), "wheelhouse", ENV, "--out", str(out)).code == 0
    exported = out / ENV / "files" / s["wheel"].name
    os.chmod(exported, 0o644)
    with zipfile.ZipFile(exported, "a") as z:
        z.writestr("flash_kernels/evil.py", "raise SystemExit\n")
    py = fresh_venv(tmp_path / "venv")
    res = pip(py, "install", "--require-hashes", "--no-index", "--find-links", str(s["deps"]),
              "-r", str(out / ENV / "requirements.txt"))  # fmt: skip
    assert res.returncode != 0 and "DO NOT MATCH THE HASHES" in res.stderr
    assert "flash_kernels" not in pip(py, "freeze").stdout


def test_gate_refusals_write_nothing(setup, tmp_path):
    s = setup
    out = tmp_path / "wh"
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="not-run")
    r = s["cli"]("--repo", str(s["repo"]), "wheelhouse", ENV, "--out", str(out))
    assert r.code == 17 and "gpu: not-run" in r.err and "--policy no-gpu" in r.err
    assert not out.exists()
    # Asked for explicitly, the weaker policy is written into the requirements header.
    r = s["cli"]("--repo", str(s["repo"]), "wheelhouse", ENV, "--out", str(out), "--policy", "no-gpu")
    assert r.code == 0, r.err
    assert "policy no-gpu (build,abi,cpu)" in (out / ENV / "requirements.txt").read_text()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    # The exported wheel changed after verification: refused, the existing wheelhouse untouched.
    with zipfile.ZipFile(s["wheel"], "a") as z:
        z.writestr("flash_kernels/x.py", "")
    r = s["cli"]("--repo", str(s["repo"]), "wheelhouse", ENV, "--out", str(out), "--policy", "no-gpu")
    assert r.code == 17 and "produced a wheel with sha256" in r.err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("node", ["fifo", "folder"])
def test_a_wheel_path_that_is_not_a_file_is_named_so(setup, tmp_path, node):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    s["wheel"].unlink()
    os.mkfifo(s["wheel"]) if node == "fifo" else s["wheel"].mkdir()  # a FIFO would hang a reader
    r = s["cli"]("--repo", str(s["repo"]), "wheelhouse", ENV, "--out", str(tmp_path / "wh"))
    assert r.code == 17 and "is not a regular file" in r.err and "is missing" not in r.err, r.err
    assert not (tmp_path / "wh").exists()


def test_changed_lockfile_refuses(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    lock = s["repo"] / "lockfiles" / ENV / "py3.11.txt"
    lock.write_text(lock.read_text() + "# edited\n")
    r = s["cli"]("--repo", str(s["repo"]), "wheelhouse", ENV, "--out", str(tmp_path / "wh"))
    assert r.code == 17 and "no wheel of its current input hash" in r.err
    assert not (tmp_path / "wh").exists()


def test_requirements_are_deterministic(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    texts = []
    for i in range(2):
        out = tmp_path / f"wh{i}"
        assert s["cli"]("--repo", str(s["repo"]), "wheelhouse", ENV, "--out", str(out)).code == 0
        texts.append({p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()})
    assert texts[0] == texts[1]
    assert json.dumps(sorted(str(p) for p in texts[0])) == json.dumps(
        sorted(
            [
                f"{ENV}/files/SHA256SUMS",
                f"{ENV}/files/{s['wheel'].name}",
                f"{ENV}/py3.11.txt",
                f"{ENV}/requirements.txt",
                f"{ENV}/simple/flash-kernels/index.html",
                f"{ENV}/simple/index.html",
            ]
        )
    )


@pytest.mark.network
@pytest.mark.parametrize("python_version", ["3.11", "3.12"])
def test_real_lock_resolves_and_its_hashes_match_pypi(tmp_path, python_version):
    """The torch half of cu130-torch211's production requirements, for the build host's Python (3.11) and the
    GPU host's (3.12): pip resolves every pin and checks every downloaded wheel against its hash (about 3 GB
    the first time; pip's cache afterwards). The per-Python file: pip evaluates markers against the
    interpreter that runs it, not --python-version. The flash_kernels line needs a verified build, so it is not here."""
    from kitsupport import REPO

    py = fresh_venv(tmp_path / "venv")
    res = pip(py, "install", "--dry-run", "--ignore-installed", "--require-hashes", "--only-binary=:all:",
              "--python-version", python_version, "--target", str(tmp_path / "t"),
              "-r", str(REPO / "lockfiles" / ENV / f"py{python_version}.txt"))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "torch-2.11.0" in res.stdout
