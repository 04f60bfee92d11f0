"""The flashkit CLI: subcommands, outputs, exit codes, extension table."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flashkit.cli import main as cli_mod
from flashkit.core import errors
from flashkit.plan.specfile import env_ids

REPO = Path(__file__).resolve().parents[1]
ENVS = env_ids(REPO)


def test_matrix_lists_every_env_with_verdict_and_host_statement(kit_repo, cli):
    res = cli("--repo", str(kit_repo), "matrix", "--wide")
    assert res.code == 0, res.err
    for env in ENVS:
        assert env in res.out
    assert "accepted" in res.out and "not verified" in res.out
    assert "render+lock only" in res.out and "unreachable" in res.out


def test_matrix_json(kit_repo, cli):
    res = cli("--repo", str(kit_repo), "matrix", "--json")
    rows = json.loads(res.out)
    assert [r["env"] for r in rows] == ENVS
    by = {r["env"]: r for r in rows}
    assert by["rocm64-torch27"]["pinned"] is False and by["cu128-torch28"]["pinned"] is True
    assert by["cu130-torch211"]["hosts"] == "build, cpu+gpu tests"
    assert all(r["status"] == "not verified" and r["lock"] == "ok" for r in rows)


def test_matrix_exit_code_when_an_env_is_rejected(kit_repo, cli):
    p = kit_repo / "envs" / "cu124-torch27.yaml"
    p.write_text(p.read_text().replace("cxx11_abi: true", "cxx11_abi: false"))
    res = cli("--repo", str(kit_repo), "matrix")
    assert res.code == 4 and "rejected" in res.out and "pypi-torch-abi" in res.out


def test_render_to_file_and_stdout_agree(kit_repo, cli, tmp_path):
    out = tmp_path / "x" / "Dockerfile"
    res = cli("--repo", str(kit_repo), "--host-mem-gib", "24", "render", "cu124-torch27", "-o", str(out))
    assert res.code == 0
    res2 = cli("--repo", str(kit_repo), "--host-mem-gib", "24", "render", "cu124-torch27")
    assert out.read_text() == res2.out
    assert not list(out.parent.glob(".*tmp"))


def test_hash_prints_the_input_hash(kit_repo, cli):
    res = cli("--repo", str(kit_repo), "hash", "cu124-torch27")
    assert res.code == 0 and res.out.strip().startswith("fk2-")
    res = cli("--repo", str(kit_repo), "hash", "cu124-torch27", "--manifest")
    manifest = json.loads(res.out[: res.out.rindex("}") + 1])
    assert manifest["scheme"] == 2 and manifest["spec"]["id"] == "cu124-torch27"
    assert set(manifest["lock"]) == {"runtime_sha256", "build_sha256", "base_sha256"}


def test_validate_and_lint_all(kit_repo, cli):
    assert cli("--repo", str(kit_repo), "validate").code == 0
    res = cli("--repo", str(kit_repo), "--host-mem-gib", "24", "lint", "--all")
    assert res.code == 0, res.err
    assert res.err.count("hadolint clean") == len(ENVS)
    assert "UNPINNED base" in res.err and "pinned by digest" in res.err


def test_lint_fails_on_findings(kit_repo, cli):
    t = kit_repo / "templates" / "Dockerfile.j2"
    t.write_text(t.read_text().replace("WORKDIR /home/flash\n", "WORKDIR /home/flash\nRUN cd /tmp && ls\n"))
    res = cli("--repo", str(kit_repo), "--host-mem-gib", "24", "lint", "cu124-torch27")
    assert res.code == errors.LintError.exit_code == 6
    assert "DL3003" in res.err


def test_repository_not_found(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("matrix")
    assert res.code == 3 and "no flashkit repository" in res.err


def test_no_command_prints_help_and_usage_code(cli):
    res = cli()
    assert res.code == 2 and "exit codes:" in res.err


def test_internal_errors_hide_the_traceback_unless_debug(kit_repo, cli, monkeypatch):
    from flashkit.cli import plan_cmd

    def boom(args):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(plan_cmd, "cmd_validate", boom)
    res = cli("--repo", str(kit_repo), "validate")
    assert res.code == 1 and "kaboom" in res.err and "Traceback" not in res.err
    res = cli("--debug", "--repo", str(kit_repo), "validate")
    assert res.code == 1 and "Traceback" in res.err


def test_every_error_class_has_its_own_documented_exit_code():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.FlashkitError)]
    codes = [c.exit_code for c in classes if c is not errors.FlashkitError]
    assert len(codes) == len(set(codes)), "two error classes share an exit code"
    table = (REPO / "docs" / "exit-codes.md").read_text()
    for code in codes:
        assert f"  {code}  " in cli_mod.EPILOG or f"  {code}    " in cli_mod.EPILOG
        assert f"| {code} |" in table, f"exit code {code} is not in docs/exit-codes.md's table"
    assert 1 not in codes, "exit 1 is reserved for bugs in flashkit"


def test_the_docs_exit_code_table_is_the_one_help_prints():
    section = (REPO / "docs" / "exit-codes.md").read_text().split("# Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = tuple(re.findall(r"^\| (\d+) \| (.*) \|$", section, re.MULTILINE))
    assert rows == errors.EXIT_CODES
    assert {"130", "143"} <= dict(rows).keys()  # Ctrl-C and SIGTERM, after the clean-up


def test_a_reader_that_stops_reading_ends_the_command_quietly(kit_repo):
    """`flashkit matrix | head -1`: the pipe closes before the command writes; exit 141, no internal error."""
    cmd = [sys.executable, "-c", "import sys; from flashkit.cli.main import main; sys.exit(main())"]
    proc = subprocess.Popen([*cmd, "--repo", str(kit_repo), "matrix"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the interpreter has even imported flashkit
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == errors.EXIT_BROKEN_PIPE, err
    assert "internal error" not in err and "Traceback" not in err and "Exception ignored" not in err


def test_a_broken_pipe_that_is_not_stdout_is_still_an_internal_error(kit_repo, cli, monkeypatch):
    """A closed socket or child pipe is a failure to report; only a closed stdout ends quietly with 141."""
    from flashkit.cli import matrix_cmd

    def closed_socket(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(matrix_cmd, "cmd_matrix", closed_socket)
    r = cli("--repo", str(kit_repo), "matrix")
    assert r.code == errors.EXIT_INTERNAL and "internal error: BrokenPipeError" in r.err


def test_console_script_runs(kit_repo):
    exe = shutil.which("flashkit") or str(Path(sys.executable).parent / "flashkit")
    if not Path(exe).exists():
        pytest.skip("flashkit console script not installed in this environment")
    proc = subprocess.run([exe, "--repo", str(kit_repo), "render", "nope-torch27"], capture_output=True, text=True)
    assert proc.returncode == 3 and proc.stdout == ""
    assert "invalid env id 'nope-torch27'" in proc.stderr and "Known envs: cu124-torch210, cu124-torch26" in proc.stderr


def test_nox_lists_a_test_session_for_every_env():
    pytest.importorskip("nox")
    proc = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "-f", str(REPO / "noxfile.py")], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    for env in ENVS:
        for kind in ("lock", "render", "build", "test"):
            assert f"{kind}-{env} -> " in proc.stdout
    assert "* tests -> " in proc.stdout and "* lint -> " in proc.stdout and "kernels-cpu -> " in proc.stdout


def test_matrix_verbose_and_json_say_why_each_rule_accepts(kit_repo, cli):
    res = cli("--repo", str(kit_repo), "matrix", "-v")
    assert "accepted by pypi-torch-abi: PyPI torch 2.6.0 uses the pre-cxx11 ABI, as declared" in res.out
    rows = json.loads(cli("--repo", str(kit_repo), "matrix", "--json").out)
    rules_of = {r["env"]: {x["rule"]: x for x in r["rules"]} for r in rows}
    assert rules_of["cu130-torch211"]["cuda13-needs-torch29"] == {
        "rule": "cuda13-needs-torch29",
        "accepted": True,
        "why": "torch 2.11.0 supports CUDA 13",
    }
