"""The latest result of each benchmark, read from the result folders under ``benchmarks/results``.

Each folder's README opens with a YAML front matter block that says what the folder holds: when it was
measured (``date``), which code (``code``: a commit, or an input hash and its wheel), on which machine, and per
result the benchmark, the command that produced it and, where there is one, the result file a headline is
computed from (``data``; :mod:`.headlines`). Nothing here is typed twice: the summary that the docs show is
made from these blocks and the result files, and a test keeps the committed copy equal to it.

    ---
    date: 2026-12-06
    code: cu130-torch211's wheel at fk2-19515148
    machine: NVIDIA H100 80GB HBM3
    results:
      - benchmark: decode, flash_attn_with_kvcache against cuDNN
        area: kernels
        command: PYTHONPATH=flash_kernels python3 benchmarks/bench_decode.py --rep-ms 40
        data: decode/decode.json.xz
    ---
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from pathlib import Path

import yaml

from flashkit.core import safeio
from flashkit.core.errors import SpecError
from flashkit.site import headlines

RESULTS = "benchmarks/results"
AREAS = ("kernels", "kit", "evidence")  # what a result measures: the kernels, the kit's own work, or a GPU run
MAX_README_BYTES = 256 * safeio.KIB
FOLDER_KEYS = {"date", "code", "machine", "results"}
RESULT_KEYS = {"benchmark", "area", "command", "data", "mode"}
HINT = "the front matter of a results README: see flashkit/site/results.py"


@dataclasses.dataclass(frozen=True)
class Result:
    benchmark: str
    area: str
    folder: str  # repo-relative, e.g. benchmarks/results/decode_splits_20261206
    date: str  # YYYY-MM-DD
    code: str
    machine: str
    command: str
    data: str | None  # repo-relative path of the result file the headline comes from
    headline: str  # "" when there is no data file

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def front_matter(text: str, shown: str) -> dict:
    """The YAML block between the first two ``---`` lines at the top of ``text``."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---" or "---" not in (line.strip() for line in lines[1:]):
        raise SpecError(f"{shown}: no front matter (a YAML block between two '---' lines at the top)", hint=HINT)
    end = next(i for i, line in enumerate(lines) if i and line.strip() == "---")
    try:
        value = yaml.safe_load("\n".join(lines[1:end]))
    except (yaml.YAMLError, ValueError, OverflowError) as exc:  # ValueError: 2026-13-45, a 5000-digit integer
        raise SpecError(
            f"{shown}: the front matter is not valid YAML ({(str(exc).splitlines() or [type(exc).__name__])[0][:200]})",
            hint=HINT,
        ) from None
    except RecursionError:  # PyYAML composes nested blocks recursively
        raise SpecError(f"{shown}: the front matter nests deeper than any results README does", hint=HINT) from None
    if not isinstance(value, dict):
        raise SpecError(f"{shown}: the front matter is a mapping of {', '.join(sorted(FOLDER_KEYS))}", hint=HINT)
    return value


def _text(value: object, shown: str, field: str) -> str:
    if isinstance(value, datetime.date):  # YAML reads 2026-12-06 as a date
        return value.isoformat()
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{shown}: field {field} must be a non-empty string, not {value!r:.60}", hint=HINT)
    return value.strip()


def _keys(block: dict, allowed: set[str], required: set[str], shown: str, where: str) -> None:
    unknown = sorted(str(k) for k in block if k not in allowed)
    if unknown:
        raise SpecError(
            f"{shown}: unknown field {where}{unknown[0]} (allowed: {', '.join(sorted(allowed))})", hint=HINT
        )
    missing = sorted(required - block.keys())
    if missing:
        raise SpecError(f"{shown}: field {where}{missing[0]} is missing", hint=HINT)


def folder_results(root: Path, folder: Path) -> list[Result]:
    """The results one folder's README declares, each with its headline."""
    readme = folder / "README.md"
    shown = safeio.describe(readme, root)
    meta = front_matter(safeio.read_text(readme, what="results README", error=SpecError,
                                         max_bytes=MAX_README_BYTES, root=root), shown)  # fmt: skip
    _keys(meta, FOLDER_KEYS, FOLDER_KEYS, shown, "")
    date = _text(meta["date"], shown, "date")
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        raise SpecError(f"{shown}: field date {date!r} is not a date (YYYY-MM-DD)", hint=HINT) from None
    common = (folder.relative_to(root).as_posix(), date, _text(meta["code"], shown, "code"),
              _text(meta["machine"], shown, "machine"))  # fmt: skip
    entries = meta["results"]
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{shown}: field results must be a list of the folder's results", hint=HINT)
    out = []
    for i, entry in enumerate(entries):
        where = f"results[{i}]."
        if not isinstance(entry, dict):
            raise SpecError(f"{shown}: {where[:-1]} must be a mapping", hint=HINT)
        _keys(entry, RESULT_KEYS, {"benchmark", "area", "command"}, shown, where)
        area = _text(entry["area"], shown, where + "area")
        if area not in AREAS:
            raise SpecError(f"{shown}: field {where}area {area!r} is not one of {', '.join(AREAS)}", hint=HINT)
        data, line = None, ""
        if "data" in entry:
            rel = _text(entry["data"], shown, where + "data")
            path = folder / rel
            if not Path(os.path.normpath(path)).is_relative_to(os.path.normpath(folder)):
                raise SpecError(f"{shown}: field {where}data {rel!r} must name a file inside the folder", hint=HINT)
            data = safeio.describe(path, root)
            mode = _text(entry["mode"], shown, where + "mode") if "mode" in entry else None
            line = _headline(path, root, mode)
        name = _text(entry["benchmark"], shown, where + "benchmark")
        out.append(Result(name, area, common[0], common[1], common[2], common[3],
                          _text(entry["command"], shown, where + "command"), data, line))  # fmt: skip
    return out


def _headline(path: Path, root: Path, mode: str | None) -> str:
    data = headlines.read(path, root)
    try:
        return headlines.headline(data, mode)
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration, ZeroDivisionError) as exc:
        shown = safeio.describe(path, root)
        raise SpecError(
            f"{shown}: not a benchmark result flashkit can summarise ({type(exc).__name__}: {exc})"
        ) from None


def folders(root: Path) -> list[Path]:
    """The result folders: every folder directly under ``benchmarks/results`` (files there are older runs)."""
    base = root / RESULTS
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())


def every_result(root: Path) -> list[Result]:
    return [r for folder in folders(root) for r in folder_results(root, folder)]


def latest(results: list[Result]) -> list[Result]:
    """The newest result of each benchmark (by date, then folder name), in the order of their areas and names."""
    newest: dict[str, Result] = {}
    for r in results:
        if r.benchmark not in newest or (r.date, r.folder) > (newest[r.benchmark].date, newest[r.benchmark].folder):
            newest[r.benchmark] = r
    return sorted(newest.values(), key=lambda r: (AREAS.index(r.area), r.benchmark.casefold()))
