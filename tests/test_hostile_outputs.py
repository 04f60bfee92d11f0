"""Hostile output paths: every command that writes a file or a folder follows one rule
(flashkit/core/outputs.py). Each case runs the real command as a process on a throwaway checkout that is a
git repository, and checks the documented exit code, that no traceback was printed, that nothing hung, that
nothing under ``.git`` changed and that nothing was written where the path led."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from kitsupport import run_flashkit, run_process, snapshot

from flashkit.core.errors import KeyFileError, UsageError

ENV = "cu130-torch211"
# A name under /dev that no system has: if the rule failed, the command would create it (as root, /dev takes
# new files); the test removes it again and fails.
DEV = f"/dev/flashkit-held-out-{os.getpid()}"


@pytest.fixture
def repo(kit_repo: Path) -> Path:
    """A throwaway checkout with a .git directory, a symlink to it, a bare repository beside the envs, a file
    and a folder of someone else's files."""
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(kit_repo)], check=True)
    (kit_repo / "link-to-git").symlink_to(".git")
    subprocess.run(["git", "init", "-q", "--bare", str(kit_repo / "bare.git")], check=True)
    (kit_repo / "a-file").write_text("someone's file\n")
    (kit_repo / "theirs").mkdir()
    (kit_repo / "theirs" / "keep.txt").write_text("keep\n")
    (kit_repo / "dangling").symlink_to(kit_repo / "nowhere")
    (kit_repo / "loop").symlink_to("loop")
    return kit_repo


def _git_state(root: Path) -> dict[str, str]:
    return {**snapshot(root / ".git"), **{f"bare/{k}": v for k, v in snapshot(root / "bare.git").items()}}


# (case id, command arguments with @R@ for the checkout, expected exit code)
CASES: list[tuple[str, tuple[str, ...], int]] = []
for where, target in {
    "a file": "@R@/a-file",
    "under a file": "@R@/a-file/site",
    "proc": "/proc/flashkit/site",
    "proc-self": "/proc/self/site",
    "sys": "/sys/flashkit-site",
    "dev": DEV,
    "git-refs-tags": "@R@/.git/refs/tags/site",
    "git-objects": "@R@/.git/objects/site",
    "git-itself": "@R@/.git",
    "through-a-link-to-git": "@R@/link-to-git/hooks/site",
    "a-link-to-git": "@R@/link-to-git",
    "bare-repository": "@R@/bare.git/refs/site",
    "someone-elses-folder": "@R@/theirs",
    "dangling-symlink": "@R@/dangling",
}.items():
    CASES.append((f"site --out {where}", ("site", "--out", target), UsageError.exit_code))
for where, target in {
    "git-hook": "@R@/.git/hooks/pre-commit",
    "dev": f"{DEV}/Dockerfile",
    "proc": "/proc/self/environ",
    "a-folder": "@R@/theirs",
    "under a file": "@R@/a-file/Dockerfile",
    "through-a-link-to-git": "@R@/link-to-git/config",
    "bare-repository": "@R@/bare.git/HEAD",
}.items():
    CASES.append((f"render -o {where}", ("render", ENV, "-o", target), UsageError.exit_code))
CASES += [
    ("ci-workflow -o into .git", ("ci-workflow", "-o", "@R@/.git/workflows/ci.yml"), UsageError.exit_code),
    ("bake -o /sys", ("bake", "-o", "/sys/kernel/flashkit.json"), UsageError.exit_code),
    ("ci-matrix -o a link into .git", ("ci-matrix", "-o", "@R@/link-to-git/info/m.json"), UsageError.exit_code),
    ("wheelhouse --all --out .git", ("wheelhouse", "--all", "--out", "@R@/.git/refs/heads/w"), UsageError.exit_code),
    ("wheelhouse --all --out /proc", ("wheelhouse", "--all", "--out", "/proc/flashkit"), UsageError.exit_code),
    ("wheelhouse ENV --out /dev", ("wheelhouse", ENV, "--wheel", "x.whl", "--out", DEV), UsageError.exit_code),
    ("wheelhouse --all --out a file", ("wheelhouse", "--all", "--out", "@R@/a-file"), UsageError.exit_code),
    ("key generate into .git", ("key", "generate", "@R@/.git/keys"), KeyFileError.exit_code),
    ("key generate under /dev", ("key", "generate", DEV), KeyFileError.exit_code),
    ("key generate under a file", ("key", "generate", "@R@/a-file/keys"), KeyFileError.exit_code),
    ("key generate into a symlink loop", ("key", "generate", "@R@/loop"), KeyFileError.exit_code),
]
# Paths that cannot name a file at all: every command refuses them by the same rule, before any work.
for where, target in {
    "a name over 255 bytes": "@R@/" + "x" * 300,
    "a path over 4096 bytes": "@R@/" + "/".join(["y" * 200] * 30),
    "a newline": "@R@/a\nb",
    "a symlink loop on the way": "@R@/loop/out",
}.items():
    CASES += [
        (f"render -o {where}", ("render", ENV, "-o", target), UsageError.exit_code),
        (f"ci-matrix -o {where}", ("ci-matrix", "-o", target), UsageError.exit_code),
        (f"site --out {where}", ("site", "--out", target), UsageError.exit_code),
        (f"wheelhouse --all --out {where}", ("wheelhouse", "--all", "--out", target), UsageError.exit_code),
        (f"key generate {where}", ("key", "generate", target), KeyFileError.exit_code),
    ]


@pytest.mark.parametrize(("argv", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_output_path_that_is_not_a_place_for_files_is_refused(argv, code, repo):
    git_before, entries_before = _git_state(repo), sorted(os.listdir(repo))
    others_before = snapshot(repo / "theirs")
    args = [a.replace("@R@", str(repo)) for a in argv]
    try:
        r = run_flashkit(repo, *args)
    finally:
        created = os.path.lexists(DEV)
        if created:
            (shutil.rmtree if os.path.isdir(DEV) else os.unlink)(DEV)
    assert r.clean(code), (r.code, r.err)
    assert f"{args[-1][:200]}" in r.err or repr(args[-1]) in r.err  # the message names the path
    assert not created, f"{DEV} was written"
    assert _git_state(repo) == git_before and sorted(os.listdir(repo)) == entries_before
    assert snapshot(repo / "theirs") == others_before and (repo / "a-file").read_text() == "someone's file\n"


@pytest.mark.parametrize("path", ["/dev/stdout", "/dev/null", "/dev/fd/1", "/proc/self/fd/1", "/sys/power/state"])
def test_device_nodes_and_their_links_are_refused(path):
    """Checked by the rule itself, never by running a command: a regression would replace the host's node."""
    from flashkit.core import outputs

    with pytest.raises(UsageError, match=r"lies under /(dev|proc|sys)"):
        outputs.check_file(path, flag="-o")


def test_the_rule_allows_what_it_should(repo, tmp_path):
    """A folder beside the checkout, a new folder through a symlinked parent, and /dev/shm are written."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    for out in (tmp_path / "site", tmp_path / "via" / "site"):
        r = run_flashkit(repo, "site", "--out", str(out))
        assert r.clean(0), r.err
        assert (out / "index.html").is_file()
    assert run_flashkit(repo, "render", ENV, "-o", str(tmp_path / "new" / "Dockerfile")).clean(0)
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        shm = Path("/dev/shm") / f"flashkit-site-{os.getpid()}"
        try:
            assert run_flashkit(repo, "site", "--out", str(shm)).clean(0)
        finally:
            shutil.rmtree(shm, ignore_errors=True)


def test_a_bad_out_is_refused_before_the_work(repo):
    """The path is checked first: with a spec that does not validate too, the answer is still exit 2."""
    (repo / "envs" / "cu124-torch27.yaml").write_text("torch: !foo bar\n")
    r = run_flashkit(repo, "site", "--out", str(repo / ".git" / "site"))
    assert r.clean(UsageError.exit_code) and "inside the git directory" in r.err, r.err


def test_a_file_system_that_cannot_take_the_output_is_a_usage_error(cli, kit_repo, tmp_path, monkeypatch):
    """No space left (simulated where the temporary file is written): exit 2 naming the path, nothing left."""
    from flashkit.core import atomic

    def full(path, text):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(atomic, "_stage", full)
    out = tmp_path / "new" / "deeper" / "Dockerfile"
    r = cli("--repo", str(kit_repo), "render", ENV, "-o", str(out))
    assert r.code == UsageError.exit_code and f"-o {out}: cannot write it: No space left on device" in r.err, r.err
    assert not (tmp_path / "new").exists()  # the folders it made for the file are gone again


PROBE_TARGETS = {
    "a git hook": "@R@/.git/hooks/pre-commit",
    "a link into .git": "@R@/link-to-git/refs/facts.json",
    "proc": "/proc/self/facts.json",
    "dev": DEV,
    "a symlink loop on the way": "@R@/loop/facts.json",
    "a name over 255 bytes": "@R@/" + "x" * 300,
    "a folder": "@R@/theirs",
}


@pytest.mark.parametrize("target", PROBE_TARGETS.values(), ids=PROBE_TARGETS.keys())
def test_the_doctor_probe_writes_by_the_same_rule(target, repo):
    """`python -m flashkit.doctor.probe -o` (run on GPU hosts and in images) refuses what `render -o` refuses,
    before it probes anything."""
    git_before = _git_state(repo)
    out = target.replace("@R@", str(repo))
    try:
        r = run_process("flashkit.doctor.probe", "--no-import", "--no-elf", "-o", out, cwd=repo)
    finally:
        created = os.path.lexists(DEV)
        if created:
            os.unlink(DEV)
    assert r.clean(UsageError.exit_code) and "-o " in r.err, (r.code, r.err[-600:])
    assert not created and _git_state(repo) == git_before
    assert sorted(os.listdir(repo / "theirs")) == ["keep.txt"]


ARTIFACT_TARGETS = {
    "--out into .git": ("--out", "@R@/.git/refs/tags/r.json"),
    "--out under /dev": ("--out", f"{DEV}.json"),
    "--out under /proc": ("--out", "/proc/self/r.json"),
    "--out whose report lands on a folder": ("--out", "@R@/theirs/x"),
    "--log into a link to .git": ("--log", "@R@/link-to-git/suite.log"),
    "--log a symlink loop": ("--log", "@R@/loop"),
}


@pytest.mark.parametrize(("flag", "target"), ARTIFACT_TARGETS.values(), ids=ARTIFACT_TARGETS.keys())
def test_the_gpu_host_runner_writes_by_the_same_rule(flag, target, repo, tmp_path):
    """artifact_check's result, its JUnit report beside it and its log: refused before anything runs."""
    import hashlib
    import zipfile

    wheel = tmp_path / "flash_kernels-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("flash_kernels/__init__.py", "")
    if target.endswith("theirs/x"):
        (repo / "theirs" / "x.junit.xml").mkdir()
    args = {"--out": str(tmp_path / "r.json"), flag: target.replace("@R@", str(repo))}
    git_before = _git_state(repo)
    try:
        r = run_process(
            "flashkit.evidence.artifact_check", str(wheel), "--expect-sha256",
            hashlib.sha256(wheel.read_bytes()).hexdigest(), "--env", ENV, "--input-hash", "fk2-x",
            "--expect-torch", "2.11", "--expect-cuda", "13", *(a for kv in args.items() for a in kv), cwd=tmp_path,
        )  # fmt: skip
    finally:
        created = os.path.lexists(f"{DEV}.json")
        if created:
            os.unlink(f"{DEV}.json")
    assert r.clean(2) and flag in r.err, (r.code, r.err[-600:])
    assert not created and _git_state(repo) == git_before and not (tmp_path / "r.json").exists()
