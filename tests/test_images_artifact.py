"""artifact_check runs with the standard library alone and refuses anything but the exported artifact."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from kitsupport import torch_python

REPO = Path(__file__).resolve().parents[1]


def wheel(tmp_path: Path) -> tuple[Path, str]:
    w = tmp_path / "flash_kernels-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as zf:
        zf.writestr("flash_kernels/__init__.py", "")
    return w, hashlib.sha256(w.read_bytes()).hexdigest()


def run(tmp_path: Path, *args: str, python: str = sys.executable, env: dict | None = None) -> tuple[int, dict]:
    out = tmp_path / "result.json"
    # -S -E: no site-packages and no PYTHON* variables, so only the standard library and this checkout's
    # flashkit/ are importable: what a bare GPU host offers.
    p = subprocess.run(
        [python, "-S", "-E", "-m", "flashkit.evidence.artifact_check", *args, "--env", "cu130-torch211",
         "--input-hash", "fk1-x", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )  # fmt: skip
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(out.read_text())


def test_wrong_sha256_is_an_error_and_names_both(tmp_path):
    w, digest = wheel(tmp_path)
    code, res = run(tmp_path, str(w), "--expect-sha256", "0" * 64, "--expect-torch", "2.11", "--expect-cuda", "13")
    assert code == 16 and res["verdict"] == "error"
    assert digest in res["reasons"][0] and "not the exported artifact" in res["reasons"][0]
    assert res["judged"] == {"wheel_sha256": digest}


def test_host_without_torch_is_an_error_not_a_pass(tmp_path):
    w, digest = wheel(tmp_path)
    code, res = run(tmp_path, str(w), "--expect-sha256", digest, "--expect-torch", "2.11", "--expect-cuda", "13")
    assert code == 16 and res["verdict"] == "error"
    assert "torch is not importable" in res["reasons"][0]


def test_a_torch_that_warns_as_it_imports_is_still_read(tmp_path):
    """torch writes warnings to stderr when it imports (no numpy, an old driver): the probe reads stdout only."""
    fake = tmp_path / "site" / "torch"
    (fake / "cuda").mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import sys\nprint('UserWarning: Failed to initialize NumPy', file=sys.stderr)\n"
        "__version__ = '9.9.0'\nfrom torch import cuda, version\n"
    )
    (fake / "version.py").write_text("cuda = '13.0'\n")
    (fake / "cuda" / "__init__.py").write_text("def is_available():\n    return False\n")
    w, digest = wheel(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}  # for the probe's own interpreter (no -E there)
    code, res = run(
        tmp_path, str(w), "--expect-sha256", digest, "--expect-torch", "2.11", "--expect-cuda", "13", env=env
    )
    assert code == 16 and res["verdict"] == "not-run", res
    assert res["reasons"] == ["host torch 9.9.0 is not the env's torch 2.11.x"]


@pytest.mark.torch_python
def test_other_torch_on_the_host_means_not_run(tmp_path):
    """A host whose torch is not the env's (torch_python's, any version but 1.0) does not judge the wheel."""
    w, digest = wheel(tmp_path)
    code, res = run(
        tmp_path, str(w), "--expect-sha256", digest, "--expect-torch", "1.0", "--expect-cuda", "13",
        python=torch_python(),
    )  # fmt: skip
    assert code == 16 and res["verdict"] == "not-run"
    assert "is not the env's torch 1.0.x" in res["reasons"][0]


def test_the_gpu_side_imports_nothing_but_the_standard_library():
    code = (
        "import sys; import flashkit.evidence.artifact_check; "
        "mods = {m.split('.')[0] for m in sys.modules}; "
        "extra = sorted(mods - set(sys.stdlib_module_names) - {'flashkit', '__main__'}); "
        "print(extra); sys.exit(1 if extra else 0)"
    )
    p = subprocess.run([sys.executable, "-S", "-E", "-c", code], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
