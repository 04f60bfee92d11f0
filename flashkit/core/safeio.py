"""Reading the files flashkit is given, so that no bad file can hang it, crash it or lead it outside.

Every input (spec, lockfile, template, kernel source, ledger, build result, GPU result, JUnit report)
goes through :func:`read_bytes` or :func:`read_text`:

- a FIFO, socket or device is refused before it is opened for reading (``open`` on a FIFO blocks for
  ever), and the check is repeated on the open descriptor so a swapped path cannot slip through;
- a symlink may only lead to a file inside ``root`` (the repository): what is read is what would be
  copied into a build context, and nothing outside the repository can change it unseen;
- the size is capped per kind of file, and text must be UTF-8, with the offending byte's line named.

JSON (a ledger line, a GPU result, a build result, a benchmark result) is parsed by :func:`parse_json`, which
reads strict JSON only: no NaN or Infinity, no number that overflows a float, no integer longer than
:data:`MAX_INT_DIGITS` digits (Python would spend quadratic time on one, and refuses those over 4300 digits
with a ValueError), no key twice in one object, and no nesting deeper than the caller allows.

Errors are raised as the caller's error class (a spec problem is exit 3, a lockfile problem exit 5, a
ledger problem exit 14, ...), always naming the file and what to do.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from flashkit.core.errors import FlashkitError

KIB = 1024
MIB = 1024 * KIB


def describe(path: Path, root: Path | None) -> str:
    """The path as the user knows it: repository-relative when it lies inside ``root``."""
    if root is not None:
        try:
            return Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()
        except ValueError:
            pass
    return str(path)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_inside(path: Path, root: Path, error: type[FlashkitError], what: str) -> Path:
    """``path`` with symlinks resolved, refused when it leads outside ``root``."""
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(os.path.realpath(root)):
        raise error(
            f"{describe(path, root)}: {what} is a symlink that leads outside the repository (to {real})",
            hint="replace the link with the file itself; flashkit hashes and builds only what is in the repository",
        )
    return real


def open_regular(path: Path, *, what: str, error: type[FlashkitError], root: Path | None = None) -> BinaryIO:
    """``path`` opened for reading in binary, refused unless it is a regular file; see the module docstring.

    The caller reads what it needs from the open file (a digest streamed, a zip's directory): what is read
    is the file that was checked, even if the path is swapped meanwhile."""
    shown = describe(path, root)
    if root is not None and os.path.lexists(path):
        check_inside(path, root, error, what)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{shown}: the {what} does not exist") from None
    except OSError as exc:
        raise error(f"{shown}: cannot read the {what}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{shown}: the {what} is {_kind(st.st_mode)}, not a regular file", hint="replace it with a file")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the stat, open still returns at once.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"{shown}: cannot open the {what}: {exc.strerror}") from None
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise error(f"{shown}: the {what} changed into something that is not a regular file while it was read")
    return fh


def read_bytes(path: Path, *, what: str, error: type[FlashkitError], max_bytes: int, root: Path | None = None) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; see the module docstring."""
    with open_regular(path, what=what, error=error, root=root) as fh:
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:  # EIO, or a file on a mount that went away
            raise error(f"{describe(path, root)}: cannot read the {what}: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise error(
            f"{describe(path, root)}: the {what} is larger than {size_text(max_bytes)}, the most flashkit reads for it",
            hint="check that this is the right file",
        )
    return data


def size_text(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def decode_utf8(data: bytes, *, shown: str, what: str, error: type[FlashkitError]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(
            f"{shown}:{line}: the {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            hint="save the file as UTF-8",
        ) from None


def read_text(path: Path, *, what: str, error: type[FlashkitError], max_bytes: int, root: Path | None = None) -> str:
    data = read_bytes(path, what=what, error=error, max_bytes=max_bytes, root=root)
    return decode_utf8(data, shown=describe(path, root), what=what, error=error)


# -- JSON ----------------------------------------------------------------------------------------------------------
MAX_INT_DIGITS = 40  # far past any count, size or timestamp a file of flashkit's holds (2**64 has 20 digits)
MAX_JSON_DEPTH = 32


class _Refused(ValueError):
    """A value strict JSON does not allow, found while parsing (turned into the caller's error)."""


def _constant(name: str) -> float:
    # Python's json reads NaN and Infinity, which no other JSON reader does: a file holding one is not JSON.
    raise _Refused(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: valid JSON text, but it reads as infinity and is written back as such
        raise _Refused(f"{text[:40]} is out of range for a number")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Refused(f"the key {twice[:60]!r} appears twice in one object")
    return out


def too_deep(value: object, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` levels (checked without recursion)."""
    level: list[tuple[object, int]] = [(value, 0)]
    while level:
        item, depth = level.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        level.extend((child, depth + 1) for child in children)
    return False


def parse_json(
    text: str | bytes,
    *,
    shown: str,
    what: str,
    error: type[FlashkitError],
    max_depth: int = MAX_JSON_DEPTH,
    hint: str | None = None,
) -> Any:
    """``text`` as strict JSON (see the module docstring), or ``error`` naming ``shown`` and what is wrong."""
    try:
        value = json.loads(
            text, parse_constant=_constant, parse_float=_float, parse_int=_int, object_pairs_hook=_object
        )
    except RecursionError:
        value, deep = None, True
    except _Refused as exc:
        raise error(f"{shown}: not strict JSON: {exc}", hint=hint) from None
    except ValueError as exc:  # JSONDecodeError, and a UnicodeDecodeError of bytes
        raise error(f"{shown}: not valid JSON ({str(exc)[:200]})", hint=hint) from None
    else:
        deep = too_deep(value, max_depth)
    if deep:
        raise error(f"{shown}: nested deeper than {max_depth} levels; no {what} is", hint=hint)
    return value


def read_json(
    path: Path,
    *,
    what: str,
    error: type[FlashkitError],
    max_bytes: int,
    root: Path | None = None,
    max_depth: int = MAX_JSON_DEPTH,
    hint: str | None = None,
) -> Any:
    """A regular file of at most ``max_bytes`` of UTF-8 strict JSON; see the module docstring."""
    text = read_text(path, what=what, error=error, max_bytes=max_bytes, root=root)
    return parse_json(text, shown=describe(path, root), what=what, error=error, max_depth=max_depth, hint=hint)
