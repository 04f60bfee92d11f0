"""Reading the files flashkit is given, so that no bad file can hang it, crash it or lead it outside.

Every input (spec, lockfile, template, kernel source, ledger, build result, GPU result, JUnit report)
goes through :func:`read_bytes` or :func:`read_text`:

- a FIFO, socket or device is refused before it is opened for reading (``open`` on a FIFO blocks for
  ever), and the check is repeated on the open descriptor so a swapped path cannot slip through;
- a symlink may only lead to a file inside ``root`` (the repository): what is read is what would be
  copied into a build context, and nothing outside the repository can change it unseen;
- the size is capped per kind of file, and text must be UTF-8, with the offending byte's line named.

Errors are raised as the caller's error class (a spec problem is exit 3, a lockfile problem exit 5, a
ledger problem exit 14, ...), always naming the file and what to do.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

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


def read_bytes(path: Path, *, what: str, error: type[FlashkitError], max_bytes: int, root: Path | None = None) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; see the module docstring."""
    shown = describe(path, root)
    if root is not None and os.path.lexists(path):
        check_inside(path, root, error, what)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{shown}: {what} does not exist") from None
    except OSError as exc:
        raise error(f"{shown}: cannot read the {what}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{shown}: the {what} is {_kind(st.st_mode)}, not a regular file", hint="replace it with a file")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the stat, open still returns at once.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"{shown}: cannot open the {what}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{shown}: the {what} changed into something that is not a regular file while it was read")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise error(
            f"{shown}: the {what} is larger than {max_bytes // KIB} KiB, the most flashkit reads for it",
            hint="check that this is the right file",
        )
    return data


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
