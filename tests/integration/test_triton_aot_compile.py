"""The triton-aot tier for real: the env's pinned triton installed by hash from PyPI, the kernel sources the
input hash covers, and triton's AMD and NVIDIA backends compiling on this CPU-only host. A subset of the
specialisations (``--only``), so it is printed and not recorded; the full tier is `flashkit aot <env>`."""

from __future__ import annotations

import shutil

import pytest
from kitsupport import REPO

pytestmark = pytest.mark.aot


def test_the_rocm_envs_kernels_compile_for_mi200_and_mi300_with_triton_331(cli):
    r = cli("--repo", str(REPO), "aot", "rocm64-torch27", "--only", "_bwd_delta")
    assert r.code == 0, r.out + r.err
    assert "Triton-AMD kernels compile for gfx90a and gfx942 with triton 3.3.1; never run on an AMD GPU" in r.out
    for target in ("hip:gfx90a", "hip:gfx942"):
        line = next(x for x in r.out.splitlines() if x.strip().startswith(target + ":"))
        assert " 0 failed" in line and "max VGPRs" in line and "max LDS bytes" in line, line
    assert "not recorded" in r.out


def test_a_cuda_envs_kernels_compile_for_sm80_with_its_own_triton(cli):
    r = cli("--repo", str(REPO), "aot", "cu130-torch211", "--only", "_bwd_delta")
    assert r.code == 0, r.out + r.err
    assert "compile for sm_80 with triton 3.6.0" in r.out
    line = next(x for x in r.out.splitlines() if x.strip().startswith("cuda:80:"))
    assert " 0 failed" in line and "max registers" in line and "with spills 0" in line, line


def test_a_passed_target_is_kept_and_a_rerun_reuses_it_with_the_same_report(cli, tmp_path):
    # A repository of its own, so the first run really compiles; the triton venv cache is shared.
    root = tmp_path / "repo"
    for d in ("envs", "lockfiles", "templates", "flash_kernels"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    (root / ".work").mkdir()
    if (REPO / ".work" / "aot").is_dir():
        (root / ".work" / "aot").symlink_to(REPO / ".work" / "aot")
    args = ("--repo", str(root), "aot", "cu130-torch211", "--targets", "cuda:80", "--only", "_bwd_delta/bf16/d64/")
    first = cli(*args)
    assert first.code == 0, first.out + first.err
    assert "reused" not in first.err + first.out
    assert len(list((root / ".work" / "aot-parts").glob("*.json"))) == 1
    again = cli(*args)
    assert again.code == 0, again.out + again.err
    assert "reused the passed result of an earlier run for cuda:80" in again.err + again.out
    line = [x for x in first.out.splitlines() if x.strip().startswith("cuda:80:")]
    assert line and line[0].split(" seconds")[0] in again.out
