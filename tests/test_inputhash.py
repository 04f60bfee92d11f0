"""The input hash: same inputs -> same hash anywhere; any one-byte change in an input -> a new hash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flashkit.plan import inputhash
from flashkit.plan.plan import load_plan
from flashkit.plan.specfile import load_env

ENV = "cu124-torch27"


def h(root: Path, env: str = ENV) -> str:
    return load_plan(root, env).input_hash


def test_format_and_scheme(kit_repo):
    value = h(kit_repo)
    assert value.startswith("fk2-") and len(value) == 4 + 64
    assert inputhash.is_input_hash("fk1-" + "0" * 64)  # old ledger lines keep their scheme-1 names
    assert inputhash.tag_suffix(value) == value[:20]
    with pytest.raises(ValueError):
        inputhash.tag_suffix("sha256:abc")


def test_same_inputs_same_hash_in_another_directory(kit_repo, tmp_path):
    import shutil

    other = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(kit_repo, other)
    assert h(kit_repo) == h(other)


def test_hashes_differ_between_envs(kit_repo):
    assert h(kit_repo, "cu124-torch27") != h(kit_repo, "cu124-torch26")


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "target",
    [
        "lockfiles/cu124-torch27/py3.13.txt",
        "lockfiles/cu124-torch27/build.txt",
        "templates/Dockerfile.j2",
        "flash_kernels/csrc/kernel.cu",
        "flash_kernels/pyproject.toml",
    ],
)
def test_one_byte_change_in_any_input_changes_the_hash(kit_repo, target):
    before = h(kit_repo)
    _flip_last_byte(kit_repo / target)
    assert h(kit_repo) != before


def test_spec_value_change_changes_the_hash(kit_repo):
    before = h(kit_repo)
    p = kit_repo / "envs" / f"{ENV}.yaml"
    p.write_text(p.read_text().replace("torch2.7-cu12.4-py3.13", "torch2.7-cu12.4-py3.14"))
    assert h(kit_repo) != before


def test_new_file_rename_and_exec_bit_change_the_hash(kit_repo):
    base = h(kit_repo)
    f = kit_repo / "flash_kernels" / "flash_kernels" / "extra.py"
    f.write_text("")
    added = h(kit_repo)
    assert added != base
    f.rename(f.with_name("extra2.py"))
    assert h(kit_repo) not in (base, added)
    f2 = f.with_name("extra2.py")
    renamed = h(kit_repo)
    os.chmod(f2, 0o755)
    assert h(kit_repo) != renamed


def test_what_is_not_an_input_does_not_change_the_hash(kit_repo):
    before = h(kit_repo)
    p = kit_repo / "envs" / f"{ENV}.yaml"
    p.write_text("# a comment\n" + p.read_text().replace("notes: This exact stack", "notes: Also, this exact stack"))
    kd = kit_repo / "flash_kernels"
    (kd / "flash_kernels" / "__pycache__").mkdir()
    (kd / "flash_kernels" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (kd / "build" / "lib").mkdir(parents=True)
    (kd / "build" / "lib" / "_C.so").write_bytes(b"\0")
    (kd / "flash_kernels" / "_C.abi3.so").write_bytes(b"\0")
    (kd / "flash_kernels.egg-info").mkdir()
    (kd / "flash_kernels.egg-info" / "PKG-INFO").write_text("x")
    # another env's lockfile is not this env's input
    _flip_last_byte(kit_repo / "lockfiles" / "cu124-torch26" / "py3.13.txt")
    assert h(kit_repo) == before


def test_manifest_is_canonical_and_has_no_absolute_paths(kit_repo):
    spec = load_env(kit_repo, ENV)
    sources = load_plan(kit_repo, ENV).manifest()["kernel_sources"]
    assert all(not p.startswith("/") for p, _mode, _sha in sources)
    assert [s[0] for s in sources] == sorted(s[0] for s in sources)
    assert str(kit_repo) not in repr(spec.normalized())


def test_the_kernel_tree_is_read_once_while_it_does_not_change(kit_repo, monkeypatch):
    """Planning every env reads the kernel tree once; any change to a file, or to a symlink's target,
    is read again (the memo is keyed by each file's stat, of the link and of its target)."""
    from flashkit.core import safeio

    target = kit_repo / "shared.h"  # outside the kernel tree: only the link is in it
    target.write_text("int a;\n")
    (kit_repo / "flash_kernels" / "csrc" / "linked.h").symlink_to(target)
    reads = []
    real = safeio.read_bytes
    kernels = str(kit_repo / "flash_kernels")

    def counted(path, *a, **k):
        if str(path).startswith(kernels):
            reads.append(path)
        return real(path, *a, **k)

    monkeypatch.setattr(safeio, "read_bytes", counted)
    first = h(kit_repo)
    count = len(reads)
    assert h(kit_repo) == first and load_plan(kit_repo, "cu124-torch26").input_hash
    assert len(reads) == count  # nothing of the tree read again
    target.write_text("int b;\n")  # the same size, through the link too
    changed = h(kit_repo)
    assert changed != first and len(reads) > count
