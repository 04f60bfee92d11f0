"""`flashkit wheelhouse --all`: one PEP 503 index over every env's verified wheel, plus each env's wheelhouse.

Layout of ``<out>/``:

- ``files/<wheel>`` and ``files/SHA256SUMS``: every verified wheel. One index can hold them all because each
  wheel keeps its local version (``flash_kernels-0.1.0+cu124torch2.7cxx11abitrue-...``, or a stable-ABI
  wheel's ``+cu13stable2.10``): the file names differ where the bytes do. Two envs whose wheels share a name
  with different bytes are refused.
- ``simple/``: the PEP 503 index over ``files/`` with ``#sha256=`` fragments
  (``pip install --index-url <out>/simple flash-kernels==0.1.0+cu130torch2.11cxx11abitrue``);
- ``<env>/``: what ``flashkit wheelhouse <env>`` writes (its own ``files/`` and ``simple/``,
  ``requirements.txt``, ``py<X.Y>.txt``), so the hash-pinned requirements keep their layout;
- ``wheelhouse.json``: which envs are in it, with input hash, policy, wheel and sha256, and which were
  skipped and why (an env without a verified wheel is skipped, not an error).

The whole folder is staged beside ``<out>`` and swapped in at once, like one env's wheelhouse: a failure
leaves the previous index. Because ``<out>`` is replaced whole, it must be new, empty, or a folder
flashkit wrote (a ``wheelhouse.json``, or only per-env wheelhouses).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flashkit.binary.torch_abi import STABLE_LABEL, wheel_local_version
from flashkit.core.atomic import replace_folder, stage_folder
from flashkit.core.errors import PublishRefused, UsageError
from flashkit.publish.wheelhouse import (
    VerifiedWheel,
    copy_wheel,
    simple_index,
    write_env_wheelhouse,
    write_tree,
)

MANIFEST = "wheelhouse.json"


def _ours(out: Path) -> bool:
    """Whether replacing ``out`` whole loses nothing flashkit did not write."""
    if not out.exists():
        return True
    if not out.is_dir():
        return False
    entries = list(out.iterdir())
    if (out / MANIFEST).is_file() or not entries:
        return True
    return all(e.is_dir() and (e / "requirements.txt").is_file() and (e / "simple").is_dir() for e in entries)


def check_out(out: Path) -> None:
    if not _ours(out):
        raise UsageError(
            f"--out {out}: exists and is not a wheelhouse flashkit wrote (no {MANIFEST}); "
            "`wheelhouse --all` replaces the folder whole",
            hint="name a new or empty folder, e.g. --out .work/wheelhouse-all",
        )


def _names_unique(checked: list[tuple[VerifiedWheel, dict[str, str]]]) -> None:
    seen: dict[str, VerifiedWheel] = {}
    for vw, _ in checked:
        other = seen.setdefault(vw.path.name, vw)
        if other is not vw and other.sha256 != vw.sha256:
            raise PublishRefused(
                f"{other.env} and {vw.env}: different verified wheels share the file name {vw.path.name}; "
                "one index cannot hold both",
                hint=_same_name_hint(vw.path.name),
            )


def _same_name_hint(name: str) -> str:
    """What to do about two wheels of one name: a version-bound label names the torch minor, so the envs' labels
    should differ; a stable-ABI label names only the CUDA major and the oldest torch, so they cannot."""
    if STABLE_LABEL.fullmatch(wheel_local_version(name)):
        return (
            "a stable-ABI wheel (+cu<X>stable<A.B>) is one wheel for every torch >= A.B with CUDA X, so every env "
            "of that CUDA major builds the same name: index it from one of them (`flashkit wheelhouse ENV`)"
        )
    return (
        "build each env's wheel with its local version: +cu<X><Y>torch<A.B>cxx11abi<true|false> (version-bound) "
        "or +cu<X>stable<A.B> (stable ABI: torch >= A.B with CUDA X)"
    )


def manifest(checked: list[tuple[VerifiedWheel, dict[str, str]]], skipped: dict[str, str]) -> str:
    envs = {
        vw.env: {
            "input_hash": vw.input_hash,
            "policy": f"{vw.policy.name}:{vw.policy.describe()}",
            "passed": list(vw.passed_tiers),
            "wheel": vw.path.name,
            "sha256": vw.sha256,
            "requirements": sorted(f"{vw.env}/{name}" for name in files),
        }
        for vw, files in checked
    }
    return json.dumps({"schema_version": 1, "envs": envs, "skipped": skipped}, indent=2, sort_keys=True) + "\n"


def write_all(out: Path, checked: list[tuple[VerifiedWheel, dict[str, str]]], skipped: dict[str, str]) -> Path:
    """Stage the index, every env's wheelhouse and the manifest beside ``out``, then swap it in whole."""
    check_out(out)
    _names_unique(checked)
    stage = stage_folder(out)
    try:
        wheels = {}
        for vw, files in checked:
            write_env_wheelhouse(stage, vw, files)
            if vw.path.name not in wheels:
                copy_wheel(vw, stage / "files")
                wheels[vw.path.name] = vw.sha256
        texts = {MANIFEST: manifest(checked, skipped)}
        if wheels:
            sums = "".join(f"{sha}  {name}\n" for name, sha in sorted(wheels.items()))
            texts |= {"files/SHA256SUMS": sums, **simple_index(sorted(wheels.items()))}
        write_tree(stage, texts)
        replace_folder(stage, out)
        return out
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
