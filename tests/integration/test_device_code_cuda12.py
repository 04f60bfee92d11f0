"""CUDA 12 verified through device code, with the images `.ci/run` builds.

The GPU host runs torch 2.11 with CUDA 13, so no torch 2.7 wheel can run there. cu124-torch210's stable-ABI
wheel can (through the stable ABI, with the env's pinned CUDA 12 runtime beside torch's): its artifact-gpu
verdict is in the committed ledger, with its device code. Here:

1. Two bindings, one device code: the version-bound wheel that this run's `nox -s test-cu124-torch27` built
   (torch 2.7's ATen/c10 C++ API, CUDA 12.4 from Debian) carries exactly the device code recorded for the
   stable-ABI wheel of cu124-torch210 (torch 2.10's C shim), though the two files and their torch bindings
   differ.
2. So the gate passes cu124-torch27 with the full policy: `flashkit publish cu124-torch27` to the TLS registry
   with a login, and `flashkit verify-image` accepts the result and shows what the GPU verdict stands on.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
from kitsupport import input_hash
from regsupport import PASSWORD, USER, start_secure_registry

from flashkit.evidence import devicecode
from flashkit.ledger import store
from flashkit.ledger.model import RELATION_DEVICE_CODE
from flashkit.publish import attest

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("docker-registry", "skopeo")), reason="apt-get install docker-registry skopeo"
    ),
]
ROOT = Path(__file__).resolve().parents[2]
VERSION_BOUND, STABLE = "cu124-torch27", "cu124-torch210"


def stable_device_code():
    """The device code recorded for cu124-torch210's wheel at its current input hash (built elsewhere)."""
    h = input_hash(ROOT, STABLE)
    ledger = store.load(ROOT, STABLE)
    wheels = {a.wheel_sha256 for a in ledger.artifacts(h)}
    found = [f for f in ledger.device_codes() if f.wheel_sha256 in wheels]
    if not found:
        pytest.fail(f"{STABLE} has no device code recorded at its current input hash {h[:20]}")
    return found[-1]


def torch_cxx_symbols(wheel: str) -> int:
    with zipfile.ZipFile(wheel) as zf:
        so = next(n for n in zf.namelist() if n.endswith(".so"))
        return zf.read(so).count(b"_ZN3c10")


def test_two_bindings_one_device_code(built_env):
    res = built_env(VERSION_BOUND)
    mine = devicecode.of_wheel(res.wheel_path)
    stable = stable_device_code()
    assert res.wheel_sha256 != stable.wheel_sha256  # two files...
    assert "torch2.7" in Path(res.wheel_path).name and "stable2.10" in stable.wheel
    assert torch_cxx_symbols(res.wheel_path) > 0  # ...bound to torch two ways (c10's C++ API here)...
    assert stable.toolchain["torch_binding"] == "stable"
    assert mine.summary() == devicecode.DeviceCode.summary_of(stable.extensions)
    assert mine.digest == stable.digest, (mine.summary(), stable.summary())  # ...one device code
    recorded = store.load(ROOT, VERSION_BOUND).device_code_of(res.wheel_sha256)
    assert recorded == mine.digest  # the test session recorded it as it verified the build


@pytest.fixture
def repo_copy(tmp_path):
    """The checkout's envs, locks, template, kernel sources and ledgers, in a folder a publish may write."""
    root = tmp_path / "repo"
    for d in ("envs", "lockfiles", "templates", "flash_kernels", "verified"):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("*.lock", "__pycache__", "build"))
    assert input_hash(root, VERSION_BOUND) == input_hash(ROOT, VERSION_BOUND)
    return root


def test_publish_cu124_torch27_on_device_code_evidence(built_env, repo_copy, tmp_path, cli, monkeypatch):
    built_env(VERSION_BOUND)  # the runtime image the gate judges
    reg = start_secure_registry(tmp_path / "secure")
    try:
        monkeypatch.setenv("FLASHKIT_REGISTRY_CA", str(reg.ca))
        monkeypatch.setenv("FLASHKIT_REGISTRY_USER", USER)
        monkeypatch.setenv("FLASHKIT_REGISTRY_PASSWORD", PASSWORD)
        monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
        (tmp_path / "docker-config").mkdir()
        (tmp_path / "docker-config" / "config.json").write_text("{}")
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
        monkeypatch.setenv("FLASHKIT_LOCK_DIR", str(tmp_path / "locks"))
        private, public = attest.generate_keys(tmp_path / "keys", repo_root=None)
        target = f"{reg.address}/org/flash"
        pub = cli(
            "--repo", str(repo_copy), "publish", VERSION_BOUND, "--registry", target, "--signing-key", str(private)
        )
        assert pub.code == 0, pub.err[-3000:]
        h = input_hash(repo_copy, VERSION_BOUND)
        (publication,) = store.load(repo_copy, VERSION_BOUND).publications(h)
        assert publication.policy.startswith("full")
        assert "artifact-gpu" in publication.verified_tiers
        ledger = store.load(repo_copy, VERSION_BOUND)
        relations = [
            a
            for a in ledger.applies()
            if a.relation == RELATION_DEVICE_CODE and a.verdict_id in publication.verdict_ids
        ]
        assert relations and relations[0].source_env == STABLE
        seen = cli("verify-image", f"{target}:torch2.7-cu12.4", "--key", str(public))
        assert seen.code == 0, seen.err[-3000:]
        assert f"via device code {relations[0].device_code}" in seen.out
        assert f"of {STABLE}" in seen.out and "covers the GPU code only" in seen.out
        assert PASSWORD not in pub.out + pub.err + seen.out
    finally:
        reg.registry.stop()
