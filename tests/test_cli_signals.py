"""SIGTERM (kill, timeout, docker stop, a CI cancel) and Ctrl-C sent to a running `flashkit` command: it unwinds
(its temporary folder removed, the aot tool and that tool's worker stopped), prints one line and exits 143 or
130, the codes a shell gives a process the signal ended.

The command is a real `flashkit aot` in a process of its own; only the compiler is a stand-in: an interpreter
that passes the triton check and whose `-m flash_kernels.aot` starts a worker, says so, and runs on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kitsupport import triton_site

ENV = "cu130-torch211"  # pins triton 3.6.0 in its runtime lock
TRITON = "3.6.0"
TOOL = """\
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open({ready!r} + ".tmp", "w") as f:
    f.write(f"{{os.getpid()}} {{worker.pid}} {{os.getcwd()}}")
os.rename({ready!r} + ".tmp", {ready!r})
time.sleep(60)
"""


def _stand_in_python(tmp_path: Path, ready: Path) -> Path:
    site = triton_site(tmp_path, TRITON)
    tool = tmp_path / "tool.py"
    tool.write_text(TOOL.format(ready=str(ready)))
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ]; then exec "{sys.executable}" "{tool}"; fi\n'
        f'PYTHONPATH="{site}" exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    return python


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie nobody has reaped yet is gone all the same
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _default_signals() -> None:
    # An ignored SIGINT or SIGTERM is inherited (a CI shell's background job): the command would see neither.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [
        (signal.SIGTERM, 143, "flashkit: terminated (SIGTERM); cleaned up"),
        (signal.SIGINT, 130, "flashkit: interrupted"),
    ],
    ids=["sigterm", "ctrl-c"],
)
def test_a_signal_unwinds_the_command_stops_its_children_and_exits_128_plus_its_number(
    kit_repo, tmp_path, sig, code, line
):
    ready, tmp = tmp_path / "ready", tmp_path / "tmp"
    tmp.mkdir()
    python = _stand_in_python(tmp_path / "stand-in", ready)
    cmd = [sys.executable, "-m", "flashkit.cli.main", "--repo", str(kit_repo), "aot", ENV, "--python", str(python)]
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("FLASHKIT_ROOT", None)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_default_signals
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out, err = proc.communicate()
                pytest.fail(f"the stand-in tool never started (exit {proc.returncode}):\n{out}\n{err}")
            time.sleep(0.05)
        tool, worker, cwd = ready.read_text().split(" ", 2)
        pids = [int(tool), int(worker)]
        staged = Path(cwd).parent  # the command's temporary folder, with the staged sources
        assert staged.parent == tmp and staged.is_dir()

        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)

        assert proc.returncode == code, err
        assert err.strip().splitlines()[-1] == line and "Traceback" not in err
        assert not staged.exists() and list(tmp.iterdir()) == []
        assert _gone(pids[0]), f"the aot tool {pids[0]} outlived the command"
        assert _gone(pids[1]), f"the aot tool's worker {pids[1]} was left orphaned"
        assert not list((kit_repo / ".work").glob("aot-parts/*.json")), "an interrupted target was kept"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if pids:  # what a broken handler leaves behind must not outlive the test
            for pid in pids:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_sigterm_is_the_commands_only_while_it_runs_and_a_callers_own_handler_is_kept(kit_repo, cli, monkeypatch):
    from flashkit.cli import plan_cmd

    seen = []
    monkeypatch.setattr(plan_cmd, "cmd_validate", lambda args: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        assert cli("--repo", str(kit_repo), "validate").code == 0
        assert seen[-1] not in (signal.SIG_DFL, signal.SIG_IGN, None)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        def callers(signum, frame):
            pass

        signal.signal(signal.SIGTERM, callers)
        assert cli("--repo", str(kit_repo), "validate").code == 0
        assert seen[-1] is callers and signal.getsignal(signal.SIGTERM) is callers
    finally:
        signal.signal(signal.SIGTERM, previous)


BUILDER = """\
#!{python}
import os, signal, sys, time
def stopped(signum, frame):
    open({marker!r}, "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
with open({pid_file!r}, "w") as f:
    f.write(str(os.getpid()))
print("STEP 1/13: FROM base", flush=True)
time.sleep(60)
"""


def test_a_build_unwound_by_sigterm_passes_it_on_to_buildah(tmp_path):
    """The CLI turns SIGTERM into Terminated in the main thread, i.e. while `flashkit build` reads buildah's
    output; buildah is no child of the signal's sender, so flashkit must stop it. The builder is a stand-in
    that records the SIGTERM it gets."""
    from flashkit.core.errors import Terminated
    from flashkit.images import buildah

    marker, pid_file = tmp_path / "got-sigterm", tmp_path / "pid"
    tool = tmp_path / "buildah"
    tool.write_text(BUILDER.format(python=sys.executable, marker=str(marker), pid_file=str(pid_file)))
    tool.chmod(0o755)
    bh = buildah.Buildah(str(tool), "1.28", "overlay", str(tmp_path / "graph"))

    def signal_arrives(line: str) -> None:
        raise Terminated

    try:
        with pytest.raises(Terminated):
            buildah.stream(bh, ["build"], tmp_path / "build.log", signal_arrives)
        pid = int(pid_file.read_text())
        assert marker.exists(), "buildah never got the SIGTERM"
        assert _gone(pid), f"buildah {pid} outlived the build"
        assert "STEP 1/13" in (tmp_path / "build.log").read_text()
    finally:
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
