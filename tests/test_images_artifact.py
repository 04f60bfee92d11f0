"""artifact_check runs with the standard library alone and refuses anything but the exported artifact."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "flashkit" / "evidence" / "artifact_check.py"


def wheel(tmp_path: Path) -> tuple[Path, str]:
    w = tmp_path / "flash_kernels-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as zf:
        zf.writestr("flash_kernels/__init__.py", "")
    return w, hashlib.sha256(w.read_bytes()).hexdigest()


def run(tmp_path: Path, *args: str, python: str = sys.executable) -> tuple[int, dict]:
    out = tmp_path / "result.json"
    # -I: isolated mode, so nothing from this checkout (flashkit, flash_kernels) is importable.
    p = subprocess.run(
        [python, "-I", str(SCRIPT), *args, "--env", "cu130-torch211", "--input-hash", "fk1-x", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return p.returncode, json.loads(out.read_text())


def test_wrong_sha256_is_an_error_and_names_both(tmp_path):
    w, digest = wheel(tmp_path)
    code, res = run(tmp_path, str(w), "--expect-sha256", "0" * 64, "--expect-torch", "2.11", "--expect-cuda", "13")
    assert code == 1 and res["verdict"] == "error"
    assert digest in res["reasons"][0] and "not the exported artifact" in res["reasons"][0]
    assert res["judged"] == {"wheel_sha256": digest}


def test_host_without_torch_is_an_error_not_a_pass(tmp_path):
    w, digest = wheel(tmp_path)
    code, res = run(tmp_path, str(w), "--expect-sha256", digest, "--expect-torch", "2.11", "--expect-cuda", "13")
    assert code == 1 and res["verdict"] == "error"
    assert "torch is not importable" in res["reasons"][0]


KERN = Path("/work/venvs/kern/bin/python")


@pytest.mark.skipif(not KERN.exists(), reason="needs a Python with torch (the shared kern venv)")
def test_other_torch_on_the_host_means_not_run(tmp_path):
    w, digest = wheel(tmp_path)
    code, res = run(
        tmp_path, str(w), "--expect-sha256", digest, "--expect-torch", "2.11", "--expect-cuda", "13", python=str(KERN)
    )
    assert code == 1 and res["verdict"] == "not-run"
    assert "is not the env's torch 2.11.x" in res["reasons"][0]
