"""Bad input, across commands: every case ends in its documented exit code, a message naming the file and
the field, no traceback, no hang, and nothing written.

Each case changes one thing in a throwaway copy of the repository (or gives one bad argument) and runs the
real command in-process. A case that would block (a FIFO opened for reading) is stopped by an alarm and
fails the test instead of hanging the run. Spec-field cases live in test_bad_specs.py and imported GPU
results in test_gpu_import.py; this file covers the other inputs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kitsupport import artifact, full_ledger, input_hash, snapshot, verdict

from flashkit.core.errors import FlashkitError, PullBackMismatch
from flashkit.ledger import store
from flashkit.publish.registry import Registry, Target, access, manifest_parts

ENV = "cu130-torch211"
SPEC = f"envs/{ENV}.yaml"
LOCK = f"lockfiles/{ENV}/py3.11.txt"  # the image's own set (its Python is 3.11)
TEMPLATE = "templates/Dockerfile.j2"


@pytest.fixture(autouse=True)
def no_hang():
    def stop(signum, frame):
        raise TimeoutError("the command did not finish in 60 s: it hangs on this input")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def edit(rel: str, old: str, new: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        p = root / rel
        text = p.read_text()
        assert old in text, f"{old!r} not in {rel}"
        p.write_text(text.replace(old, new, 1))

    return apply


def replace_with(rel: str, kind: str, payload: bytes | str = b"") -> Callable[[Path], None]:
    """Make ``rel`` a FIFO, a directory, a symlink to ``payload``, or a file of ``payload`` bytes."""

    def apply(root: Path) -> None:
        p = root / rel
        if p.exists() or p.is_symlink():
            p.unlink()
        p.parent.mkdir(parents=True, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "dir":
            p.mkdir()
        elif kind == "symlink":
            p.symlink_to(payload)
        else:
            p.write_bytes(payload if isinstance(payload, bytes) else payload.encode())

    return apply


def append_bytes(rel: str, data: bytes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        with open(root / rel, "ab") as fh:
            fh.write(data)

    return apply


def ledger_lines(*lines: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        p = store.ledger_path(root, ENV)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(line + "\n" for line in lines))

    return apply


def build_result(text: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        p = root / ".work" / "builds" / f"{ENV}-{input_hash(root, ENV)}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    return apply


def _valid_build_result(root: Path) -> dict:
    return {
        "env": ENV, "input_hash": input_hash(root, ENV), "runtime_ref": "r", "runtime_id": "sha256:" + "1" * 64,
        "builder_ref": "b", "builder_id": "sha256:" + "2" * 64, "runtime_size": 1, "builder_size": 1,
        "wheel_path": "w.whl", "wheel_sha256": "3" * 64, "lock_sha256": "4" * 64, "base_image_id": None,
        "built": True, "seconds": 1.0, "log_path": "l", "context": {}, "date": "2026-12-01T00:00:00+00:00",
        "runtime_base_id": None, "builder": {},
    }  # fmt: skip


def build_result_with(**changes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = _valid_build_result(root)
        for k, v in changes.items():
            if v is KeyError:
                data.pop(k)
            else:
                data[k] = v
        build_result(json.dumps(data))(root)

    return apply


def passed_with_nothing(root: Path) -> None:
    art = artifact(ENV, input_hash(root, ENV))
    body = json.loads(verdict(art, "cpu").line())
    body.update(counts={"tests": 0, "passed": 0})
    from flashkit.ledger.model import content_id

    body["id"] = content_id(body)
    ledger_lines(art.line(), json.dumps(body))(root)


def legacy_record(root: Path) -> None:
    (root / "verified").mkdir(exist_ok=True)
    (root / "verified" / f"{ENV}.json").write_text('{"schema": 1, "entries": {}}')


@dataclass(frozen=True)
class Case:
    setup: Callable[[Path], None] | None
    argv: tuple[str, ...]
    code: int
    needles: tuple[str, ...]  # the file (or argument) and the field, as the message must name them
    environ: dict[str, str] = field(default_factory=dict)


OUT = "@OUT@"  # replaced by a path outside the repository
CASES: dict[str, Case] = {
    # -- spec files: what reaches the Dockerfile is matched whole; the file itself is read safely
    "ref-trailing-newline": Case(
        edit(SPEC, "ref: flashkit/debian:bookworm", 'ref: "flashkit/debian:bookworm\\n"'),
        ("render", ENV),
        3,
        (SPEC, "base.ref"),
    ),
    "gpu-target-trailing-newline": Case(
        edit(SPEC, '"9.0a"]', '"9.0a\\n"]'), ("render", ENV), 3, (SPEC, "gpu_targets[1]")
    ),
    "tag-trailing-newline": Case(
        edit(SPEC, '"torch2.11-cu13.0-py3.11"', '"torch2.11-cu13.0-py3.11\\n"'),
        ("render", ENV),
        3,
        (SPEC, "publish_tags[0]"),
    ),
    "python-trailing-newline": Case(
        edit(SPEC, 'python: "3.11"', 'python: "3.11\\n"'), ("render", ENV), 3, (SPEC, "python")
    ),
    "torch-trailing-newline": Case(
        edit(SPEC, 'torch: "2.11.0"', 'torch: "2.11.0\\n"'), ("render", ENV), 3, (SPEC, "torch")
    ),
    "nvcc-version-newline": Case(
        edit(SPEC, 'version: "13.0.88"', 'version: "13.0.88\\nRUN id"'), ("render", ENV), 3, (SPEC, "compiler.version")
    ),
    "lock-date-newline": Case(
        edit(SPEC, '"2026-11-30T00:00:00Z"', '"2026-11-30T00:00:00Z\\n"'),
        ("render", ENV),
        3,
        (SPEC, "lock.exclude_newer"),
    ),
    "notes-escape-sequence": Case(edit(SPEC, "notes: ", 'notes: "\\e[31mred" #'), ("render", ENV), 3, (SPEC, "notes")),
    "digest-trailing-newline": Case(
        edit("envs/cu128-torch28.yaml", 'digest: "sha256:', 'digest: "\\nsha256:'),
        ("render", "cu128-torch28"),
        3,
        ("envs/cu128-torch28.yaml", "base.digest"),
    ),
    "yaml-alias-bomb": Case(
        replace_with(SPEC, "file", "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"),
        ("render", ENV),
        3,
        (SPEC, "anchors and aliases"),
    ),
    "spec-too-large": Case(
        replace_with(SPEC, "file", "# x\n" * 20000), ("render", ENV), 3, (SPEC, "larger than 64 KiB")
    ),
    "spec-not-utf8": Case(append_bytes(SPEC, b"\n# caf\xe9\n"), ("render", ENV), 3, (SPEC, "not UTF-8")),
    "spec-is-a-fifo": Case(replace_with(SPEC, "fifo"), ("render", ENV), 3, (SPEC, "FIFO")),
    "spec-is-a-directory": Case(replace_with(SPEC, "dir"), ("render", ENV), 3, (SPEC, "directory")),
    "spec-symlink-out": Case(
        replace_with(SPEC, "symlink", "/etc/hostname"), ("render", ENV), 3, (SPEC, "outside the repository")
    ),
    "spec-nested-too-deep": Case(
        edit(SPEC, "notes: ", "notes: [[[[[[[[[[x]]]]]]]]]] #"), ("render", ENV), 3, ("nested deeper",)
    ),
    "kernel-source-is-the-repo": Case(
        edit(SPEC, "publish_tags:", "kernel_source: envs\npublish_tags:"),
        ("render", ENV),
        3,
        (SPEC, "kernel_source", "not a Python package folder"),
    ),
    "kernel-source-dot": Case(
        edit(SPEC, "publish_tags:", 'kernel_source: "."\npublish_tags:'), ("render", ENV), 3, (SPEC, "kernel_source")
    ),
    "kernel-source-symlink": Case(
        lambda r: (
            (r / "kern").symlink_to(r / "flash_kernels"),
            edit(SPEC, "publish_tags:", "kernel_source: kern\npublish_tags:")(r),
        ),
        ("render", ENV),
        3,
        (SPEC, "kernel_source", "symlink"),
    ),
    # -- lockfiles
    "lock-not-utf8": Case(append_bytes(LOCK, b"# \xff\n"), ("render", ENV), 5, (LOCK, "not UTF-8")),
    "lock-is-a-fifo": Case(replace_with(LOCK, "fifo"), ("render", ENV), 5, (LOCK, "FIFO")),
    "lock-symlink-out": Case(
        replace_with(LOCK, "symlink", "/etc/hostname"), ("render", ENV), 5, (LOCK, "outside the repository")
    ),
    "lock-is-a-directory": Case(replace_with(LOCK, "dir"), ("hash", ENV), 5, (LOCK, "directory")),
    "build-lock-too-large": Case(
        append_bytes(f"lockfiles/{ENV}/build.txt", b"#" * (5 << 20)),
        ("hash", ENV),
        5,
        (f"lockfiles/{ENV}/build.txt", "larger than"),
    ),
    # -- production requirements (not inputs of the image: render still works, these commands refuse)
    "merged-lock-not-utf8": Case(
        append_bytes(f"lockfiles/{ENV}.txt", b"# \xff\n"),
        ("requirements", ENV, "--python", "3.12"),
        5,
        (f"lockfiles/{ENV}.txt", "not UTF-8"),
    ),
    "python-lock-is-a-directory": Case(
        replace_with(f"lockfiles/{ENV}/py3.12.txt", "dir"),
        ("validate",),
        5,
        (f"lockfiles/{ENV}/py3.12.txt", "directory"),
    ),
    "python-not-covered": Case(
        None, ("requirements", ENV, "--python", "3.9"), 26, ("do not cover Python 3.9", "torch 2.11.0 has no wheels")
    ),
    # -- the template
    "template-not-utf8": Case(append_bytes(TEMPLATE, b"\n# \xfe\n"), ("render", ENV), 3, (TEMPLATE, "not UTF-8")),
    "template-syntax": Case(
        edit(TEMPLATE, "WORKDIR /home/flash", "{% if %}WORKDIR /home/flash"),
        ("render", ENV),
        3,
        (TEMPLATE, "template syntax error"),
    ),
    "template-unknown-name": Case(
        edit(TEMPLATE, "WORKDIR /home/flash", "WORKDIR {{ home_dir }}"), ("render", ENV), 3, (TEMPLATE, "home_dir")
    ),
    "template-symlink-out": Case(
        replace_with(TEMPLATE, "symlink", "/etc/hostname"), ("render", ENV), 3, (TEMPLATE, "outside the repository")
    ),
    "template-is-a-fifo": Case(replace_with(TEMPLATE, "fifo"), ("hash", ENV), 3, (TEMPLATE, "FIFO")),
    # -- kernel sources: what is hashed is what is built
    "kernel-fifo": Case(
        replace_with("flash_kernels/csrc/pipe.cu", "fifo"), ("hash", ENV), 3, ("flash_kernels/csrc/pipe.cu", "FIFO")
    ),
    "kernel-symlink-out": Case(
        replace_with("flash_kernels/csrc/secret.cu", "symlink", "/etc/hostname"),
        ("hash", ENV),
        3,
        ("flash_kernels/csrc/secret.cu", "outside the repository"),
    ),
    "kernel-symlink-folder": Case(
        lambda r: (r / "flash_kernels/linked").symlink_to(r / "flash_kernels/csrc"),
        ("hash", ENV),
        3,
        ("flash_kernels/linked", "symlink to a folder"),
    ),
    # -- the ledger
    "ledger-is-a-list": Case(
        ledger_lines("[1, 2]"), ("ledger", "show", ENV), 14, (f"verified/{ENV}.jsonl:1", "field (the fact)")
    ),
    "ledger-truncated": Case(
        ledger_lines('{"schema": 2, "kind": "artifact"'),
        ("ledger", "show", ENV),
        14,
        (f"verified/{ENV}.jsonl:1", "not valid JSON"),
    ),
    "ledger-passed-with-nothing": Case(
        passed_with_nothing,
        ("ledger", "show", ENV),
        14,
        (f"verified/{ENV}.jsonl:2", "field verdict", "nothing was verified"),
    ),
    "ledger-not-utf8": Case(
        lambda r: (r / "verified").mkdir() or (r / f"verified/{ENV}.jsonl").write_bytes(b"\xff\n"),
        ("ledger", "show", ENV),
        14,
        (f"verified/{ENV}.jsonl", "not UTF-8"),
    ),
    "ledger-is-a-fifo": Case(
        replace_with(f"verified/{ENV}.jsonl", "fifo"), ("ledger", "show", ENV), 14, (f"verified/{ENV}.jsonl", "FIFO")
    ),
    "ledger-schema-1-left": Case(
        legacy_record, ("ledger", "show", ENV), 14, (f"verified/{ENV}.json", "ledger migrate")
    ),
    "ledger-migrate-broken-schema-1": Case(
        lambda r: (r / "verified").mkdir() or (r / f"verified/{ENV}.json").write_text("[]"),
        ("ledger", "migrate", ENV),
        14,
        (f"verified/{ENV}.json", "JSON object"),
    ),
    "ledger-env-with-dotdot": Case(
        None, ("ledger", "show", "../../etc/passwd"), 3, ("invalid env id", "../../etc/passwd")
    ),
    # -- cached build results (verify reads them before it needs an engine)
    "build-result-truncated": Case(
        build_result('{"env": "cu130'), ("verify", ENV), 12, (".work/builds/", "not valid JSON")
    ),
    "build-result-a-list": Case(build_result("[]"), ("verify", ENV), 12, (".work/builds/", "must be a JSON object")),
    "build-result-missing-key": Case(
        build_result_with(wheel_sha256=KeyError), ("verify", ENV), 12, (".work/builds/", "missing: wheel_sha256")
    ),
    "build-result-bad-digest": Case(
        build_result_with(runtime_id="sha256:abc\n"), ("verify", ENV), 12, (".work/builds/", "field runtime_id")
    ),
    "build-result-negative-size": Case(
        build_result_with(runtime_size=-1), ("verify", ENV), 12, (".work/builds/", "field runtime_size")
    ),
    "build-result-bad-layers": Case(
        build_result_with(runtime_layers=["sha256:" + "1" * 64, "not a digest"]),
        ("verify", ENV),
        12,
        (".work/builds/", "field runtime_layers"),
    ),
    "build-result-fifo": Case(
        lambda r: replace_with(f".work/builds/{ENV}-{input_hash(r, ENV)}.json", "fifo")(r),
        ("verify", ENV),
        12,
        (".work/builds/", "FIFO"),
    ),
    # -- command-line arguments
    "env-id-path": Case(None, ("render", "../../etc/passwd"), 3, ("invalid env id", "../../etc/passwd")),
    "env-id-newline": Case(None, ("render", ENV + "\n"), 3, ("invalid env id",)),
    "host-mem-zero": Case(None, ("--host-mem-gib", "0", "render", ENV), 2, ("--host-mem-gib",)),
    "tiers-unknown": Case(None, ("verify", ENV, "--tiers", "build,quick"), 2, ("--tiers", "unknown tier 'quick'")),
    "tiers-artifact-gpu-here": Case(None, ("verify", ENV, "--tiers", "artifact-gpu"), 2, ("--tiers", "GPU host")),
    "verify-stray-arguments": Case(None, ("verify", ENV, "extra"), 2, ("unexpected arguments",)),
    "import-without-result": Case(
        None, ("verify", "import-artifact-result", ENV), 2, ("import-artifact-result ENV RESULT.json",)
    ),
    "policy-unknown": Case(
        None,
        ("publish", ENV, "--registry", "127.0.0.1:1/org/f", "--policy", "build,abl"),
        2,
        ("--policy", "unknown tier 'abl'"),
    ),
    "registry-credentials": Case(
        None, ("publish", ENV, "--registry", "me:token@registry.example.com/org/f"), 2, ("registry", "FLASHKIT_NETRC")
    ),
    "registry-newline": Case(
        None, ("publish", ENV, "--registry", "127.0.0.1:5000/org/f\n"), 2, ("registry", "is not allowed")
    ),
    "index-credentials": Case(
        None,
        ("build", ENV, "--pip-index-url", "https://u:tok@pypi.example/simple"),
        2,
        ("--pip-index-url", "FLASHKIT_NETRC"),
    ),
    "mirror-credentials-env": Case(
        None,
        ("test", ENV),
        2,
        ("FLASHKIT_DEBIAN_MIRROR", "FLASHKIT_NETRC"),
        {"FLASHKIT_DEBIAN_MIRROR": "http://u:p@mirror.example/debian"},
    ),
    "netrc-is-a-fifo": Case(
        lambda r: os.mkfifo(r.parent / "netrc"),
        ("build", ENV),
        2,
        ("FLASHKIT_NETRC", "not a readable regular file"),
        {"FLASHKIT_NETRC": "@NETRC@"},
    ),
    "index-not-a-url": Case(
        None, ("build", ENV, "--pip-index-url", "ftp://x"), 2, ("--pip-index-url", "not an http(s) URL")
    ),
    "render-into-a-directory": Case(None, ("render", ENV, "-o", "@DIR@"), 2, ("-o", "is a directory")),
    "render-unwritable": Case(
        None,
        ("render", ENV, "-o", "/proc/flashkit/x/Dockerfile"),
        2,
        ("-o /proc/flashkit/x/Dockerfile", "lies under /proc"),
    ),
    "wheelhouse-two-envs-one-wheel": Case(
        None, ("wheelhouse", ENV, "cu124-torch27", "--wheel", "x.whl"), 2, ("--wheel",)
    ),
    "wheelhouse-wheel-is-a-fifo": Case(
        lambda r: (full_ledger(r, artifact(ENV, input_hash(r, ENV))), os.mkfifo(r.parent / "w.whl")),
        ("wheelhouse", ENV, "--wheel", "@WHEEL@"),
        17,
        ("w.whl", "is not a regular file"),
    ),
    "doctor-bad-arch": Case(None, ("doctor", "--arch", "sm_90"), 2, ("--arch", "sm_90")),
    "doctor-root-without-facts": Case(None, ("doctor", "--root", "/"), 2, ("--root",)),
    "doctor-facts-a-list": Case(
        lambda r: (r.parent / "facts.json").write_text("[]"),
        ("doctor", "--facts", "@FACTS@"),
        21,
        ("facts.json", "no 'facts' object"),
    ),
    "doctor-facts-not-utf8": Case(
        lambda r: (r.parent / "facts.json").write_bytes(b"{\xff}"),
        ("doctor", "--facts", "@FACTS@"),
        21,
        ("facts.json", "not UTF-8"),
    ),
    "doctor-facts-fifo": Case(
        lambda r: os.mkfifo(r.parent / "facts.json"), ("doctor", "--facts", "@FACTS@"), 21, ("facts.json", "FIFO")
    ),
    "doctor-facts-wrong-shape": Case(
        lambda r: (r.parent / "facts.json").write_text('{"facts": {"interpreter": 7}}'),
        ("doctor", "--facts", "@FACTS@"),
        21,
        ("facts.json",),
    ),
}


@pytest.mark.parametrize("name", CASES, ids=list(CASES))
def test_bad_input(name, kit_repo, cli, monkeypatch, tmp_path):
    case = CASES[name]
    for k in ("FLASHKIT_PIP_INDEX_URL", "FLASHKIT_DEBIAN_MIRROR", "FLASHKIT_NETRC", "FLASHKIT_REGISTRY"):
        monkeypatch.delenv(k, raising=False)
    subst = {
        "@DIR@": str(tmp_path / "a-dir"),
        "@NETRC@": str(kit_repo.parent / "netrc"),
        "@WHEEL@": str(kit_repo.parent / "w.whl"),
        "@FACTS@": str(kit_repo.parent / "facts.json"),
    }
    (tmp_path / "a-dir").mkdir()
    for k, v in case.environ.items():
        monkeypatch.setenv(k, subst.get(v, v))
    if case.setup is not None:
        case.setup(kit_repo)
    before, outside = snapshot(kit_repo), sorted(os.listdir(tmp_path))
    argv = [subst.get(a, a) for a in case.argv]
    res = cli("--repo", str(kit_repo), *argv)
    assert res.code == case.code, res.err
    assert "Traceback" not in res.err + res.out and res.code != 1
    for needle in case.needles:
        assert needle in res.err, f"{needle!r} not in: {res.err}"
    assert snapshot(kit_repo) == before, "a failing command wrote into the repository"
    assert sorted(os.listdir(tmp_path)) == outside
    assert os.listdir(tmp_path / "a-dir") == []


def test_at_least_sixty_cases_here_and_in_the_gpu_import_suite():
    from test_gpu_import import FORGED

    assert len(CASES) + len(FORGED) >= 60 and len(CASES) >= 60


# -- registry replies: untrusted input too ------------------------------------------------------------------
class Misbehaving(BaseHTTPRequestHandler):
    """A server that answers every v2 call with one scripted bad reply."""

    reply: tuple[int, dict[str, str], bytes] = (200, {}, b"")

    def _answer(self) -> None:
        status, headers, body = self.reply
        if status == 0:  # hang up mid-reply
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
            return
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = _answer

    def log_message(self, *args) -> None:
        pass


MANIFEST_TYPE = {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}
WRONG = "sha256:" + "0" * 64
REPLIES = {
    "tags-not-json": ("tags", (200, {}, b"<html>proxy login</html>"), (18,), "skopeo failed"),
    "hang-up-mid-reply": ("tags", (0, {}, b""), (18,), "skopeo failed"),
    "server-error": ("tags", (500, {}, b"boom"), (18,), "skopeo failed"),
    "asks-for-a-login": ("tags", (401, {"WWW-Authenticate": 'Basic realm="x"'}, b"{}"), (32,), "refused the login"),
    "manifest-with-other-bytes": ("manifest", (200, MANIFEST_TYPE, b"{}"), (18, 19), "sha256"),
}


@pytest.mark.docker
@pytest.mark.skipif(shutil.which("skopeo") is None, reason="apt-get install skopeo")
@pytest.mark.parametrize("name", REPLIES, ids=list(REPLIES))
def test_bad_registry_replies_are_clear_errors(name):
    """What skopeo gets from a registry that misbehaves ends as exit 18/19/32 with a message, never a traceback."""
    call, reply, codes, needle = REPLIES[name]
    handler = type("H", (Misbehaving,), {"reply": reply})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = Target(f"127.0.0.1:{server.server_port}", "org/flash")
    try:
        with access(target, {}) as acc, pytest.raises(FlashkitError) as exc:
            reg = Registry(target, acc)
            if call == "tags":
                reg.tags()
            else:
                reg.manifest(WRONG)
        assert exc.value.exit_code in codes and needle in str(exc.value), str(exc.value)
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    "body, needle",
    [
        (b'{"layers": []}', "no config or layers"),
        (b'{"config": {"digest": "sha256:x"}, "layers": []}', "is not a sha256 digest"),
    ],
)
def test_manifests_without_a_usable_config_are_refused(body, needle):
    with pytest.raises(PullBackMismatch, match=needle):
        manifest_parts("m", body)
