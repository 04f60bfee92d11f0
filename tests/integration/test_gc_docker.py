"""flashkit gc against the real engine, on its own repository prefix (never this host's real images)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
PREFIX = "flashkit-gc-test/"


def test_gc_removes_stale_tags_and_dry_run_removes_nothing(engine, debian_base):
    sdk = engine.sdk()
    try:
        base = sdk.images.get(debian_base)
        stale = [f"{PREFIX}cu130-torch211:fk1-0123456789abcdef", f"{PREFIX}cu130-torch211:fk1-0123456789abcdef-check"]
        for t in stale:
            repo, _, tag = t.rpartition(":")
            base.tag(repo, tag)
        cmd = [sys.executable, "-m", "flashkit.cli.main", "--repo", str(ROOT), "gc", "--prefix", PREFIX]
        dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=300)
        assert dry.returncode == 0, dry.stderr
        assert all(f"would remove  {t}" in dry.stdout for t in stale)
        tags = {t for i in sdk.images.list() for t in i.tags}
        assert set(stale) <= tags
        real = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert real.returncode == 0, real.stderr
        assert "removed 2 tag(s)" in real.stdout
        tags = {t for i in sdk.images.list() for t in i.tags}
        assert not set(stale) & tags
        assert any(t.startswith("flashkit/debian:") for t in tags), "the base itself must survive"
    finally:
        for i in sdk.images.list():
            for t in i.tags:
                if t.startswith(PREFIX):
                    sdk.images.remove(t)
        sdk.close()


def test_gc_removes_a_killed_runs_working_container_and_keeps_a_live_ones(engine):
    """The containers are real buildah containers (from scratch): one named for a process that has ended, as
    a run killed inside a WorkingContainer leaves it, and one named for this test's own process."""
    import os

    from flashkit.images import buildah

    bh = buildah.find_buildah()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, live = f"flashkit-wc-{int(ended.stdout)}-0badc0de", f"flashkit-wc-{os.getpid()}-0badc0de"
    try:
        for name in (dead, live):
            bh.run("from", "--quiet", "--name", name, "scratch", timeout=120)
        cmd = [sys.executable, "-m", "flashkit.cli.main", "--repo", str(ROOT), "gc", "--prefix", PREFIX]
        dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=300)
        assert dry.returncode == 0, dry.stderr
        assert f"would remove  buildah container {dead}" in dry.stdout and live not in dry.stdout
        assert {dead, live} <= {r["containername"] for r in buildah.containers(bh)}
        real = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert real.returncode == 0, real.stderr
        assert f"remove  buildah container {dead}" in real.stdout
        names = {r["containername"] for r in buildah.containers(bh)}
        assert dead not in names and live in names
    finally:
        for name in (dead, live):
            bh.run("rm", name, check=False, timeout=120)
