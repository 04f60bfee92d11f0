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
