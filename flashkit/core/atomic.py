"""Writing outputs all-or-nothing: a temp file in the target directory, then os.replace."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path


def _stage(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # newline="" keeps "\n" on every platform: outputs are compared byte for byte.
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    write_texts_atomic({path: text})


def write_texts_atomic(files: dict[Path, str]) -> None:
    """Write every file to a temp file first; replace the targets only when all were written, so a
    failure (disk full, interrupt) leaves the old set in place rather than half of a new one."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in files.items():
            staged.append((_stage(path, text), path))
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)


def write_json_atomic(path: Path, data: object) -> None:
    """``data`` as sorted, indented JSON, all or nothing."""
    write_text_atomic(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")


def utc_now() -> str:
    """The current instant as RFC 3339 UTC, to the second (records carry no finer times)."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
