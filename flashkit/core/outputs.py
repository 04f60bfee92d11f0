"""Where flashkit may write: one rule for every path a user names as an output (a file for ``-o``, a folder for
``--out`` or ``key generate``), checked before any work is done.

An output path is refused (a usage error, exit 2, naming the flag and the path) when:

- it lies under ``/proc``, ``/sys`` or ``/dev`` (``/dev/shm`` aside), as named or where its symlinks lead:
  writing there changes the running system, not a file (an atomic ``-o /dev/stdout`` would replace the
  link to the process's output with a regular file), and a folder cannot be staged there at all;
- it lies inside a git directory: a ``.git`` folder (a checkout's or a worktree's, found through symlinks)
  or any folder that holds ``HEAD``, ``objects/`` and ``refs/`` (a bare repository). A file written there
  is a ref, a hook or an object to git, and a folder of them is a broken ref;
- a folder on the way is a file, or the path itself is something other than what is asked for (a folder for
  ``-o``; a file, a FIFO, a device or a symlink for a folder that is replaced whole);
- it cannot name a file at all: a control character in it (a newline would split every line that names the
  path, a NUL ends it early), a name longer than a file system takes, or a symlink loop on the way.

A folder that is replaced whole must moreover be new, empty, or recognisably the command's own output
(``ours``), so that nothing flashkit did not write is ever deleted. :func:`write_folder` stages the new folder
beside the old and swaps it in at once (:mod:`flashkit.core.atomic`); :func:`writing` turns a failure of the
file system while writing (no space, read-only, permission) into the same usage error, naming the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from flashkit.core.atomic import replace_folder, stage_folder
from flashkit.core.errors import FlashkitError, UsageError
from flashkit.core.textcheck import control_characters

SYSTEM_TREES = ("/proc", "/sys", "/dev")
SHM = Path("/dev/shm")
# Linux's NAME_MAX and PATH_MAX (bytes): past them every call on the path fails with ENAMETOOLONG.
NAME_MAX = 255
PATH_MAX = 4096


def _resolved(path: Path) -> Path:
    """``path`` made absolute with the symlinks of its existing part resolved (the part that does not exist
    yet is kept as written): where a write would land."""
    path = Path(os.path.abspath(path))
    missing: list[str] = []
    here = path
    while not os.path.lexists(here) and here != here.parent:
        missing.insert(0, here.name)
        here = here.parent
    return Path(os.path.realpath(here), *missing)


def _under(path: Path, tree: Path) -> bool:
    """Whether ``path`` is ``tree`` or inside it; /dev/shm, a tmpfs of plain files, is not part of /dev."""
    inside = path == tree or tree in path.parents
    return inside and not (path == SHM or SHM in path.parents)


def _is_git_dir(folder: Path) -> bool:
    return (folder / "HEAD").is_file() and (folder / "objects").is_dir() and (folder / "refs").is_dir()


def _git_dir_above(real: Path) -> Path | None:
    """The git directory ``real`` lies in (or is), if any."""
    for folder in (real, *real.parents):
        if folder.name == ".git" or (folder.is_dir() and _is_git_dir(folder)):
            return folder
    return None


def _unnameable(absolute: Path) -> str | None:
    """Why ``absolute`` cannot name a file (see the module docstring), or None."""
    bad = control_characters(str(absolute))
    if bad:
        return f"holds control characters ({', '.join(bad)})"
    longest = max(len(os.fsencode(part)) for part in absolute.parts)
    if longest > NAME_MAX:
        return f"a name in it is {longest} bytes long; a file system takes at most {NAME_MAX}"
    if len(os.fsencode(absolute)) >= PATH_MAX:
        return f"it is {len(os.fsencode(absolute))} bytes long; a path may have at most {PATH_MAX - 1}"
    here = absolute
    while not os.path.lexists(here) and here != here.parent:
        here = here.parent
    try:
        os.stat(here)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{here} is a symlink loop"
    return None


def check_path(path: Path | str, *, flag: str, error: type[FlashkitError] = UsageError) -> Path:
    """The absolute ``path`` (as named, symlinks not resolved), refused as the module docstring says when it
    lies in a system tree or a git directory, or when a folder on its way is not a folder. ``error``: the
    class of the refusal, for a command whose output has its own exit code (a key pair's folder: 27)."""
    shown = f"{flag} {str(path)!r}" if control_characters(str(path)) else f"{flag} {path}"
    absolute = Path(os.path.abspath(path))
    why = _unnameable(absolute)
    if why:
        raise error(
            f"{shown}: {why}",
            hint="name a path of printable characters, each name at most 255 bytes, through no symlink loop",
        )
    real = _resolved(absolute)
    for tree in SYSTEM_TREES:
        if any(_under(p, Path(tree)) for p in (absolute, real)):
            raise error(
                f"{shown}: lies under {tree}{'' if real == absolute else f' (it leads to {real})'}; flashkit writes "
                "files, not system state",
                hint="name a path in a folder of your own" + (" (or leave -o out to print)" if flag == "-o" else ""),
            )
    git = _git_dir_above(real)
    if git is not None:
        raise error(
            f"{shown}: lies inside the git directory {git}; writing there would corrupt the repository",
            hint="name a path outside .git (e.g. under .work/, which git ignores)",
        )
    for folder in real.parents:
        if os.path.lexists(folder):
            if not folder.is_dir():
                raise error(f"{shown}: {folder} is not a folder", hint="name a path whose folders are folders")
            break
    return absolute


def check_file(path: Path | str, *, flag: str) -> Path:
    """An output file (``-o``): :func:`check_path`, and not a folder."""
    absolute = check_path(path, flag=flag)
    if absolute.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; name the file to write")
    return absolute


def check_folder(path: Path | str, *, flag: str, ours: Callable[[Path], bool], what: str) -> Path:
    """An output folder replaced whole: :func:`check_path`; absent, or a real folder that is empty or ``ours``
    (``what`` says what ours look like, for the message)."""
    absolute = check_path(path, flag=flag)
    if absolute.is_symlink() or (os.path.lexists(absolute) and not absolute.is_dir()):
        raise UsageError(
            f"{flag} {path}: is not a folder (a file, a symlink or a device); it is replaced whole, so it must be one",
            hint=f"name a new folder, or one {what}",
        )
    if absolute.is_dir() and any(absolute.iterdir()) and not ours(absolute):
        raise UsageError(
            f"{flag} {path}: the folder holds files flashkit did not write; it is replaced whole, so it is refused",
            hint=f"name a new or empty folder, or one {what}",
        )
    return absolute


@contextlib.contextmanager
def writing(path: Path, *, flag: str) -> Iterator[None]:
    """Turn a file system failure while writing ``path`` (no space, read-only, no permission) into a usage
    error naming the flag and the path; failures elsewhere pass through."""
    try:
        yield
    except OSError as exc:
        where = os.path.abspath(exc.filename) if exc.filename else ""
        mine = Path(os.path.abspath(path))
        if where and not (Path(where) == mine or Path(where).is_relative_to(mine.parent)):
            raise
        raise UsageError(
            f"{flag} {path}: cannot write it: {exc.strerror or exc}",
            hint="name a folder you can write, on a file system with space",
        ) from None


def write_folder(
    path: Path | str, files: dict[str, bytes], *, flag: str, ours: Callable[[Path], bool], what: str
) -> Path:
    """Put ``files`` (relative path -> bytes) at ``path`` all at once: checked by :func:`check_folder`, written in
    a sibling folder, then swapped with the old one; on any failure the old folder is left as it was."""
    dest = check_folder(path, flag=flag, ours=ours, what=what)
    with writing(dest, flag=flag):
        stage = stage_folder(dest)
        try:
            for rel, data in sorted(files.items()):
                target = stage / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            replace_folder(stage, dest)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    return dest
