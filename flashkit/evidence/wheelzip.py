"""Reading a wheel (a zip file) that may be hostile: every way it can be bad is a :class:`WheelError` naming the
file and the member, never a hang, a crash, a write outside the folder asked for, or memory without bound.

- The central directory is checked before any member is read: at most :data:`MAX_MEMBERS` members, each name a
  relative POSIX path with no ``..``, backslash, NUL or drive (``/etc/x``, ``../x`` and ``C:x`` are refused,
  not rewritten), no name twice, each member's declared size at most :data:`MAX_MEMBER_BYTES` and all together at
  most :data:`MAX_TOTAL_BYTES`. zipfile never inflates a member past its declared size (it stops there, and the
  CRC check then fails), so these bounds hold for what is read, whatever the compressed bytes say: a zip bomb is
  refused by its directory, not discovered in memory.
- A member must be stored or compressed with deflate, bzip2 or lzma, and not encrypted: deflate64 and
  encrypted members are refused by name (zipfile would raise NotImplementedError or RuntimeError).
- zipfile's own failures on corrupt or truncated data (BadZipFile, zlib.error, EOFError, OSError, ...) become
  WheelError.

Opening the file is the caller's: the kit opens it with :func:`flashkit.core.safeio.open_regular` (a regular file
only, no FIFO or device) and passes the open file; the GPU host's runner checks the path is a regular file.

Standard library only: ``flashkit.evidence.artifact_check`` unpacks the CUDA runtime wheel with it on a bare GPU
host.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from collections.abc import Callable
from typing import IO

MAX_MEMBERS = 100_000
MAX_MEMBER_BYTES = 2 << 30
MAX_TOTAL_BYTES = 4 << 30
READABLE = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2"}
READABLE[zipfile.ZIP_LZMA] = "lzma"
# What zipfile raises on bytes that are not what the directory says (corrupt, truncated, a missing codec).
_ZIP_FAILURES = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, RuntimeError, ValueError)
_ZIP_FAILURES += (NotImplementedError, KeyError, IndexError, OverflowError, struct.error)


class WheelError(ValueError):
    """A wheel that cannot be read safely: the message names the file, the member and why."""


def _name_problem(name: str) -> str | None:
    if not name or "\0" in name or "\\" in name:
        return "an empty name, or one with a NUL or a backslash"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in name.split("/"):
        return "a path that leads out of the wheel (..)"
    return None


def members(zf: zipfile.ZipFile, shown: str) -> list[zipfile.ZipInfo]:
    """The wheel's members, its directory checked as the module docstring says."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise WheelError(f"{shown}: more than {MAX_MEMBERS} members; not a wheel flashkit reads")
    seen: set[str] = set()
    total = 0
    for info in infos:
        name = info.filename
        why = _name_problem(name)
        if why:
            raise WheelError(f"{shown}: member {name[:200]!r} is {why}")
        if name in seen:
            raise WheelError(f"{shown}: member {name[:200]} appears twice; which one is the wheel's is not defined")
        seen.add(name)
        if info.flag_bits & 0x1:
            raise WheelError(f"{shown}: member {name[:200]} is encrypted; a wheel's members never are")
        if info.compress_type not in READABLE:
            raise WheelError(
                f"{shown}: member {name[:200]} is compressed with method {info.compress_type} "
                f"({'deflate64' if info.compress_type == 9 else 'not one of ' + ', '.join(READABLE.values())})"
            )
        if info.file_size > MAX_MEMBER_BYTES:
            raise WheelError(f"{shown}: member {name[:200]} is larger than {MAX_MEMBER_BYTES >> 30} GiB")
        total += info.file_size
        if total > MAX_TOTAL_BYTES:
            raise WheelError(f"{shown}: its members add up to more than {MAX_TOTAL_BYTES >> 30} GiB")
    return infos


def read_members(source: str | IO[bytes], shown: str, select: Callable[[str], bool]) -> dict[str, bytes]:
    """The bytes of every member whose name ``select`` accepts, by name."""
    try:
        with zipfile.ZipFile(source) as zf:
            return {info.filename: zf.read(info) for info in members(zf, shown) if select(info.filename)}
    except WheelError:
        raise
    except _ZIP_FAILURES as exc:
        raise WheelError(f"{shown}: not a readable wheel ({type(exc).__name__}: {exc})") from None


def extract(source: str | IO[bytes], shown: str, dest: str, select: Callable[[str], bool] = bool) -> list[str]:
    """Write every member ``select`` accepts under ``dest`` (a folder), by its own name; the names written. Every
    name was checked to stay inside ``dest`` before anything is written, each member is written only once it has
    read whole with its CRC, and on any failure the files written so far are removed again: all or nothing."""
    written: list[str] = []
    try:
        with zipfile.ZipFile(source) as zf:
            for info in members(zf, shown):
                if not select(info.filename) or info.is_dir():
                    continue
                target = os.path.join(dest, *info.filename.split("/"))
                data = zf.read(info)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "xb") as out:  # x: a name twice, or a file already there, is never overwritten
                    written.append(target)
                    out.write(data)
    except BaseException as exc:
        for path in written:
            os.unlink(path)
        if isinstance(exc, WheelError) or not isinstance(exc, _ZIP_FAILURES):
            raise
        raise WheelError(f"{shown}: cannot be unpacked ({type(exc).__name__}: {exc})") from None
    return [os.path.relpath(p, dest).replace(os.sep, "/") for p in written]
