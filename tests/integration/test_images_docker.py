"""The container abstraction, the bases and the env images against a real engine."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from flashkit.core import paths
from flashkit.core.errors import BaseImageError, ContainerError
from flashkit.images import base, build, buildah
from flashkit.images.container import Container, image_inspect, image_remove
from flashkit.plan import baselock
from flashkit.plan.plan import load_plan
from flashkit.verify import tiers

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def test_container_exec_copy_and_cleanup(engine, built_env, tmp_path):
    res = built_env("cu130-torch211")
    src = tmp_path / "payload"
    src.mkdir()
    (src / "hello.txt").write_text("hello from the host\n")
    with Container(engine, res.runtime_ref, network=False) as c:
        name = c.name
        c.copy_into(src, "/tmp")
        r = c.exec(["sh", "-c", "cat /tmp/payload/hello.txt; echo made >/tmp/out.txt; exit 3"])
        assert r.exit_code == 3 and "hello from the host" in r.output
        with pytest.raises(ContainerError, match="exited 3"):
            r.check()
        out = c.copy_out("/tmp/out.txt", tmp_path / "back")
        assert out.read_text() == "made\n"
        with pytest.raises(ContainerError, match="does not exist"):
            c.copy_out("/nope", tmp_path)
    sdk = engine.sdk()
    try:
        assert not sdk.containers.list(all=True, filters={"name": name})
    finally:
        sdk.close()


def test_runtime_base_made_again_in_a_fresh_storage_is_the_same_image(built_env, tmp_path):
    """A second builder (a fresh buildah storage) runs mmdebstrap at the locked versions: the same base id."""
    res = built_env("cu130-torch211")
    plan = load_plan(ROOT, "cu130-torch211")
    lock, _problems = baselock.parse(plan.locks.base)
    bh = buildah.find_buildah(str(tmp_path / "storage"))
    try:
        img = base.make_base(
            bh, plan.spec, lock, "runtime", namespace=build.namespace(), mirror=None, log_path=tmp_path / "base.log"
        )
        assert img.rootfs_sha256 is not None  # made here, not found
        assert img.image_id == res.runtime_base_id
    finally:
        bh.run("rmi", "--all", "--force", check=False)


def test_a_locked_version_the_archive_no_longer_serves_is_a_clear_error(tmp_path):
    plan = load_plan(ROOT, "cu130-torch211")
    lock, _problems = baselock.parse(plan.locks.base)
    gone = dict(lock.packages)
    gone["runtime"] = tuple((n, "999:0.0-gone") if n == "bash" else (n, v) for n, v in lock.packages["runtime"])
    stale = dataclasses.replace(lock, packages=gone)
    bh = buildah.find_buildah(str(tmp_path / "storage"))
    with pytest.raises(BaseImageError) as exc:
        base.make_base(bh, plan.spec, stale, "runtime", namespace="flashkit-test", mirror=None, log_path=tmp_path / "l")
    text = str(exc.value)
    assert "no longer serves" in text and "bash=999:0.0-gone" in text
    assert "flashkit base lock cu130-torch211" in text and exc.value.exit_code == 11
    assert buildah.inspect(bh, base.base_tag("flashkit-test", plan.spec, stale, "runtime")) is None


def _abi_of_swapped_wheel(engine, tmp_path, donor, host):
    """The abi tier's outcome for ``donor``'s wheel installed into ``host``'s runtime image."""
    from flashkit.plan.specfile import load_env

    wheel = Path(donor.wheel_path)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / wheel.name).write_bytes(wheel.read_bytes())
    # The runtime image's venv is first on PATH and owned by root.
    (ctx / "Dockerfile").write_text(
        f"FROM {host.runtime_ref}\nUSER root\nCOPY {wheel.name} /tmp/\n"
        f"RUN python3 -m pip install --no-deps --no-index --force-reinstall /tmp/{wheel.name}\n"
    )
    ref = "flashkit-test/abi-mismatch:latest"
    sdk = engine.sdk()
    try:
        sdk.images.build(path=str(ctx), tag=ref, rm=True, forcerm=True)  # the engine's own (classic) builder
    finally:
        sdk.close()
    try:
        mixed = build.BuildResult(
            **{
                **host.to_json(),
                "runtime_ref": ref,
                "runtime_id": image_inspect(engine, ref)["Id"],
                "wheel_path": str(wheel),
                "wheel_sha256": donor.wheel_sha256,
            }
        )
        return tiers.tier_abi(engine, load_env(ROOT, host.env), mixed)
    finally:
        image_remove(engine, [ref], force=True)


def test_wheel_from_another_torch_fails_abi_with_the_demangled_symbol(engine, built_env, tmp_path):
    """The cross-torch failure, for the version-bound mode: cu124-torch27's wheel (torch 2.7, CUDA 12) dropped
    into cu130-torch211's image (torch 2.11, CUDA 13)."""
    r = _abi_of_swapped_wheel(engine, tmp_path, built_env("cu124-torch27"), built_env("cu130-torch211"))
    text = "\n".join(r.reasons)
    assert r.verdict == "failed", text
    # The C++ name, demangled, with its mangled form for grep.
    assert "undefined symbol `c10::" in text or "undefined symbol `at::" in text, text
    assert "needs libcudart.so.12" in text, text


def test_stable_wheel_under_a_torch_older_than_its_target_fails_abi(engine, built_env, tmp_path):
    """The stable-ABI wheel of cu130-torch211 in cu124-torch27's image (torch 2.7): no torch C++ symbol to
    blame, but the shim functions torch 2.7 lacks and the torch version below the wheel's target."""
    r = _abi_of_swapped_wheel(engine, tmp_path, built_env("cu130-torch211"), built_env("cu124-torch27"))
    text = "\n".join(r.reasons)
    assert r.verdict == "failed", text
    assert "older than 2.10" in text and "stable ABI of torch >= 2.10" in text, text
    assert "undefined symbol `c10::" not in text and "undefined symbol `at::" not in text, text


@pytest.mark.parametrize("env_id", [os.environ.get("FLASHKIT_TEST_ENV", "cu130-torch211")])
def test_built_env_passes_build_abi_cpu(engine, built_env, env_id):
    from flashkit.plan.specfile import load_env

    res = built_env(env_id)
    spec = load_env(ROOT, env_id)
    results = {t.tier: t for t in tiers.run_tiers(engine, spec, res, ("build", "abi", "cpu"))}
    for name, t in results.items():
        assert t.verdict == "passed", (name, t.reasons)
    assert results["cpu"].counts["passed"] > 0
    assert paths.python_lock_file(ROOT, env_id, spec.python).exists()
