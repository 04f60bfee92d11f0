"""Shared fixtures for the kit's tests: a throwaway copy of the repository's inputs, and a CLI runner.

No test here needs docker, torch, a GPU or the network unless marked (network/docker/gpu).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from kitsupport import FAKE_KERNELS, REPO, snapshot

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the property tests skip themselves; the rest needs no hypothesis
    pass
else:
    # Derandomized: the same examples on every run and host, so a failure reproduces and CI time is fixed.
    settings.register_profile(
        "flashkit", derandomize=True, deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.load_profile("flashkit")


@pytest.fixture
def kit_repo(tmp_path: Path) -> Path:
    """A copy of envs/, lockfiles/ and templates/ plus a small kernel tree, in a fresh directory."""
    root = tmp_path / "repo"
    for d in ("envs", "lockfiles", "templates"):
        shutil.copytree(REPO / d, root / d)
    for rel, text in FAKE_KERNELS.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


@pytest.fixture
def tree_snapshot():
    return snapshot


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run flashkit.cli.main.main in-process and capture its exit code and output."""
    from flashkit.cli import main as cli_mod

    monkeypatch.delenv("FLASHKIT_ROOT", raising=False)

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = cli_mod.main(list(args))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
