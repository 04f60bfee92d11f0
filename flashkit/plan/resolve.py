"""Resolving lockfiles with uv (the network edge of locking) and writing them all-or-nothing.

The requirement sets, the fixed header and the offline checks live in :mod:`flashkit.plan.lock`; this
module runs ``uv pip compile`` and writes both files of an env together.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

from flashkit.core import paths
from flashkit.core.atomic import write_texts_atomic
from flashkit.core.errors import LockError, ToolError
from flashkit.plan.lock import PIN_RE, PLATFORM, LockTexts, check, header, inputs, parse, resolver_args
from flashkit.plan.spec import EnvSpec


def _uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # the `uv` PyPI package ships the binary beside this helper
    except ImportError:
        find_uv_bin = None
    if find_uv_bin is not None:
        try:
            return find_uv_bin()
        except FileNotFoundError:
            pass
    raise ToolError("uv is not installed: `pip install uv` (it is a dependency of flashkit)")


def _compile(uv: str, spec: EnvSpec, reqs: tuple[str, ...], constraints: str | None) -> str:
    with tempfile.TemporaryDirectory(prefix="flashkit-lock-") as tmp:
        # A fixed file name in a fresh directory keeps uv's "# via -r requirements.in" identical on
        # every machine.
        Path(tmp, "requirements.in").write_text("\n".join(reqs) + "\n", encoding="utf-8")
        args = [uv, *resolver_args(spec)]
        if constraints is not None:
            Path(tmp, "constraints.txt").write_text(constraints, encoding="utf-8")
            args += ["-c", "constraints.txt"]
        args.append("requirements.in")
        try:
            proc = subprocess.run(args, cwd=tmp, capture_output=True, text=True, timeout=900)
        except OSError as exc:
            raise ToolError(f"could not run uv ({uv}): {exc}") from None
        except subprocess.TimeoutExpired:
            raise LockError(f"{spec.id}: uv pip compile did not finish in 15 minutes") from None
    if proc.returncode != 0:
        raise LockError(
            f"{spec.id}: uv could not resolve {' '.join(reqs)} for Python {spec.python} on {PLATFORM}:\n{proc.stderr.strip()}"
        )
    return proc.stdout


def resolve(spec: EnvSpec) -> LockTexts:
    """Resolve both sets with uv (needs PyPI). Pure output: nothing is written."""
    uv = _uv()
    li = inputs(spec)
    combined = _compile(uv, spec, li.runtime + li.build, None)
    pins, problems = parse(combined)
    if problems:
        raise LockError(f"{spec.id}: unexpected resolver output: {'; '.join(problems)}")
    # Resolving the runtime set under the combined pins makes it a subset that agrees version for version.
    constraints = "".join(f"{p.name}=={p.version}\n" for p in pins)
    runtime = _compile(uv, spec, li.runtime, constraints) if li.runtime else ""
    rt_names = {p.name for p in parse(runtime)[0]}
    build_lines = _blocks_except(combined, rt_names)
    texts = LockTexts(header(spec, "runtime") + runtime, header(spec, "build") + build_lines)
    problems = check(spec, texts.runtime, texts.build)
    if problems:
        raise LockError(f"{spec.id}: the resolved lock fails its own checks:\n  - " + "\n  - ".join(problems))
    return texts


def _blocks_except(text: str, drop: set[str]) -> str:
    """uv's output minus the blocks (pin, hashes, via-comment) of the named packages."""
    out: list[str] = []
    keep = True
    for line in text.splitlines(keepends=True):
        if line and not line[0].isspace() and not line.startswith("#"):
            m = PIN_RE.match(line)
            keep = not (m and canonicalize_name(m["name"]) in drop)
        if keep:
            out.append(line)
    return "".join(out)


def write(repo_root: Path, spec: EnvSpec, texts: LockTexts) -> list[Path]:
    rp, bp = paths.lock_file(repo_root, str(spec.id)), paths.build_lock_file(repo_root, str(spec.id))
    write_texts_atomic({rp: texts.runtime, bp: texts.build})
    return [rp, bp]
