"""Writing outputs all-or-nothing: a temp file in the target directory, then os.replace; a folder filled
beside its target, then swapped in."""

from __future__ import annotations

import ctypes
import datetime as dt
import errno
import functools
import glob
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

# A stage older than this is a leftover of a killed run, not a folder another run is filling now.
LEFTOVER_AGE_S = 3600


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


def stage_folder(dest: Path) -> Path:
    """An empty folder beside ``dest`` to fill and then pass to :func:`replace_folder`. Stages that a killed
    run left there are removed first (only old ones: a young one may be another run's, being filled)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for left in dest.parent.glob(f".{glob.escape(dest.name)}.stage-*"):
        try:
            young = now - left.lstat().st_mtime < LEFTOVER_AGE_S
        except FileNotFoundError:
            continue
        if not young and left.is_dir() and not left.is_symlink():
            shutil.rmtree(left, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.stage-", dir=dest.parent))


def replace_folder(stage: Path, dest: Path) -> None:
    """Put the filled folder ``stage`` (from :func:`stage_folder`) at ``dest`` whole, the old one removed.

    On Linux the two names are swapped in one step (renameat2's RENAME_EXCHANGE), so a reader, or a
    process killed at any instant, finds ``dest`` as the old folder or the new, never a mix and never
    missing. Where the file system cannot swap, the old folder is moved aside first: for an instant there
    is no ``dest`` (still never a mix), and the old one is left in a stage that the next run removes.
    """
    for q in [stage, *stage.rglob("*")]:
        os.chmod(q, 0o755 if q.is_dir() else 0o644)
    if not (dest.is_dir() and not dest.is_symlink()):
        os.replace(stage, dest)
        return
    if _exchange(stage, dest):
        shutil.rmtree(stage, ignore_errors=True)  # it holds the old folder now
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{dest.name}.stage-", dir=dest.parent))
    os.replace(dest, aside / "old")
    os.replace(stage, dest)
    shutil.rmtree(aside, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2():
    """glibc's renameat2 (2.28 and later), which Python's os module does not offer; None without it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one step; False where the system or file system cannot."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


def utc_now() -> str:
    """The current instant as RFC 3339 UTC, to the second (records carry no finer times)."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
