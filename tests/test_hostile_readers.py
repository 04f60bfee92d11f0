"""Hostile input to the readers that take files from elsewhere: ledgers as the install page, the matrix and
`ledger show` read them, benchmark results, wheels for `ledger device-code`, the GPU host's runner and
`ledger merge`. Each case runs the real command as a process (a hang fails it) and checks the documented exit
code, that no traceback was printed and what was (not) written; a merge that is refused leaves every ledger
byte for byte as it was."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from kitsupport import H1, H2, artifact, digest, run_flashkit, run_process, snapshot, verdict
from test_device_code import CODE, OTHER, SRC, TU1, USER, container, elf_with, entry, gpu_source, user

from flashkit.core.errors import DeviceCodeMismatch, RecordError, TierError, UnknownArtifact, UsageError
from flashkit.ledger import record, store
from flashkit.ledger.model import RELATION_DEVICE_CODE, content_id

ENV = "cu130-torch211"


def forged_line(fact, **changes) -> str:
    """``fact``'s line with ``changes`` and its id recomputed: a line that hashes right and lies."""
    body = {k: v for k, v in json.loads(fact.line()).items() if k != "id"}
    body.update(changes)
    return json.dumps({**body, "id": content_id(body)}, sort_keys=True, separators=(",", ":"))


def forged_relation(root: Path) -> str:
    """USER's device-code applies naming SRC's GPU verdict for a wheel whose recorded code is another."""
    _src, gpu = gpu_source(root)
    art = user(root, code=OTHER)
    fake = record._applies(gpu, art, "trust me", source_env=SRC)
    return dataclasses.replace(fake, relation=RELATION_DEVICE_CODE, device_code=CODE.digest).line()


# -- a ledger that does not read: the same exit code from ledger show, matrix, site and wheelhouse --all --------
def _fill(root: Path, env: str, data: bytes) -> None:
    p = store.ledger_path(root, env)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def _line(text: str) -> Callable[[Path], tuple[str, int]]:
    def apply(root: Path) -> tuple[str, int]:
        good = artifact(ENV, H1).line()
        _fill(root, ENV, (good + "\n" + text + "\n").encode("utf-8", "surrogateescape"))
        return ENV, RecordError.exit_code

    return apply


def plant(p: Path, kind: str, outside: tuple[Path, str] | None = None) -> Path:
    """Put at ``p`` a FIFO, a folder, a symlink to /dev/zero, a dangling symlink, or (``kind`` "outside") a
    symlink to a file of ``outside``'s text in its folder, outside the checkout; nothing for "missing"."""
    p.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "zero":
        p.symlink_to("/dev/zero")
    elif kind == "dangling":
        p.symlink_to(p.parent / "gone")
    elif kind == "outside" and outside is not None:
        target = outside[0] / f"outside-{p.name}"
        target.write_text(outside[1])
        p.symlink_to(target)
    return p


def _node(kind: str) -> Callable[[Path], tuple[str, int]]:
    def apply(root: Path) -> tuple[str, int]:
        plant(store.ledger_path(root, ENV), kind, (root.parent, artifact(ENV, H1).line() + "\n"))
        return ENV, RecordError.exit_code

    return apply


def _bytes(data: bytes) -> Callable[[Path], tuple[str, int]]:
    def apply(root: Path) -> tuple[str, int]:
        _fill(root, ENV, data)
        return ENV, RecordError.exit_code

    return apply


def _relation(root: Path) -> tuple[str, int]:
    line = forged_relation(root)
    with store.ledger_path(root, USER).open("a") as f:
        f.write(line + "\n")
    return USER, DeviceCodeMismatch.exit_code


def _evidence_path(root: Path) -> tuple[str, int]:
    art = artifact(ENV, H1)
    _fill(root, ENV, (art.line() + "\n" + forged_line(verdict(art, "cpu"), evidence={"report_sha256": "../../etc/passwd"}) + "\n").encode())  # fmt: skip
    return ENV, RecordError.exit_code


def _moved_build(root: Path) -> tuple[str, int]:
    """cu124-torch27's build line put in cu130-torch211's ledger, its env changed and its id recomputed."""
    _fill(root, ENV, (forged_line(artifact("cu124-torch27", H2), env=ENV) + "\n").encode())
    return ENV, RecordError.exit_code


VERDICT_LINE = verdict(artifact(ENV, H1), "cpu").line()
LEDGERS: dict[str, Callable[[Path], tuple[str, int]]] = {
    "a line over 256 KiB": _line('{"reasons": "' + "a" * 300_000 + '"}'),
    "a 10 MB line": _line("x" * 10_000_000),
    "a NUL byte in a string": _line(VERDICT_LINE.replace("cpu passed", "cpu\x00passed")),
    "a NUL byte between lines": _line("\x00"),
    "invalid UTF-8": _line("\udcff\udcfe{}"),
    "NaN": _line(VERDICT_LINE.replace('"duration_s":0.1', '"duration_s":NaN')),
    "Infinity": _line(VERDICT_LINE.replace('"duration_s":0.1', '"duration_s":-Infinity')),
    "1e400": _line(VERDICT_LINE.replace('"duration_s":0.1', '"duration_s":1e400')),
    "10**5000": _line(VERDICT_LINE.replace('"duration_s":0.1', '"duration_s":1' + "0" * 5000)),
    "nested 10000 deep": _line("[" * 10_000 + "]" * 10_000),
    "a key twice": _line(VERDICT_LINE.replace('"verdict":"passed"', '"verdict":"failed","verdict":"passed"')),
    "a cut last line": _bytes((artifact(ENV, H1).line() + "\n" + VERDICT_LINE[:100]).encode()),
    "a FIFO": _node("fifo"),
    "a symlink to /dev/zero": _node("zero"),
    "a folder": _node("dir"),
    "a symlink out of the checkout": _node("outside"),
    "a device-code relation that does not hold": _relation,
    "a path as a verdict's evidence": _evidence_path,
    "a build line moved to another env": _moved_build,
}


@pytest.mark.parametrize("make", list(LEDGERS.values()), ids=list(LEDGERS))
def test_a_ledger_that_does_not_read_gives_one_exit_code_everywhere(make, kit_repo, tmp_path):
    env, code = make(kit_repo)
    show = run_flashkit(kit_repo, "ledger", "show", env)
    matrix = run_flashkit(kit_repo, "matrix")
    site = run_flashkit(kit_repo, "site", "--out", str(tmp_path / "site"))
    index = run_flashkit(kit_repo, "wheelhouse", "--all", "--out", str(tmp_path / "wheels"))
    requirements = run_flashkit(kit_repo, "requirements", env, "--python", "3.12")
    (tmp_path / "none.jsonl").write_text("")  # a merge of nothing still checks its lines against every ledger
    before = snapshot(kit_repo / "verified")
    merge = run_flashkit(kit_repo, "ledger", "merge", str(tmp_path / "none.jsonl"))
    for r in (show, matrix, site, index, requirements, merge):
        assert r.clean(code), (r.code, r.err[-600:])
    assert snapshot(kit_repo / "verified") == before and "nothing was merged" in merge.err
    assert f"{env}: ledger unreadable" in matrix.err and f"{env}: its row has no verdicts" in site.err
    assert (tmp_path / "site" / "index.html").is_file()  # the page is made from the other envs


# -- benchmark results on the install page ----------------------------------------------------------------------
ROW = {"impl": "fk_cuda", "mode": "fwd", "head_dim": 64, "seqlen": 128, "batch": 1, "nheads": 8, "tflops": 100.0}


def _result(text: str | bytes, name: str = "attention_x.json") -> Callable[[Path], str]:
    def apply(root: Path) -> str:
        p = root / "benchmarks" / "results" / "run" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return name

    return apply


def _tflops(value: str) -> Callable[[Path], str]:
    return _result(json.dumps({"attention": [ROW]}).replace("100.0", value))


def _result_node(kind: str) -> Callable[[Path], str]:
    def apply(root: Path) -> str:
        text = json.dumps({"attention": [ROW]})
        plant(root / "benchmarks" / "results" / "run" / "attention_x.json", kind, (root.parent, text))
        return "attention_x.json"

    return apply


def _loop(root: Path) -> str:
    folder = root / "benchmarks" / "results"
    folder.mkdir(parents=True)
    (folder / "loop").symlink_to("..")  # followed, it would list the tree for ever
    _result(json.dumps({"attention": [ROW]}).replace("100.0", "-1"))(root)
    return "attention_x.json"


RESULTS: dict[str, Callable[[Path], str]] = {
    "tflops 10**5000": _tflops("1" + "0" * 5000),
    "tflops NaN": _tflops("NaN"),
    "tflops Infinity": _tflops("Infinity"),
    "tflops 1e400": _tflops("1e400"),
    "tflops 'nan' as text": _tflops('"nan"'),
    "tflops negative": _tflops("-5"),
    "nested 10000 deep": _result("[" * 10_000 + "]" * 10_000),
    "a key twice": _result('{"attention": [], "attention": [1]}'),
    "not UTF-8": _result(b'{"attention": "\xff"}'),
    "a list, not an object": _result("[1, 2]"),
    "over 4 MiB": _result('{"attention": [], "pad": "' + "x" * (5 << 20) + '"}'),
    "decode: share Infinity": _result('{"rows": [{"impl": "cuda", "share_of_copy_call": Infinity}]}', "decode.json"),
    "decode: copy_TBps 10**5000": _result('{"rows": [], "copy_TBps": 1' + "0" * 5000 + "}", "decode.json"),
    "a FIFO": _result_node("fifo"),
    "a symlink to /dev/zero": _result_node("zero"),
    "a symlink out of the checkout": _result_node("outside"),
    "a symlink loop beside it": _loop,
}


@pytest.mark.parametrize("make", list(RESULTS.values()), ids=list(RESULTS))
def test_a_benchmark_result_that_does_not_read_is_named_and_left_out(make, kit_repo, tmp_path):
    name = make(kit_repo)
    r = run_flashkit(kit_repo, "site", "--out", str(tmp_path / "site"))
    assert r.clean(3), (r.code, r.err[-600:])  # the page is written, but not whole: as `flashkit results` says
    assert f"not charted: benchmarks/results/run/{name}" in r.err
    assert f"benchmarks/results/run/{name}" in (tmp_path / "site" / "index.html").read_text()  # said on the page


# -- wheels for `ledger device-code --wheel` -------------------------------------------------------------------
SO = "flash_kernels/_C.abi3.so"
GOOD_SO = elf_with(TU1 + container(entry(1, 80, b".version 8.4\n")))


def _zip(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    import io

    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w", method) as zf:
        warnings.simplefilter("ignore")  # a duplicate name, on purpose
        for name, data in members:
            zf.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), data, compress_type=method)
    return buf.getvalue()


def _patch_first_member(data: bytes, *, flags: int = 0, method: int | None = None, size: int | None = None) -> bytes:
    """Change the first member's flags, compression method or declared size in its local header and in the
    central directory, as a crafted file would."""
    out = bytearray(data)
    local, central = 0, data.index(b"PK\x01\x02")
    out[local + 6 : local + 8] = struct.pack("<H", struct.unpack_from("<H", data, local + 6)[0] | flags)
    out[central + 8 : central + 10] = struct.pack("<H", struct.unpack_from("<H", data, central + 8)[0] | flags)
    if method is not None:
        out[local + 8 : local + 10] = out[central + 10 : central + 12] = struct.pack("<H", method)
    if size is not None:
        out[local + 22 : local + 26] = out[central + 24 : central + 28] = struct.pack("<I", size)
    return bytes(out)


def _corrupt_deflate(data: bytes) -> bytes:
    start = 30 + len(SO)  # the first member's data, after its local header and name
    return data[:start] + bytes(b ^ 0x5A for b in data[start : start + 40]) + data[start + 40 :]


WHEEL = _zip([(SO, GOOD_SO), ("flash_kernels/__init__.py", b"")])
RECORDED_WHEELS: dict[str, bytes] = {  # each is the wheel a recorded build exported: the zip itself is bad
    "not a zip": b"PK\x03\x04 not really a zip",
    "cut in half": WHEEL[: len(WHEEL) // 2],
    "a corrupt deflate stream": _corrupt_deflate(WHEEL),
    "an encrypted member": _patch_first_member(WHEEL, flags=0x1),
    "a deflate64 member": _patch_first_member(WHEEL, method=9),
    "a member declared at 3 GiB (a zip bomb)": _patch_first_member(WHEEL, size=3 << 30),
    "an absolute member name": _zip([("/" + SO, GOOD_SO)]),
    "a member name with ..": _zip([("../" + SO, GOOD_SO)]),
    "a member twice": _zip([(SO, GOOD_SO), (SO, elf_with(container(entry(2, 90, b"other"))))]),
    "stored with a wrong CRC": _patch_first_member(_zip([(SO, GOOD_SO)], zipfile.ZIP_STORED), size=len(GOOD_SO) - 1),
}


def _record_build(root: Path, data: bytes) -> None:
    sha = hashlib.sha256(data).hexdigest()
    store.append(root, ENV, [artifact(ENV, H1, wheel=sha)])


@pytest.mark.parametrize("data", list(RECORDED_WHEELS.values()), ids=list(RECORDED_WHEELS))
def test_a_recorded_wheel_that_is_not_a_safe_zip_is_a_tier_error(data, kit_repo, tmp_path):
    whl = tmp_path / "w.whl"
    whl.write_bytes(data)
    _record_build(kit_repo, data)
    before = store.ledger_path(kit_repo, ENV).read_bytes()
    r = run_flashkit(kit_repo, "ledger", "device-code", ENV, "--wheel", str(whl))
    assert r.clean(TierError.exit_code), (r.code, r.err[-600:])
    assert str(whl) in r.err and store.ledger_path(kit_repo, ENV).read_bytes() == before
    assert not (tmp_path / SO).exists() and not Path("/" + SO).exists()


def test_the_reader_reads_a_good_wheel(kit_repo, tmp_path):
    """The same command on the wheel the bad ones were made from records its device code."""
    whl = tmp_path / "w.whl"
    whl.write_bytes(WHEEL)
    _record_build(kit_repo, WHEEL)
    r = run_flashkit(kit_repo, "ledger", "device-code", ENV, "--wheel", str(whl))
    assert r.clean(0) and "device code sha256:" in r.out and "(recorded)" in r.out, r.err


def _wheel_node(kind: str) -> Callable[[Path], Path]:
    return lambda tmp: plant(tmp / "w.whl", kind)


WHEEL_PATHS = {
    "missing": (_wheel_node("missing"), UsageError.exit_code),
    "a folder": (_wheel_node("dir"), UsageError.exit_code),
    "a FIFO": (_wheel_node("fifo"), UsageError.exit_code),
    "a symlink to /dev/zero": (_wheel_node("zero"), UsageError.exit_code),
    "a dangling symlink": (_wheel_node("dangling"), UsageError.exit_code),
    "a zip no build produced": (lambda tmp: (tmp / "w.whl", (tmp / "w.whl").write_bytes(WHEEL))[0], 25),
}


@pytest.mark.parametrize(("make", "code"), list(WHEEL_PATHS.values()), ids=list(WHEEL_PATHS))
def test_a_wheel_path_that_is_not_a_wheel_file_is_refused(make, code, kit_repo, tmp_path):
    assert code in (UsageError.exit_code, UnknownArtifact.exit_code)
    r = run_flashkit(kit_repo, "ledger", "device-code", ENV, "--wheel", str(make(tmp_path)), timeout=30)
    assert r.clean(code), (r.code, r.err[-600:])
    assert not store.ledger_path(kit_repo, ENV).exists()


# -- the GPU host's runner (standard library only) ----------------------------------------------------------------
def _artifact_check(tmp: Path, *extra: str, out: Path | None = None):
    fk = tmp / "fk.whl"
    fk.write_bytes(WHEEL)
    argv = [str(fk), "--expect-sha256", hashlib.sha256(WHEEL).hexdigest(), "--env", SRC, "--input-hash", H1,
            "--expect-torch", "2.10", "--expect-cuda", "12", "--torch-abi", "stable",
            "--out", str(out or tmp / "r.json"), *extra]  # fmt: skip
    return run_process("flashkit.evidence.artifact_check", *argv, cwd=tmp, timeout=300)


def _runtime(tmp: Path, name: str, data: bytes) -> tuple[str, ...]:
    p = tmp / name
    p.write_bytes(data)
    return ("--cuda-runtime-wheel", str(p), "--cuda-runtime-sha256", hashlib.sha256(data).hexdigest())


RUNTIME = "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux_2_17_x86_64.whl"


@pytest.mark.parametrize(
    ("name", "data", "needle"),
    [
        (RUNTIME, b"not a zip at all", "cannot be unpacked"),
        (RUNTIME, _zip([("../escaped.so.12", b"x"), ("nvidia/cuda_runtime/lib/libcudart.so.12", b"x")]), ".."),
        (RUNTIME, _patch_first_member(_zip([("lib/libcudart.so.12", b"x" * 100)]), size=3 << 30), "larger than 2 GiB"),
    ],
    ids=["not a zip", "a member that leads out", "a zip bomb"],
)
def test_a_pinned_cuda_runtime_wheel_that_cannot_be_unpacked_is_exit_3(name, data, needle, tmp_path):
    r = _artifact_check(tmp_path, *_runtime(tmp_path, name, data))
    assert r.clean(3) and needle in r.err, (r.code, r.err[-600:])
    assert not (tmp_path / "r.json").exists() and not (tmp_path.parent / "escaped.so.12").exists()


def test_a_cuda_runtime_wheel_whose_name_has_no_dash_is_named_whole(tmp_path):
    """It unpacks and the check runs (here without torch: an error verdict, exit 16, a result written)."""
    r = _artifact_check(tmp_path, *_runtime(tmp_path, "cudart.whl", _zip([("lib/libcudart.so.12", b"\x7fELF")])))
    assert r.code == 16 and not r.err, (r.code, r.err[-600:])  # stdout quotes the torch probe's own error
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["verdict"] == "error" and result["env"] == SRC


@pytest.mark.parametrize("flag", ["--out", "--log"])
def test_an_output_in_a_missing_folder_is_refused_before_anything_runs(flag, tmp_path):
    missing = tmp_path / "no" / "such" / "r.json"
    extra = ("--log", str(missing)) if flag == "--log" else ()
    r = _artifact_check(tmp_path, *extra, out=missing if flag == "--out" else None)
    assert r.clean(2) and f"{flag} {missing}: the folder" in r.err, (r.code, r.err)
    assert not (tmp_path / "r.json").exists()


def test_a_cut_xz_result_is_named_as_cut_not_as_too_large(tmp_path):
    import lzma

    from flashkit.core.errors import SpecError
    from flashkit.site import headlines

    p = tmp_path / "decode.json.xz"
    p.write_bytes(lzma.compress(b'{"rows": []}' * 1000)[:60])
    with pytest.raises(SpecError, match="cut short"):
        headlines.read(p, tmp_path)


# -- the other files a command reads: the kit lock, a publication beside the page or named by --site --------------
@pytest.mark.parametrize("kind", ["fifo", "zero", "dir", "not UTF-8"])
def test_a_kit_lock_that_does_not_read_is_exit_5(kind, kit_repo):
    p = kit_repo / "lockfiles" / "kit.txt"
    p.unlink(missing_ok=True)
    if kind == "not UTF-8":
        p.write_bytes(b"# flashkit lock kit\n\xff\xfe\n")
    else:
        plant(p, kind)
    r = run_flashkit(kit_repo, "lock", "--kit", "--check", timeout=30)
    assert r.clean(5) and "lockfiles/kit.txt" in r.err, (r.code, r.err[-600:])


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"base_url": 1' + "0" * 5000 + "}", "[]"])
def test_a_publication_manifest_that_is_not_one_is_refused(text, kit_repo, tmp_path):
    pub = tmp_path / "pub"
    pub.mkdir()
    (pub / ".flashkit-publication").write_text("")
    (pub / "index.json").write_text(text)
    r = run_flashkit(kit_repo, "site", "--out", str(tmp_path / "site"), "--with-publication", str(pub))
    assert r.clean(UsageError.exit_code) and "index.json" in r.err, (r.code, r.err[-600:])
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("as_url", [False, True], ids=["a folder", "a file:// URL"])
def test_a_site_whose_index_is_a_fifo_is_refused_not_waited_on(as_url, kit_repo, tmp_path):
    plant(tmp_path / "pub" / "index.json", "fifo")
    site = (tmp_path / "pub").as_uri() if as_url else str(tmp_path / "pub")
    query = ("--torch", "2.7.1", "--cuda", "12.6", "--python", "3.11")
    r = run_flashkit(kit_repo, "resolve", "--site", site, *query, timeout=30)
    assert r.clean(3) and "FIFO" in r.err, (r.code, r.err[-600:])


# -- ledger merge: all or nothing across envs ----------------------------------------------------------------
def _merge_lines(root: Path, tmp: Path, files: dict[str, list[str]]) -> tuple[object, dict, dict]:
    before = snapshot(root / "verified")
    folder = tmp / "in"
    folder.mkdir(parents=True)
    for name, lines in files.items():
        (folder / name).write_text("".join(line + "\n" for line in lines))
    return run_flashkit(root, "ledger", "merge", str(folder)), before, snapshot(root / "verified")


def test_a_merge_whose_second_env_holds_a_forged_relation_merges_nothing(kit_repo, tmp_path):
    """A genuine line must not slip in beside a forged one: one genuine line for SRC, a forged relation for USER
    in the same file (SRC merges first: the relation's env comes last), then in two files."""
    forged = forged_relation(kit_repo)
    src = store.load(kit_repo, SRC).artifacts()[0]
    genuine = verdict(src, "gpu", date="2026-12-02T00:00:00+00:00").line()
    mine = store.load(kit_repo, USER)
    lines = [*(f.line() for f in mine.facts), forged]
    for files in ({"jobs.jsonl": [genuine, *lines]}, {f"{SRC}-gpu.jsonl": [genuine], f"{USER}-x.jsonl": lines}):
        r, before, after = _merge_lines(kit_repo, tmp_path / str(len(files)), files)
        assert r.clean(DeviceCodeMismatch.exit_code), (r.code, r.err[-600:])
        assert after == before  # byte for byte: SRC's genuine line was not appended either


def test_a_merge_with_a_bad_line_for_another_env_merges_nothing(kit_repo, tmp_path):
    a = artifact(ENV, H1)
    good = [a.line(), verdict(a, "cpu").line()]
    cases = {
        "not JSON": "{not json",
        "moved, its image_ref kept": forged_line(artifact(SRC, H2), env=USER),
        "moved, its image_ref too": forged_line(artifact(ENV, H1), env=USER, image_ref=f"flashkit/{USER}:{H1[:20]}"),
    }
    for n, (name, bad) in enumerate(cases.items()):
        r, before, after = _merge_lines(kit_repo, tmp_path / str(n), {"good.jsonl": good, "bad.jsonl": [bad]})
        assert r.clean(RecordError.exit_code), (name, r.code, r.err[-600:])
        assert after == before, name
        assert "input_hash" in r.err or "image_ref" in r.err or "not valid JSON" in r.err, r.err


def test_the_moved_line_checks_do_not_refuse_a_genuine_merge(kit_repo, tmp_path):
    """Another env's facts at their own hashes, a consumer whose wheel_from names its source's hash."""
    a, b = artifact(ENV, H1), artifact(USER, H2, image=digest("user image"))
    r, before, after = _merge_lines(kit_repo, tmp_path, {"x.jsonl": [a.line(), b.line(), verdict(b, "abi").line()]})
    assert r.clean(0) and after != before, r.err
    assert len(store.load(kit_repo, ENV).facts) == 1 and len(store.load(kit_repo, USER).facts) == 2
