"""``lockfiles/kit.txt``: the kit's own dependencies, hash-pinned for every Python >= 3.11 and every platform.

A publication serves the flashkit wheel beside the kernel wheels (so ``flashkit doctor`` runs without a
clone), and pip's hash-checking mode installs nothing unpinned: this file pins what ``pyproject.toml``'s
``[project] dependencies`` pull in. uv resolves it universally (markers instead of one platform): ``flashkit
lock --kit`` runs :func:`write` (needs PyPI); the header, the resolver's arguments and the offline
:func:`check` (``flashkit lock --kit --check``, and a publication before it ships the file) run no tool.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flashkit.core import procs, safeio
from flashkit.core.atomic import write_text_atomic
from flashkit.core.errors import LockError, ToolError
from flashkit.locking.uv import uv_binary
from flashkit.plan import production

FILE = "lockfiles/kit.txt"
MIN_PYTHON = "3.11"  # pyproject.toml's requires-python
EXCLUDE_NEWER = "2026-11-30T00:00:00Z"  # the envs' lock date: a re-lock gives the same pins
MAX_BYTES = 4 * safeio.MIB  # the lock is about 60 KiB


def resolver_args() -> list[str]:
    return [
        "--universal",
        "--python-version",
        MIN_PYTHON,
        "--generate-hashes",
        "--exclude-newer",
        EXCLUDE_NEWER,
        "--no-header",
        "--annotation-style",
        "line",
        "--no-config",
        "--no-python-downloads",
        "--quiet",
    ]


def header() -> str:
    return (
        f"# flashkit lock kit: the kit's own dependencies (pyproject.toml), every Python >= {MIN_PYTHON} and "
        "platform, by hash\n"
        "# regenerate: flashkit lock --kit\n"
        f"# resolver: uv pip compile pyproject.toml {' '.join(resolver_args())}\n"
    )


def read(root: Path) -> str:
    """The kit lock's text: a regular file of UTF-8 in the checkout, or LockError naming it."""
    return safeio.read_text(root / FILE, what="kit lock", error=LockError, max_bytes=MAX_BYTES, root=root)


def dependencies(root: Path) -> list[Requirement]:
    text = safeio.read_text(
        root / "pyproject.toml", what="project file", error=LockError, max_bytes=MAX_BYTES, root=root
    )
    try:
        return [Requirement(r) for r in tomllib.loads(text)["project"]["dependencies"]]
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError, RecursionError) as exc:
        raise LockError(
            f"pyproject.toml: no [project] dependencies to check {FILE} against ({type(exc).__name__}: {exc})",
            hint="restore pyproject.toml from git",
        ) from None


def check(root: Path, text: str) -> list[str]:
    """Why ``text`` is not a current kit lock (empty: it is): its header, a dependency it does not pin or
    pins outside the range pyproject.toml asks, a pin without hashes."""
    problems = [] if text.startswith(header()) else [f"{FILE}: not written by this flashkit's `flashkit lock --kit`"]
    pins, _not_covered, bad = production.parse_merged(text)  # pins with markers, as the merged env files
    problems += [f"{FILE}: {b}" for b in bad]
    by_name = {p.name: p for p in pins}
    for req in dependencies(root):
        pin = by_name.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{FILE}: pyproject.toml needs {req}, which it does not pin; run `flashkit lock --kit`")
        elif not req.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{FILE}: pins {pin.name}=={pin.version}, pyproject.toml asks {req}")
    problems += [f"{FILE}: {p.name}=={p.version} has no --hash" for p in pins if not p.hashes]
    return problems


def resolve(root: Path) -> str:
    """The kit lock's text for the checkout at ``root``; LockError naming uv's reason when it finds none."""
    argv = [uv_binary(), "pip", "compile", "pyproject.toml", *resolver_args()]
    done = procs.run(
        argv, timeout=900, error=ToolError, timeout_error=LockError, what="the kit lock: uv pip compile",
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise LockError(f"uv could not resolve the kit's dependencies:\n{done.stderr.strip()}")
    text = header() + done.stdout
    problems = check(root, text)
    if problems:
        raise LockError("uv's kit lock does not check out: " + "; ".join(problems))
    return text


def write(root: Path) -> Path:
    path = root / FILE
    write_text_atomic(path, resolve(root))
    return path
