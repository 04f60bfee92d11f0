"""The build context holds only what the Dockerfile copies; site settings never pass silently."""

from __future__ import annotations

import pytest

from flashkit.images import build
from flashkit.core.errors import BuildError
from flashkit.plan.spec import load_env

DOCKERFILE = (
    "ARG BASE_IMAGE=x\nFROM ${BASE_IMAGE}\nARG DEBIAN_MIRROR=http://deb.debian.org/debian\n"
    "ARG PIP_INDEX_URL=https://pypi.org/simple\n"
)


def test_context_is_exactly_dockerfile_locks_and_kernel_sources(kit_repo, tmp_path):
    (kit_repo / "flash_kernels/build/lib").mkdir(parents=True)
    (kit_repo / "flash_kernels/build/lib/junk.so").write_text("x")
    (kit_repo / "flash_kernels/flash_kernels/__pycache__").mkdir()
    (kit_repo / "flash_kernels/flash_kernels/__pycache__/a.pyc").write_text("x")
    spec = load_env(kit_repo, "cu130-torch211")
    ctx = tmp_path / "ctx"
    build.prepare_context(kit_repo, spec, "FROM scratch\n", ctx)
    files = sorted(p.relative_to(ctx).as_posix() for p in ctx.rglob("*") if p.is_file())
    sources = sorted(
        p.relative_to(kit_repo).as_posix()
        for p in (kit_repo / "flash_kernels").rglob("*")
        if p.is_file() and "build" not in p.parts and "__pycache__" not in p.parts
    )
    assert files == sorted(
        ["Dockerfile", "lockfiles/cu130-torch211.txt", "lockfiles/cu130-torch211.build.txt", *sources]
    )
    assert "flash_kernels/build/lib/junk.so" not in files and len(sources) >= 3


def test_site_settings_map_to_declared_args(monkeypatch):
    monkeypatch.setenv("FLASHKIT_DEBIAN_MIRROR", "http://mirror.example/debian")
    monkeypatch.delenv("FLASHKIT_PIP_INDEX_URL", raising=False)
    got = build.site_settings(DOCKERFILE, {"PIP_INDEX_URL": "https://pypi.example/simple"})
    assert got == {"DEBIAN_MIRROR": "http://mirror.example/debian", "PIP_INDEX_URL": "https://pypi.example/simple"}


def test_a_site_setting_the_dockerfile_ignores_is_an_error(monkeypatch):
    monkeypatch.delenv("FLASHKIT_DEBIAN_MIRROR", raising=False)
    with pytest.raises(BuildError, match="declares none of ARG PIP_INDEX_URL"):
        build.site_settings("FROM scratch\n", {"PIP_INDEX_URL": "https://pypi.example/simple"})


def test_nothing_set_means_no_build_args(monkeypatch):
    for k in ("FLASHKIT_DEBIAN_MIRROR", "FLASHKIT_PIP_INDEX_URL"):
        monkeypatch.delenv(k, raising=False)
    assert build.site_settings(DOCKERFILE, {}) == {}
