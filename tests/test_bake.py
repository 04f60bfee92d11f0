"""`flashkit bake` and `flashkit ci-matrix`: pure planners over the repository's specs."""

from __future__ import annotations

import json
import re

import pytest
from kitsupport import dockerfile, input_hash

from flashkit.plan import bake, ci_matrix, inputhash
from flashkit.plan.specfile import load_all

MEM = "24"


@pytest.fixture
def fk(cli):
    return cli


def _plans(root, envs):
    from flashkit.plan.plan import load_plan, plan_of

    return [load_plan(root, e) for e in envs] if envs else [plan_of(root, s) for s in load_all(root)]


def test_bake_file_for_all_envs(kit_repo, fk):
    r = fk("--repo", str(kit_repo), "--host-mem-gib", MEM, "bake")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    ids = sorted(str(s.id) for s in load_all(kit_repo))
    assert doc["group"]["wheels"]["targets"] == [f"{e}-wheel" for e in ids]
    assert doc["group"]["default"]["targets"] == [t for e in ids for t in (f"{e}-builder", e)]
    assert doc["variable"] == {"FLASHKIT_CA_FILE": {"default": "/etc/ssl/certs/ca-certificates.crt"}}
    # Same inputs, same bytes.
    assert fk("--repo", str(kit_repo), "--host-mem-gib", MEM, "bake").out == r.out


def test_bake_targets_match_a_local_build(kit_repo):
    env = "cu130-torch211"
    doc, skipped = bake.select(_plans(kit_repo, [env]), True, 24)
    assert skipped == [] and set(doc["target"]) == {env, f"{env}-builder", f"{env}-wheel"}
    h = input_hash(kit_repo, env)
    tag = inputhash.tag_suffix(h)
    rt, bt, wt = doc["target"][env], doc["target"][f"{env}-builder"], doc["target"][f"{env}-wheel"]
    assert rt["dockerfile-inline"] == bake.literal(dockerfile(kit_repo, env, 24))  # bake's HCL templating, escaped
    assert (rt["target"], bt["target"], wt["target"]) == ("runtime", "builder", "wheel")
    assert rt["tags"] == [f"flashkit/{env}:{tag}"] and bt["tags"] == [f"flashkit/{env}:{tag}-builder"]
    assert rt["labels"] == {"io.flashkit.env": env, "io.flashkit.input-hash": h}
    assert wt["output"] == [f"type=local,dest=.work/wheels/{env}/bake"]
    assert rt["secret"] == ["id=ca,src=${FLASHKIT_CA_FILE}"]
    # The context is the repository root: every path the Dockerfile copies or binds from it must exist there.
    text = rt["dockerfile-inline"]
    sources = re.findall(r"--mount=type=bind,source=([^,\s]+)", text) + re.findall(
        r"^COPY (?!--from)(\S+)", text, flags=re.M
    )
    assert sources
    for src in sources:
        assert (kit_repo / rt["context"] / src).exists(), src


def test_bake_leaves_out_rejected_envs_and_refuses_them_by_name(kit_repo, fk, tmp_path):
    p = kit_repo / "envs" / "cu124-torch27.yaml"
    p.write_text(p.read_text().replace("cxx11_abi: true", "cxx11_abi: false"))
    out = tmp_path / "bake" / "docker-bake.json"
    r = fk("--repo", str(kit_repo), "--host-mem-gib", MEM, "bake", "-o", str(out))
    assert r.code == 0 and "left out: cu124-torch27: rejected by rule pypi-torch-abi" in r.err
    assert "cu124-torch27" not in json.loads(out.read_text())["target"]
    assert not list(out.parent.glob(".*tmp"))
    r = fk("--repo", str(kit_repo), "--host-mem-gib", MEM, "bake", "cu124-torch27")
    assert r.code == 4 and "pypi-torch-abi" in r.err and r.out == ""


def test_bake_unknown_env_is_invalid_input(kit_repo, fk):
    r = fk("--repo", str(kit_repo), "bake", "cu130-torch2111")
    assert r.code == 3


def test_ci_matrix_rows(kit_repo, fk):
    r = fk("--repo", str(kit_repo), "ci-matrix", "--compact")
    assert r.code == 0, r.err
    assert "\n" not in r.out.strip()
    doc = json.loads(r.out)
    ids = sorted(str(s.id) for s in load_all(kit_repo))
    assert [row["env"] for row in doc["include"]] == ids
    row = next(x for x in doc["include"] if x["env"] == "cu130-torch211")
    h = input_hash(kit_repo, "cu130-torch211")
    assert row == {
        "env": "cu130-torch211",
        "input_hash": h,
        "image_tag": f"flashkit/cu130-torch211:{inputhash.tag_suffix(h)}",
        "python": "3.11",
        "torch": "2.11.0",
        "accelerator": "cuda13.0",
        "kind": "build",
        "tiers": "build,abi,cpu",
        "runner": "ubuntu-latest",
        "name": "cu130-torch211 (build)",
    }
    assert "GPU tiers are not in this matrix" in r.err


def test_ci_matrix_gpu_rows_only_for_cuda_with_a_runner(kit_repo):
    doc, _ = ci_matrix.select(_plans(kit_repo, []), False, runner="self-hosted-cpu", gpu_runner="h200")
    gpu = [x for x in doc["include"] if x["kind"] == "gpu"]
    cuda = sorted(str(s.id) for s in load_all(kit_repo) if s.accelerator.kind == "cuda")
    assert [x["env"] for x in gpu] == cuda
    assert all(x["runner"] == "h200" and x["tiers"] == "gpu" for x in gpu)
    assert all(x["runner"] == "self-hosted-cpu" for x in doc["include"] if x["kind"] == "build")


def test_ci_matrix_hash_follows_the_lockfile(kit_repo):
    before, _ = ci_matrix.select(_plans(kit_repo, ["cu130-torch211"]), True, runner="r", gpu_runner=None)
    lock = kit_repo / "lockfiles" / "cu130-torch211" / "py3.11.txt"
    lock.write_text(lock.read_text() + "# changed\n")
    after, _ = ci_matrix.select(_plans(kit_repo, ["cu130-torch211"]), True, runner="r", gpu_runner=None)
    assert before["include"][0]["input_hash"] != after["include"][0]["input_hash"]


# -- docker buildx reads the file -----------------------------------------------------------------------------
# The nox tests session unpacks trixie's docker-buildx into .work/buildx (bookworm has none); .ci/run sets
# FLASHKIT_REQUIRE_BUILDX=1, so there a missing buildx fails the check instead of skipping it.
def _buildx() -> str | None:
    import shutil

    from kitsupport import REPO

    local = REPO / ".work" / "buildx" / "docker-buildx"
    return str(local) if local.is_file() else shutil.which("docker-buildx")


def test_bake_strings_are_literal_for_the_hcl_templating():
    assert bake.literal('pip --index-url "${index:-https://pypi.org/simple}" %{x}') == (
        'pip --index-url "$${index:-https://pypi.org/simple}" %%{x}'
    )


@pytest.mark.skipif(
    _buildx() is None and not __import__("os").environ.get("FLASHKIT_REQUIRE_BUILDX"),
    reason="no docker-buildx here (the nox tests session fetches Debian trixie's)",
)
def test_buildx_reads_the_bake_file_and_gives_back_every_dockerfile(kit_repo, fk, tmp_path):
    import subprocess

    exe = _buildx()
    assert exe is not None, "no docker-buildx found (FLASHKIT_REQUIRE_BUILDX is set): see noxfile._buildx"
    r = fk("--repo", str(kit_repo), "--host-mem-gib", MEM, "bake")
    assert r.code == 0, r.err
    (tmp_path / "bake.json").write_text(r.out)
    doc = json.loads(r.out)
    for group in ("default", "wheels"):
        # buildx as a standalone program: `--print` parses, resolves and prints; no daemon, no build.
        run = subprocess.run(
            [exe, "bake", "--print", "-f", "bake.json", group],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        printed = json.loads(run.stdout)["target"]
        for name, target in printed.items():
            ours = doc["target"][name]["dockerfile-inline"]
            assert target["dockerfile-inline"] == ours.replace("$${", "${").replace("%%{", "%{"), name
    consumer = next(e for e in doc["target"] if e.startswith("cu130-torch212"))
    src = next(k for k in doc["target"]["cu130-torch212"]["contexts"])
    assert doc["target"]["cu130-torch212"]["contexts"][src] == "target:cu130-torch211-builder", consumer
