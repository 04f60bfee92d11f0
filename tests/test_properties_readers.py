"""Property-based tests of the binary and JSON readers (hypothesis, the fixed profile of conftest.py): the wheel
reader, the fat binary and device-code reader, the strict JSON reader, the benchmark results and the install
page's ledger rows. Whatever the bytes, each ends in a result or its own documented error, never another
exception, and a result keeps the reader's promises (names inside the wheel, finite measurements, a note on
the row of a ledger that does not read)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from kitsupport import FAKE_KERNELS, H1, REPO, artifact, verdict  # noqa: E402
from test_device_code import TU1, TU2, container, elf_with, entry  # noqa: E402

from flashkit.binary import fatbin  # noqa: E402
from flashkit.core import safeio  # noqa: E402
from flashkit.core.errors import FlashkitError, RecordError  # noqa: E402
from flashkit.evidence import device_code, wheelzip  # noqa: E402
from flashkit.ledger import store  # noqa: E402
from flashkit.site import evidence, plots  # noqa: E402

SO = "flash_kernels/_C.abi3.so"
ELF = elf_with(TU1 + TU2)


def _zip(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, data in members:
            zf.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


WHEELS = [_zip([(SO, ELF), ("flash_kernels/__init__.py", b"")]), _zip([(SO, ELF)], zipfile.ZIP_STORED)]


def _edit(data: bytes, at: int, new: bytes, cut: int) -> bytes:
    at %= len(data) + 1
    return (data[:at] + new + data[at + len(new) :])[: max(cut, 0) or None]


# -- the wheel and device-code readers ---------------------------------------------------------------------------
@given(st.sampled_from(WHEELS), st.integers(0, 10_000), st.binary(min_size=1, max_size=8), st.integers(0, 4000))
def test_the_wheel_reader_on_a_mangled_wheel(data, at, new, cut):
    wheel = _edit(data, at, new, cut)
    try:
        code = device_code.of_wheel(io.BytesIO(wheel), "w.whl")
    except device_code.DeviceCodeError as exc:
        assert str(exc)
    else:
        assert set(code.extensions) <= {SO}
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp, "dest")
        dest.mkdir()
        try:
            names = wheelzip.extract(io.BytesIO(wheel), "w.whl", str(dest))
        except wheelzip.WheelError:
            names = []
        written = [p for p in Path(tmp).rglob("*") if p.is_file()]
        assert all(dest in p.parents for p in written) and len(written) <= len(names)


NAMES = st.sampled_from(["", "/", "..", ".", "a", "b.so", "\\", "C:", "\x00", "x.so.1", "é"])


@given(st.lists(st.lists(NAMES, min_size=1, max_size=4).map("/".join), min_size=1, max_size=5))
def test_member_names_that_could_leave_the_folder_are_refused(names):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a name twice, on purpose
            data = _zip([(name, b"x") for name in names])
    except (ValueError, OSError):  # zipfile itself refuses to write some names
        return
    try:
        read = wheelzip.read_members(io.BytesIO(data), "w.whl", lambda _n: True)
    except wheelzip.WheelError:
        return
    for name in read:
        parts = name.split("/")
        assert name and not name.startswith("/") and ".." not in parts and "\\" not in name and "\x00" not in name
    assert len(read) == len(names)  # no name twice


@given(st.binary(max_size=600))
def test_the_fat_binary_reader_on_any_section(section):
    with contextlib.suppress(device_code.DeviceCodeError):
        device_code.entries_of_section(section)
    with contextlib.suppress(fatbin.FatbinError):
        fatbin.parse_fatbin(section)


SECTION = TU1 + container(entry(1, 80, b".version 8.4\n"))


@given(st.integers(0, len(ELF)), st.binary(min_size=1, max_size=8), st.integers(0, len(ELF) + 8))
def test_the_device_code_reader_on_a_mangled_elf(at, new, cut):
    try:
        code = device_code.of_files({SO: _edit(ELF, at, new, cut)})
    except device_code.DeviceCodeError as exc:
        assert str(exc)
    else:
        assert device_code.digest_of(json.loads(json.dumps(code.as_json()))) == code.digest


# -- strict JSON ---------------------------------------------------------------------------------------------------
JSON_BITS = ["{", "}", "[", "]", ",", ":", '"a"', '"a":', "1", "-0", "1e400", "1" * 50, "NaN", "Infinity",
             "-Infinity", "true", "null", '"\\u0000"', '"\\ud800"', " ", "\n", "0.5", '{"a":1,"a":2}']  # fmt: skip


@given(st.lists(st.sampled_from(JSON_BITS) | st.text(max_size=4), max_size=30))
def test_the_strict_json_reader_on_json_like_text(parts):
    text = "".join(parts)
    try:
        value = safeio.parse_json(text, shown="x.json", what="result", error=RecordError, max_depth=8)
    except RecordError as exc:
        assert str(exc).startswith("x.json: ")
        return
    json.dumps(value, allow_nan=False)  # finite numbers only: what it read can be written back as JSON
    assert not safeio.too_deep(value, 8)


# -- the TOML and YAML the kit reads: host facts, the kit's pyproject, a results README's front matter -----------------
NESTING = ["[" * 1200, "]" * 1200, "{a = " * 1200, "{a: " * 1200, "}" * 1200, "- " * 50]
TOML_BITS = ["[build_host]\n", "[gpu_host]\n", "[build_host.unreachable]\n", "a = ", "9" * 5000, "0x" + "f" * 5000,
             "1e999", "nan", "inf", '"x"', "[", "]", "{", "}", ",", "\n", "1979-05-27T07:32:00Z", *NESTING]  # fmt: skip
YAML_BITS = ["date: ", "results: ", "- benchmark: x\n", "a: ", "9" * 5000, "0x" + "f" * 5000, "2026-13-45", "1e999",
             ".nan", "!!binary zz", "!!python/name:os.system", "&a ", "*a", "[", "]", "{", "}", ",", "\n", "\t",
             "  ", *NESTING]  # fmt: skip


TOML_VALUE = st.sampled_from(["", "a = ", "[gpu_host]\ngpu = "])  # most bits are values: put one where it reads


@given(TOML_VALUE, st.lists(st.sampled_from(TOML_BITS) | st.text(max_size=4), max_size=12))
def test_the_host_facts_reader_on_toml_like_text(start, parts):
    from flashkit.core.errors import SpecError
    from flashkit.plan import hosts

    with contextlib.suppress(SpecError):
        hosts.parse(start + "".join(parts), "hosts.toml")


@given(st.lists(st.sampled_from(YAML_BITS) | st.text(max_size=4), max_size=12))
def test_the_front_matter_reader_on_yaml_like_text(parts):
    from flashkit.core.errors import SpecError
    from flashkit.site import results

    with contextlib.suppress(SpecError):
        assert isinstance(results.front_matter("---\n" + "".join(parts) + "\n---\n", "README.md"), dict)


@given(TOML_VALUE, st.lists(st.sampled_from(TOML_BITS) | st.text(max_size=4), max_size=12))
def test_the_kit_lock_check_on_a_mangled_pyproject(start, parts):
    """`flashkit lock --kit --check` reads pyproject.toml's dependencies: any text is a list or LockError."""
    from flashkit.core.errors import LockError
    from flashkit.locking import kit_lock

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "pyproject.toml").write_text(start + "".join(parts), encoding="utf-8", errors="surrogateescape")
        with contextlib.suppress(LockError):
            kit_lock.dependencies(Path(tmp))


LOCK_VERSIONS = ["1.26.4", "2." + "7" * 5000, "2.7.1+cu126", "1!2", "x.y", "", "v1", "1" * 70, "2.7.1 ; x", "===1"]
LOCK_TAILS = ["", " \\\n    --hash=sha256:" + "a" * 64, " ; python_version >= '3.11'", " --hash=md5:x", " #", " -e"]
LOCK_LINE = st.tuples(st.sampled_from(["torch", "numpy", "a[x]", "-"]), st.sampled_from(LOCK_VERSIONS),
                      st.sampled_from(LOCK_TAILS) | st.text(max_size=4))  # fmt: skip


@given(st.lists(LOCK_LINE, max_size=6))
def test_the_lockfile_readers_on_lock_like_text(lines):
    """Every pin either lockfile reader returns has a version that compares (a 5000-digit one is a problem)."""
    from packaging.specifiers import SpecifierSet

    from flashkit.plan import lock, production

    text = "".join(f"{name}=={version}{tail}\n" for name, version, tail in lines)
    pins = lock.parse(text)[0] + production.parse_merged(text)[0]
    for pin in pins:
        SpecifierSet(">=0").contains(pin.version, prereleases=True)


# -- benchmark results -------------------------------------------------------------------------------------------
ROW = {"impl": "fk_cuda", "mode": "fwd", "head_dim": 64, "seqlen": 128, "batch": 1, "nheads": 8, "tflops": 100.0}
VALUES = st.sampled_from(["1", "-1", "0", "1e400", "NaN", "Infinity", '"x"', "true", "null", "[]", "{}", "1" * 60])


@settings(max_examples=100)
@given(st.dictionaries(st.sampled_from(sorted(ROW)), VALUES, max_size=4), st.booleans(), st.text(max_size=20))
def test_the_results_reader_on_mangled_rows(changes, as_decode, noise):
    row = json.dumps(ROW)
    for key, value in changes.items():
        row = row.replace(f'"{key}": {json.dumps(ROW[key])}', f'"{key}": {value}')
    text = '{"rows": [' + row.replace("tflops", "share_of_copy_call") + "]}" if as_decode else '{"attention": [' + row + "]}"  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp, plots.RESULTS, "run")
        folder.mkdir(parents=True)
        (folder / ("decode.json" if as_decode else "attention_x.json")).write_text(text + noise)
        charts, problems = plots.charts(Path(tmp))
    assert len(charts) + len(problems) <= 1
    for chart in charts:
        for group in chart.groups:
            assert all(math.isfinite(b.value) and b.value >= 0 and 0 <= b.share <= 1 for b in group.bars)


# -- the install page's rows from a mangled ledger --------------------------------------------------------------
@pytest.fixture(scope="module")
def site_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site") / "repo"
    for d in ("envs", "lockfiles", "templates"):
        shutil.copytree(REPO / d, root / d)
    for rel, text in FAKE_KERNELS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


ENV = "cu130-torch211"
ART = artifact(ENV, H1)
LINES = [ART.line(), verdict(ART, "cpu").line(), verdict(ART, "build").line()]


@settings(max_examples=40)
@given(st.lists(st.sampled_from(LINES), min_size=1, max_size=3), st.integers(0, 3000), st.binary(max_size=6))
def test_the_page_rows_of_a_mangled_ledger(site_repo, lines, at, inserted):
    data = "\n".join(lines).encode() + b"\n"
    data = data[: at % len(data)] + inserted + data[at % len(data) :]
    store.ledger_path(site_repo, ENV).parent.mkdir(exist_ok=True)
    store.ledger_path(site_repo, ENV).write_bytes(data)
    bad = store.unreadable(site_repo, [ENV])
    (row,) = [r for r in evidence.rows(site_repo) if r.env == ENV]
    if ENV in bad:
        assert isinstance(bad[ENV], FlashkitError) and row.notes and not row.badges
    else:
        assert len(row.badges) > 0 and not row.notes
