"""The image's lockfiles: the committed ones are consistent with their specs (offline); the checker catches
drift; re-locking (network) is reproducible byte for byte. The other Pythons' sets: tests/test_production.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashkit.locking import env_lock
from flashkit.plan import lock, production
from flashkit.plan.plan import read_locks
from flashkit.plan.specfile import load_all, load_env

REPO = Path(__file__).resolve().parents[1]
SPECS = load_all(REPO)


@pytest.mark.parametrize("spec", SPECS, ids=[str(s.id) for s in SPECS])
def test_committed_lockfiles_are_consistent(spec):
    texts = read_locks(REPO, str(spec.id), spec.python)
    assert lock.check(spec, texts.runtime, texts.build) == []
    pins, problems = lock.parse(texts.runtime)
    assert not problems and pins
    assert all(p.hashes for p in pins)
    if spec.torch_source == "pypi":
        assert {p.name: p.version for p in pins}["torch"] == spec.torch
    else:
        assert "torch" not in {p.name for p in pins}  # torch is the base image's


@pytest.mark.parametrize("spec", [s for s in SPECS if s.compiler.source == "pypi"], ids=lambda s: str(s.id))
def test_pypi_toolchain_pins_share_one_version(spec):
    texts = read_locks(REPO, str(spec.id), spec.python)
    pins = {p.name: p.version for p in lock.parse(texts.build)[0] + lock.parse(texts.runtime)[0]}
    assert pins["nvidia-cuda-nvcc"] == pins["nvidia-nvvm"] == pins["nvidia-cuda-crt"] == spec.compiler.version
    assert pins["nvidia-cuda-cccl"].startswith(spec.compiler.version.rsplit(".", 1)[0] + ".")
    runtime_names = {p.name for p in lock.parse(texts.runtime)[0]}
    assert not runtime_names & {"nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt"}


def _spec_and_texts(env="cu130-torch211"):
    spec = load_env(REPO, env)
    return spec, read_locks(REPO, str(spec.id), spec.python)


def test_checker_catches_a_missing_hash():
    spec, t = _spec_and_texts()
    lines = t.runtime.splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.startswith("numpy=="))
    j = i + 1
    while lines[j].lstrip().startswith("--hash"):
        j += 1
    broken = "".join(lines[:i]) + lines[i].rstrip(" \\\n") + "\n" + "".join(lines[j:])
    assert any("numpy==" in p and "no --hash" in p for p in lock.check(spec, broken, t.build))


def test_checker_catches_a_torch_pin_that_is_not_the_spec():
    spec, t = _spec_and_texts()
    problems = lock.check(spec, t.runtime.replace("torch==2.11.0", "torch==2.11.1"), t.build)
    assert any("torch==2.11.1 in the lock but the spec says 2.11.0" in p for p in problems)


def test_checker_catches_mismatched_nvcc_and_nvvm():
    spec, t = _spec_and_texts()
    problems = lock.check(spec, t.runtime, t.build.replace("nvidia-nvvm==13.0.88", "nvidia-nvvm==13.5.37"))
    assert any("nvcc, nvvm and crt must share one version" in p for p in problems)


def test_checker_catches_a_stale_lock_after_a_spec_change():
    spec, t = _spec_and_texts()
    import dataclasses

    newer = dataclasses.replace(spec, torch="2.11.1")
    assert any("stale" in p for p in lock.check(newer, t.runtime, t.build))


def test_checker_catches_a_package_in_both_files():
    spec, t = _spec_and_texts()
    block = t.runtime[t.runtime.index("numpy==") :]
    block = block[: block.index("\n", block.index("# via")) + 1]
    assert any("in both the runtime and the build lock" in p for p in lock.check(spec, t.runtime, t.build + block))


def test_inputs_for_base_image_envs_lock_only_additions():
    spec = load_env(REPO, "cu131-torch210-ngc")
    assert lock.inputs(spec) == lock.LockInputs(runtime=("pytest",), build=())
    assert "only additions are locked here" in lock.header(spec, "runtime")


def test_header_has_no_timestamp_and_names_the_command():
    spec = load_env(REPO, "cu124-torch27")
    header = lock.header(spec, "runtime")
    assert "flashkit lock cu124-torch27" in header and "--exclude-newer 2026-11-30T00:00:00Z" in header
    assert "--python-platform x86_64-manylinux_2_28" in header and "--generate-hashes" in header


def test_lock_check_command(kit_repo, cli):
    assert cli("--repo", str(kit_repo), "lock", "--all", "--check").code == 0
    p = kit_repo / "lockfiles" / "cu124-torch27" / "py3.13.txt"
    p.write_text(p.read_text().replace("torch==2.7.1", "torch==2.7.0"))
    res = cli("--repo", str(kit_repo), "lock", "cu124-torch27", "--check")
    assert res.code == 5 and "torch==2.7.0 in the lock but the spec says 2.7.1" in res.err
    assert cli("--repo", str(kit_repo), "render", "cu124-torch27").code == 5


@pytest.mark.network
@pytest.mark.parametrize("env", ["cu124-torch27", "cu130-torch211", "rocm64-torch27"])
def test_relocking_reproduces_the_committed_bytes(env):
    """Every file: the image's two, every other Python's set and the merged file (uv, about 10 s an env)."""
    spec = load_env(REPO, env)
    res = env_lock.resolve(spec)
    assert res.image == read_locks(REPO, str(spec.id), spec.python)
    assert res.production == production.read(REPO, spec)


def _resolved(repo, spec):
    texts = read_locks(repo, str(spec.id), spec.python)
    return env_lock.Resolved(texts, production.read(repo, spec))


def test_lock_writes_every_file_or_none(kit_repo, monkeypatch):
    from flashkit.core import atomic

    spec = load_env(kit_repo, "cu124-torch27")
    new = _resolved(kit_repo, spec)
    new = env_lock.Resolved(
        lock.LockTexts("new runtime\n", "new build\n"),
        production.Production({**new.production.sets, "3.12": "new 3.12\n"}, {}, "new merged\n"),
    )
    before = {p: p.read_bytes() for p in (kit_repo / "lockfiles").rglob("*") if p.is_file()}
    calls = []
    real = atomic._stage

    def failing_third(path, text):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(path, text)

    monkeypatch.setattr(atomic, "_stage", failing_third)
    with pytest.raises(OSError):
        env_lock.write(kit_repo, spec, new)
    after = {p: p.read_bytes() for p in (kit_repo / "lockfiles").rglob("*") if p.is_file()}
    assert after == before  # no temp files left, no file replaced


def test_lock_write_removes_sets_of_pythons_no_longer_covered(kit_repo):
    spec = load_env(kit_repo, "cu124-torch27")
    old = _resolved(kit_repo, spec)
    sets = {py: t for py, t in old.production.sets.items() if py != "3.9"}
    why = {"3.9": "test: no wheels"}
    written = env_lock.write(
        kit_repo,
        spec,
        env_lock.Resolved(old.image, production.Production(sets, why, production.merge(spec, sets, why))),
    )
    folder = kit_repo / "lockfiles" / "cu124-torch27"
    assert not (folder / "py3.9.txt").exists() and (folder / "py3.10.txt").exists()
    assert kit_repo / "lockfiles" / "cu124-torch27.txt" in written
    assert production.check(spec, production.read(kit_repo, spec)) == []
    assert "# python 3.9: not covered: test: no wheels" in (kit_repo / "lockfiles" / "cu124-torch27.txt").read_text()
