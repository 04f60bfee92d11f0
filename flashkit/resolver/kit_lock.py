"""``flashkit lock --kit``: resolve ``lockfiles/kit.txt`` with uv (the network edge; see
:mod:`flashkit.plan.kit_lock` for what the file is and its offline check)."""

from __future__ import annotations

from pathlib import Path

from flashkit.core import procs
from flashkit.core.atomic import write_text_atomic
from flashkit.core.errors import LockError, ToolError
from flashkit.plan import kit_lock
from flashkit.resolver.uv import uv_binary


def resolve(root: Path) -> str:
    """The kit lock's text for the checkout at ``root``; LockError naming uv's reason when it finds none."""
    argv = [uv_binary(), "pip", "compile", "pyproject.toml", *kit_lock.resolver_args()]
    done = procs.run(
        argv, timeout=900, error=ToolError, timeout_error=LockError, what="the kit lock: uv pip compile",
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise LockError(f"uv could not resolve the kit's dependencies:\n{done.stderr.strip()}")
    text = kit_lock.header() + done.stdout
    problems = kit_lock.check(root, text)
    if problems:
        raise LockError("uv's kit lock does not check out: " + "; ".join(problems))
    return text


def write(root: Path) -> Path:
    path = root / kit_lock.FILE
    write_text_atomic(path, resolve(root))
    return path
