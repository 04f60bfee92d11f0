"""The build context is written from the plan's bytes; site inputs reach builds as secrets, never as identity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flashkit.core.errors import UsageError
from flashkit.images import build, site_inputs
from flashkit.plan.plan import load_plan
from flashkit.plan.render import render_dockerfile


def test_context_is_exactly_dockerfile_locks_and_kernel_sources(kit_repo, tmp_path):
    (kit_repo / "flash_kernels/build/lib").mkdir(parents=True)
    (kit_repo / "flash_kernels/build/lib/junk.so").write_text("x")
    (kit_repo / "flash_kernels/flash_kernels/__pycache__").mkdir()
    (kit_repo / "flash_kernels/flash_kernels/__pycache__/a.pyc").write_text("x")
    plan = load_plan(kit_repo, "cu130-torch211")
    ctx = tmp_path / "ctx"
    build.write_context(plan, "FROM scratch\n", ctx)
    files = sorted(p.relative_to(ctx).as_posix() for p in ctx.rglob("*") if p.is_file())
    sources = sorted(
        p.relative_to(kit_repo).as_posix()
        for p in (kit_repo / "flash_kernels").rglob("*")
        if p.is_file() and "build" not in p.parts and "__pycache__" not in p.parts
    )
    assert files == sorted(
        ["Dockerfile", "lockfiles/cu130-torch211/py3.11.txt", "lockfiles/cu130-torch211/build.txt", *sources]
    )
    assert "flash_kernels/build/lib/junk.so" not in files and len(sources) >= 3
    # The bytes in the context are the bytes that were hashed, even if the tree changes afterwards.
    for src in plan.sources:
        assert (ctx / src.path).read_bytes() == src.data


def test_context_copies_what_was_hashed_not_what_the_tree_holds_later(kit_repo, tmp_path):
    plan = load_plan(kit_repo, "cu130-torch211")
    (kit_repo / "flash_kernels/csrc/kernel.cu").write_text("// edited after planning\n")
    build.write_context(plan, "FROM scratch\n", tmp_path / "ctx")
    assert (tmp_path / "ctx/flash_kernels/csrc/kernel.cu").read_text() == "// stand-in\n__global__ void k() {}\n"


def test_site_urls_come_from_flags_then_environment():
    got = site_inputs.gather(
        {"pip_index_url": "https://pypi.example/simple"}, {"FLASHKIT_DEBIAN_MIRROR": "http://mirror.example/debian"}
    )
    assert got.urls == {"pip_index_url": "https://pypi.example/simple", "debian_mirror": "http://mirror.example/debian"}
    assert got.record() == {**got.urls, "ca_secret_used": False, "netrc_used": False}


@pytest.mark.parametrize(
    "url",
    ["https://user:token@pypi.example/simple", "https://token@pypi.example/simple", "http://u:p@mirror.example/debian"],
)
def test_credentials_in_a_site_url_are_refused_with_the_way_to_pass_them(url):
    with pytest.raises(UsageError, match="FLASHKIT_NETRC"):
        site_inputs.gather({"pip_index_url": url}, {})


def test_secret_files_exist_only_during_the_build(tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine pypi.example login u password p\n")
    inputs = site_inputs.gather({"pip_index_url": "https://pypi.example/simple"}, {"FLASHKIT_NETRC": str(netrc)})
    with site_inputs.SecretFiles(inputs) as args:
        pairs = dict(a.split(",", 1) for a in args if a != "--secret")
        index_file = pairs["id=pip-index"].removeprefix("src=")
        assert Path(index_file).read_text() == "https://pypi.example/simple"
        assert oct(os.stat(os.path.dirname(index_file)).st_mode & 0o777) == "0o700"
        assert pairs["id=netrc"] == f"src={netrc}"
    assert not os.path.exists(index_file)
    assert "password" not in repr(inputs.record())


def test_no_site_input_shows_in_the_rendered_dockerfile(kit_repo):
    from kitsupport import dockerfile

    text = dockerfile(kit_repo, "cu130-torch211")
    assert "ARG PIP_INDEX_URL" not in text and "ARG DEBIAN_MIRROR" not in text
    assert "--mount=type=secret,id=pip-index" in text and "--mount=type=secret,id=netrc" in text


# What buildah printed when the CI host's disk filled up while it committed the runtime stage's pip layer.
_ENOSPC_LINE = (
    "Error: committing container for step {Env:[SOURCE_DATE_EPOCH=1795996800] Command:run Args:[pip install "
    '-r /run/flashkit/lock/c016.txt]}: copying layers and metadata for container "a4fdfe8a2fc1": writing blob: '
    'storing blob to file "/var/tmp/storage4047856476/1": write /var/tmp/storage4047856476/1: no space left on device'
)


def _stand_in_buildah(tmp_path, stderr: str, rc: int):
    from flashkit.images import buildah

    tool = tmp_path / "buildah"
    tool.write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{stderr}\nEOF\nexit {rc}\n")
    tool.chmod(0o755)
    return buildah.Buildah(str(tool), "1.28", "overlay", str(tmp_path / "graph"), str(tmp_path / "root"))


def test_a_full_disk_is_named_with_where_and_how_much_is_free_and_how_to_free_more(tmp_path):
    from flashkit.core.errors import BuildError

    bh = _stand_in_buildah(tmp_path, "STEP 3/9: RUN pip install ...\n" + _ENOSPC_LINE, 125)
    with pytest.raises(BuildError) as exc:
        bh.run("build", "--target", "runtime")
    text = str(exc.value)
    first = text.splitlines()[0]
    assert first.startswith("`buildah build --target runtime` failed: no space left on device (")
    assert (
        f"buildah's storage {tmp_path / 'graph'}: " in first
        and f"its temporary files {tmp_path / 'root'}/tmp: " in first
    )
    assert first.count(" GB free now") == 2, first  # both places exist only as parents: their disk is measured
    assert "flashkit gc --runtime-copies" in text and "buildah rmi --prune" in text
    assert "STEP 3/9" not in text  # the line that says what happened, not the screen of the step before it
    assert exc.value.exit_code == 12


def test_other_build_failures_keep_buildah_s_own_words(tmp_path):
    from flashkit.core.errors import BuildError
    from flashkit.images import buildah

    bh = _stand_in_buildah(tmp_path, "Error: unknown flag: --frobnicate", 125)
    with pytest.raises(BuildError) as exc:
        bh.run("build", "--frobnicate")
    assert "no space" not in str(exc.value) and "unknown flag: --frobnicate" in str(exc.value)
    assert buildah.no_space_error(bh, "x", "write /tmp/f: no such file or directory") is None


def test_quiet_build_output_keeps_buildahs_step_lines():
    """`build --quiet` shows buildah's step headers and stage commits, nothing of the steps' own output."""
    from flashkit.cli.image_cmd import shown_when_quiet

    shown = [
        "STEP 1/4: FROM scratch\n",
        "[3/3] STEP 7/15: RUN /opt/venv/bin/python -m compileall -qq\n",
        "[3/3] COMMIT flashkit/cu124-torch27:fk2-f903ca22563b08e8\n",
        "Successfully tagged localhost/flashkit/cu124-torch27:fk2-f903ca22563b08e8\n",
        'Error: building at STEP "RUN pip install": exit status 1\n',
    ]
    hidden = [
        "  Building wheel for flash_kernels (pyproject.toml): still running...\n",
        'time="2026-12-04T16:30:41Z" level=warning msg="SHELL is not supported for OCI image format"\n',
        "#7 [builder 3/9] RUN pip install\n",
    ]
    assert all(shown_when_quiet(x) for x in shown)
    assert not any(shown_when_quiet(x) for x in hidden)


def test_build_arguments_carry_nothing_that_differs_between_builds(kit_repo):
    """buildah copies command-line labels into each intermediate image, and a later build of another env
    or input hash reuses those intermediates as its cache; their ids then reach the runtime's history
    ("FROM <id>"). So the arguments that every stage shares name no env and no input hash: those labels
    come from the Dockerfile's LABEL step, which the input hash covers."""
    for env in ("cu130-torch211", "cu130-torch212"):
        plan = load_plan(kit_repo, env)
        args = build._build_args(plan, {}, build.BuildOptions())
        assert "--label" not in args and not any(plan.input_hash in a or env in a for a in args), args
        dockerfile = render_dockerfile(plan, host_mem_gib=8)
        runtime = dockerfile[dockerfile.index("AS runtime") :]
        assert f'io.flashkit.env="{env}"' in runtime and f'io.flashkit.input-hash="{plan.input_hash}"' in runtime
