"""Hostile input to verify-image, key generate, gc, aot and ci-workflow: each is a clear error with its documented exit code,
writes nothing outside the declared output, and does not hang."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import pytest

from flashkit.core.errors import KeyFileError, PushFailed, UsageError
from flashkit.images import gc

# --- verify-image: a registry that accepts the connection and never answers


@pytest.fixture
def silent_registry():
    """A loopback server that accepts every connection and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_verify_image_against_a_silent_registry_times_out(cli, tmp_path, monkeypatch, silent_registry):
    if not shutil.which("skopeo"):
        pytest.skip("skopeo is not installed")
    from flashkit.publish import attest

    _, pub = attest.generate_keys(tmp_path / "keys", repo_root=None)
    monkeypatch.setenv("FLASHKIT_REGISTRY_TIMEOUT", "2")
    started = time.monotonic()
    r = cli("verify-image", f"{silent_registry}/org/flash:tag", "--key", str(pub))
    assert time.monotonic() - started < 30
    assert r.code == PushFailed.exit_code and f"{silent_registry} did not answer within 2s" in r.err, r.err
    assert "FLASHKIT_REGISTRY_TIMEOUT" in r.err


def test_a_bad_registry_timeout_is_a_usage_error(cli, tmp_path, monkeypatch):
    if not shutil.which("skopeo"):
        pytest.skip("skopeo is not installed")
    from flashkit.publish import attest

    _, pub = attest.generate_keys(tmp_path / "keys", repo_root=None)
    monkeypatch.setenv("FLASHKIT_REGISTRY_TIMEOUT", "forever")
    r = cli("verify-image", "127.0.0.1:9/org/flash:tag", "--key", str(pub))
    assert r.code == UsageError.exit_code and "FLASHKIT_REGISTRY_TIMEOUT='forever'" in r.err


# --- key generate


def test_key_generate_does_not_write_through_a_planted_symlink(cli, tmp_path):
    keys, target = tmp_path / "keys", tmp_path / "elsewhere"
    for name in ("flashkit.pub", "flashkit.key"):
        keys.mkdir(exist_ok=True)
        for f in keys.iterdir():
            f.unlink()
        (keys / name).symlink_to(target)  # dangling: exists() would say there is nothing there
        r = cli("key", "generate", str(keys))
        assert r.code == KeyFileError.exit_code and f"{keys / name} is a symlink" in r.err, r.err
        assert not target.exists() and sorted(p.name for p in keys.iterdir()) == [name]


def test_key_generate_into_a_file_or_an_uncreatable_folder_is_a_key_error(cli, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = cli("key", "generate", str(f))
    assert r.code == KeyFileError.exit_code and "is not a folder" in r.err
    r = cli("key", "generate", "/proc/self/no/such/folder")
    assert r.code == KeyFileError.exit_code and "lies under /proc" in r.err and "Traceback" not in r.err
    r = cli("key", "generate", str(f / "keys"))
    assert r.code == KeyFileError.exit_code and f"{f} is not a folder" in r.err


# --- gc: only flashkit's own images, whatever --prefix says


@pytest.mark.parametrize("prefix", ["", "\n", "flashkit/\n", "flash kit/", "flashkit", "/", "Flashkit/", "a//"])
def test_gc_refuses_a_prefix_that_is_not_a_namespace(prefix, cli, kit_repo):
    with pytest.raises(UsageError):
        gc.choose(["debian:bookworm", "flashkit/cu130-torch211:fk2-ab"], set(), prefix=prefix)
    r = cli("--repo", str(kit_repo), "gc", "--dry-run", "--prefix", prefix)
    assert r.code == UsageError.exit_code and "is not an image namespace" in r.err, r.err


def test_gc_selects_only_repositories_one_level_under_the_namespace():
    tags = [
        "flashkit/cu130-torch211:fk2-ab",
        "flashkit/debian:bookworm-0123",
        "flashkit/nested/other:1",  # not a name flashkit makes
        "flashkit/x",  # no tag
        "flashkitx/cu130-torch211:fk2-ab",
        "registry.example/flashkit/cu130-torch211:fk2-ab",
    ]
    assert gc.choose(tags, set()).remove == ("flashkit/cu130-torch211:fk2-ab", "flashkit/debian:bookworm-0123")


# --- aot --python


def test_aot_python_that_is_not_an_interpreter_is_a_usage_error(cli, kit_repo, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for bad, why in (("/dev/null", "is not a regular file"), (str(fifo), "is not a regular file"),
                     (str(tmp_path), "is not a regular file"), (str(tmp_path / "nope"), "No such file")):  # fmt: skip
        started = time.monotonic()
        r = cli("--repo", str(kit_repo), "aot", "cu130-torch211", "--python", bad)
        assert r.code == UsageError.exit_code and f"--python {bad}" in r.err and why in r.err, r.err
        assert time.monotonic() - started < 10  # a FIFO is never opened
    assert not (kit_repo / ".work").exists()


# --- ci-workflow -o through a folder symlink: written where the named path leads, documented


def test_ci_workflow_output_follows_a_folder_symlink_and_replaces_a_file_symlink(cli, kit_repo, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert cli("--repo", str(kit_repo), "ci-workflow", "-o", str(tmp_path / "link" / "ci.yml")).code == 0
    assert (real / "ci.yml").is_file()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out.yml"
    out.symlink_to(victim)
    assert cli("--repo", str(kit_repo), "ci-workflow", "-o", str(out)).code == 0
    assert victim.read_text() == "precious" and not out.is_symlink()
    r = cli("--repo", str(kit_repo), "ci-workflow", "-h")
    assert "never written through" in " ".join(r.out.split())


# --- command-line values that no command can use: a usage error (or an unknown env, 3) before any work
BAD_ARGS = {
    "a runner label with a newline": (("ci-matrix", "--runner", "a\nb: c"), UsageError.exit_code, "--runner"),
    "a GPU runner label with a space": (("ci-matrix", "--gpu-runner", "gpu box"), UsageError.exit_code, "--gpu-runner"),
    "no tier at all": (("verify", "cu130-torch211", "--tiers", ""), UsageError.exit_code, "--tiers"),
    "doctor --timeout nan": (("doctor", "--no-import", "--timeout", "nan"), UsageError.exit_code, "--timeout"),
    "doctor --timeout 1e300": (("doctor", "--no-import", "--timeout", "1e300"), UsageError.exit_code, "--timeout"),
    "ledger show of an unknown env": (("ledger", "show", "cu130-torch112"), 3, "Known envs"),
}


@pytest.mark.parametrize(("argv", "code", "named"), BAD_ARGS.values(), ids=BAD_ARGS.keys())
def test_a_value_no_command_can_use_is_refused_first(argv, code, named, cli, kit_repo):
    r = cli("--repo", str(kit_repo), *argv)
    assert r.code == code and named in r.err, (r.code, r.err[-600:])


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e300"])
def test_the_doctor_probe_refuses_a_timeout_subprocess_cannot_take(value, tmp_path):
    from kitsupport import run_process

    r = run_process("flashkit.doctor.probe", "--no-import", "--timeout", value, cwd=tmp_path)
    assert r.clean(UsageError.exit_code) and "--timeout" in r.err, (r.code, r.err[-600:])


# --- an input path too long to look up (ENAMETOOLONG): the command's own "not found", never an internal error
LONG = "/tmp/" + "x" * 300
LONG_INPUTS = {
    "ledger merge": (("ledger", "merge", LONG), 14),
    "site --with-publication": (("site", "--out", "@T@/site", "--with-publication", LONG), UsageError.exit_code),
    "wheelhouse --wheel": (("wheelhouse", "cu130-torch211", "--wheel", LONG, "--out", "@T@/w"), 17),
    "--repo": (("--repo", LONG, "matrix"), 3),
}


@pytest.mark.parametrize(("argv", "code"), LONG_INPUTS.values(), ids=LONG_INPUTS.keys())
def test_an_input_path_too_long_to_look_up_is_the_commands_own_error(argv, code, cli, kit_repo, tmp_path):
    args = [a.replace("@T@", str(tmp_path)) for a in argv]
    r = cli(*(args if args[0] == "--repo" else ["--repo", str(kit_repo), *args]))
    assert r.code == code and "internal error" not in r.err, (r.code, r.err[-600:])


def test_flashkit_root_too_long_to_look_up_is_exit_3(cli, monkeypatch):
    monkeypatch.setenv("FLASHKIT_ROOT", LONG)
    r = cli("matrix")
    assert r.code == 3 and "FLASHKIT_ROOT" in r.err, (r.code, r.err[-600:])
