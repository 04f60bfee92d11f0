"""The kit a publication serves beside the kernel wheels: the flashkit wheel of this checkout, built once per
publication, and ``lockfiles/kit.txt`` (its dependencies by hash), so that ``flashkit doctor`` installs and
runs on a machine with no clone: ``pip install --require-hashes -r <base>/kit/requirements.txt``.

The wheel is built by ``uv build`` in an isolated environment from the checkout's ``pyproject.toml``, with
SOURCE_DATE_EPOCH fixed so that its zip entries carry no build time.
"""

from __future__ import annotations

import os
from pathlib import Path

from flashkit.core import procs
from flashkit.core.digests import sha256_file
from flashkit.core.errors import LockError, ToolError
from flashkit.locking import kit_lock
from flashkit.publish.wheel_publication import Kit

# 2026-11-30T00:00:00Z, the lock date: zip entries cannot hold times before 1980, and a fixed time keeps the
# wheel's bytes a function of its files.
SOURCE_DATE_EPOCH = "1764460800"


def build(root: Path, work: Path, uv: str) -> Kit:
    """The kit wheel built into ``work`` from the checkout at ``root``, with the checked kit lock."""
    text = kit_lock.read(root)
    problems = kit_lock.check(root, text)
    if problems:
        raise LockError("\n".join(problems), hint="run `flashkit lock --kit` and commit lockfiles/kit.txt")
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    done = procs.run(
        [uv, "build", "--wheel", "--no-config", "--quiet", "--out-dir", str(work), str(root)],
        timeout=600, error=ToolError, what="the kit wheel: uv build", env=env, capture_output=True, text=True,
    )  # fmt: skip
    wheels = sorted(work.glob("flashkit-*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise ToolError(f"uv build could not build the flashkit wheel:\n{(done.stderr or done.stdout).strip()[-1500:]}")
    return Kit(wheels[0], sha256_file(wheels[0]), text)
