"""An env's lockfiles, resolved with uv (needs PyPI) and written all-or-nothing.

The requirement sets, the fixed header and the offline checks live in :mod:`flashkit.plan.lock`; this
module runs ``uv pip compile`` (the image's Python, then every other Python the env's torch supports,
wheels-only and preferring the image's versions) and writes all of an env's files together.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from flashkit.core import paths, procs
from flashkit.core.atomic import write_texts_atomic
from flashkit.core.errors import LockError, ToolError
from flashkit.locking.uv import uv_binary
from flashkit.plan import production
from flashkit.plan.lock import PIN_RE, PLATFORM, LockTexts, check, header, inputs, parse, resolver_args
from flashkit.plan.spec import EnvSpec


@dataclass(frozen=True)
class Resolved:
    image: LockTexts  # the image's runtime set (its Python's file) and the builder's additions
    production: production.Production  # every covered Python's set (the image's included) and the merge


class NoSolution(Exception):
    """uv found no set of wheels for a Python (not an error of the tool or the network)."""


def _compile(
    uv: str,
    spec: EnvSpec,
    reqs: tuple[str, ...],
    *,
    python: str | None = None,
    constraints: str | None = None,
    prefer: str | None = None,
) -> str:
    """uv pip compile for ``python`` (default: the image's). ``prefer``: a lockfile whose versions uv
    keeps where they fit (uv reads an existing output file as preferences)."""
    py = python or spec.python
    with tempfile.TemporaryDirectory(prefix="flashkit-lock-") as tmp:
        # A fixed file name in a fresh directory keeps uv's "# via -r requirements.in" identical on
        # every machine.
        Path(tmp, "requirements.in").write_text("\n".join(reqs) + "\n", encoding="utf-8")
        args = [uv, *resolver_args(spec, py)]
        if constraints is not None:
            Path(tmp, "constraints.txt").write_text(constraints, encoding="utf-8")
            args += ["-c", "constraints.txt"]
        if prefer is not None:
            Path(tmp, "requirements.txt").write_text(prefer, encoding="utf-8")
            args += ["-o", "requirements.txt"]
        args.append("requirements.in")
        proc = procs.run(
            args, timeout=900, error=ToolError, timeout_error=LockError, what=f"{spec.id}: uv pip compile ({uv})",
            cwd=tmp, capture_output=True, text=True,
        )  # fmt: skip
        out = Path(tmp, "requirements.txt").read_text(encoding="utf-8") if prefer is not None else proc.stdout
    if proc.returncode != 0:
        if python is not None and "No solution found" in proc.stderr:
            raise NoSolution(_why(proc.stderr, reqs, py))
        raise LockError(
            f"{spec.id}: uv could not resolve {' '.join(reqs)} for Python {py} on {PLATFORM}:\n{proc.stderr.strip()}"
        )
    return out


def _why(stderr: str, reqs: tuple[str, ...], python: str) -> str:
    """uv's explanation of a failed wheels-only resolution, as one line naming the package without wheels."""
    names = list(dict.fromkeys(re.findall(r"Wheels are required for `([^`]+)`", stderr)))
    if names:
        wanted = {canonicalize_name(re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0]): r for r in reqs}
        shown = [wanted.get(canonicalize_name(n), n) for n in names]
        return f"no version of {', '.join(shown)} has a wheel for CPython {python} (uv found no wheels-only set)"
    text = " ".join(re.sub(r"[\u2500-\u257f\u25b6]+", " ", stderr.split("No solution found", 1)[1]).split())
    return (text[:297] + "...") if len(text) > 300 else text


def _image(uv: str, spec: EnvSpec) -> LockTexts:
    """The image's runtime and build sets, resolved together for its Python so that their versions agree."""
    li = inputs(spec)
    combined = _compile(uv, spec, li.runtime + li.build)
    pins, problems = parse(combined)
    if problems:
        raise LockError(f"{spec.id}: unexpected resolver output: {'; '.join(problems)}")
    # Resolving the runtime set under the combined pins makes it a subset that agrees version for version.
    constraints = "".join(f"{p.name}=={p.version}\n" for p in pins)
    runtime = _compile(uv, spec, li.runtime, constraints=constraints) if li.runtime else ""
    rt_names = {p.name for p in parse(runtime)[0]}
    build_lines = _blocks_except(combined, rt_names)
    return LockTexts(header(spec, "runtime") + runtime, header(spec, "build") + build_lines)


def compile_requirements(spec: EnvSpec, reqs: tuple[str, ...]) -> str:
    """``reqs`` resolved and hash-pinned for the image's Python and platform (uv; needs PyPI)."""
    try:
        return _compile(uv_binary(), spec, reqs)
    except NoSolution as why:
        raise LockError(f"{spec.id}: no wheels satisfy {' '.join(reqs)}: {why}") from None


def resolve(spec: EnvSpec) -> Resolved:
    """Resolve the image's sets and every other Python's production set with uv (needs PyPI). Pure
    output: nothing is written."""
    uv = uv_binary()
    image = _image(uv, spec)
    problems = check(spec, image.runtime, image.build)
    if problems:
        raise LockError(f"{spec.id}: the resolved lock fails its own checks:\n  - " + "\n  - ".join(problems))
    sets, not_covered = {spec.python: image.runtime}, {}
    merged = None
    if spec.torch_source == "pypi":
        body = image.runtime[len(header(spec, "runtime")) :]
        for py in production.claimed(spec):
            if py == spec.python:
                continue
            try:
                text = _compile(uv, spec, inputs(spec).runtime, python=py, prefer=body)
            except NoSolution as why:
                not_covered[py] = str(why)
                continue
            sets[py] = header(spec, "runtime", py) + text
        merged = production.merge(spec, sets, not_covered)
    prod = production.Production(sets, not_covered, merged)
    problems = production.check(spec, prod)
    if problems:
        raise LockError(f"{spec.id}: the resolved sets fail their own checks:\n  - " + "\n  - ".join(problems))
    return Resolved(image, prod)


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


def write(repo_root: Path, spec: EnvSpec, resolved: Resolved) -> list[Path]:
    """Every file of the env at once (all or nothing), then the files of Pythons no longer covered and
    the lockfiles of the earlier layout are removed."""
    env = str(spec.id)
    files = {
        paths.python_lock_file(repo_root, env, spec.python): resolved.image.runtime,
        paths.build_lock_file(repo_root, env): resolved.image.build,
    }
    for py, text in resolved.production.sets.items():
        files.setdefault(paths.python_lock_file(repo_root, env, py), text)
    if resolved.production.merged is not None:
        files[paths.production_file(repo_root, env)] = resolved.production.merged
    write_texts_atomic(files)
    stale = [p for p in paths.lock_dir(repo_root, env).glob("py*.txt") if p not in files]
    stale += [repo_root / paths.LOCKFILES_DIR / f"{env}.build.txt"]
    if resolved.production.merged is None:
        stale.append(paths.production_file(repo_root, env))
    for p in stale:
        p.unlink(missing_ok=True)
    return sorted(files)
