"""The plan of one env: every input an image is built from, read once, and the hash of exactly those bytes.

:func:`load_plan` is the edge. It reads the spec, the image's two lockfiles (its Python's runtime set
``lockfiles/<env>/py<X.Y>.txt`` and ``build.txt``; the other Pythons' sets are not inputs of the image),
the template and every kernel source file through :mod:`flashkit.core.safeio` (regular files only, inside the repository, size-capped,
UTF-8 where text) and computes the input hash from the bytes it holds. Everything after it (rendering,
the build context, the bake file, the CI matrix, the gate) takes the :class:`Plan` value and reads
nothing from the repository again, so one command cannot see two versions of an input.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from flashkit.core import paths, safeio
from flashkit.core.errors import LockError, SpecError
from flashkit.plan import baselock, compat, inputhash, rules
from flashkit.plan.lock import LockTexts, check
from flashkit.plan.spec import EnvSpec
from flashkit.plan.specfile import load_env

MAX_TEMPLATE_BYTES = 256 * safeio.KIB
MAX_LOCK_BYTES = 4 * safeio.MIB
MAX_SOURCE_BYTES = 8 * safeio.MIB
MAX_SOURCES_TOTAL = 64 * safeio.MIB

# Build outputs and caches that may sit in a working tree but are not sources. .dockerignore lists the
# same names for a `docker build .` of the whole repository.
EXCLUDED_DIRS = frozenset(
    {"__pycache__", "build", "dist", ".eggs", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".git", ".nox"}
)
EXCLUDED_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".egg-info")


@dataclass(frozen=True)
class SourceFile:
    path: str  # repo-relative POSIX path
    mode: str  # "100644" or "100755"
    data: bytes = field(repr=False)
    sha256: str


@dataclass(frozen=True)
class Plan:
    spec: EnvSpec
    locks: LockTexts
    template: str
    sources: tuple[SourceFile, ...]
    input_hash: str
    lock_problems: tuple[str, ...]  # why the lockfiles do not match the spec (empty: consistent)
    wheel_source: Plan | None = None  # the env whose builder makes this env's wheel (spec.wheel_from)

    @property
    def env_id(self) -> str:
        return str(self.spec.id)

    @property
    def tag(self) -> str:
        return inputhash.tag_suffix(self.input_hash)

    def manifest(self) -> dict:
        return manifest_of(self.spec, self.locks, self.template, self.sources, self.wheel_source)

    def require_consistent_locks(self) -> None:
        if self.lock_problems:
            raise LockError(
                f"{self.env_id}: lockfiles are inconsistent with the spec:\n  - " + "\n  - ".join(self.lock_problems),
                hint=f"run `flashkit lock {self.env_id}` (needs PyPI) for the pip locks, `flashkit base lock "
                f"{self.env_id}` (root, mmdebstrap) for the base lock, and commit the result",
            )


def manifest_of(
    spec: EnvSpec,
    locks: LockTexts,
    template: str,
    sources: tuple[SourceFile, ...],
    wheel_source: Plan | None = None,
) -> dict:
    return inputhash.manifest(
        spec,
        lock_text=locks.runtime,
        build_lock_text=locks.build,
        template_text=template,
        sources=[(s.path, s.mode, s.sha256) for s in sources],
        base_lock_text=locks.base,
        wheel_from=(wheel_source.env_id, wheel_source.input_hash) if wheel_source else None,
    )


def read_template(root: Path) -> str:
    return safeio.read_text(
        root / paths.TEMPLATE, what="Dockerfile template", error=SpecError, max_bytes=MAX_TEMPLATE_BYTES, root=root
    )


def read_locks(root: Path, env_id: str, python: str, *, with_base: bool = False) -> LockTexts:
    """The image's lockfiles: the runtime set of its Python and the builder's additions, and with
    ``with_base`` (debian-flavoured envs) the base lock; a missing one is an error."""
    rp, bp = paths.python_lock_file(root, env_id, python), paths.build_lock_file(root, env_id)
    missing = [paths.rel(root, p) for p in (rp, bp) if not os.path.lexists(p)]
    if missing:
        raise LockError(
            f"{env_id}: lockfile missing: {', '.join(missing)}", hint=f"run `flashkit lock {env_id}` (needs PyPI)"
        )
    runtime, build = (
        safeio.read_text(p, what="lockfile", error=LockError, max_bytes=MAX_LOCK_BYTES, root=root) for p in (rp, bp)
    )
    base = None
    if with_base:
        path = paths.base_lock_file(root, env_id)
        if not os.path.lexists(path):
            raise LockError(
                f"{env_id}: base lock missing: {paths.rel(root, path)}",
                hint=f"run `flashkit base lock {env_id}` (as root, needs mmdebstrap and Debian's archive) and commit it",
            )
        base = safeio.read_text(path, what="base lock", error=LockError, max_bytes=MAX_LOCK_BYTES, root=root)
    return LockTexts(runtime, build, base)


def _excluded_dir(name: str) -> bool:
    return name in EXCLUDED_DIRS or name.endswith(".egg-info")


# The kernel tree is every env's input, and a command that plans every env (matrix, resolve, the site) read
# and hashed it once per env. Its files are read again only when one of them changed: the memo is keyed by
# each file's path and stat (of the file and, for a symlink, of its target), so an edit, even of the same size
# in the same second (nanosecond times), misses it.
_SOURCES_MEMO: dict[tuple[str, str], tuple[tuple, tuple[SourceFile, ...]]] = {}


def read_sources(root: Path, kernel_source: str) -> tuple[SourceFile, ...]:
    """Every file of the kernel package, by content. A symlink must stay inside the repository and is
    read as its target's bytes (that is what a build would copy); other special files are refused."""
    base = root / kernel_source
    if not base.is_dir():
        raise SpecError(
            f"kernel sources {kernel_source!r} not found under the repository root ({root}); the input hash needs them"
        )
    files = _source_files(root, base)
    key = (os.path.realpath(root), kernel_source)
    stamp = tuple((str(f), _stamp(f)) for f in files)
    memo = _SOURCES_MEMO.get(key)
    if memo is not None and memo[0] == stamp and None not in (s for _, s in stamp):
        return memo[1]
    out = _read_source_files(root, kernel_source, files)
    _SOURCES_MEMO[key] = (stamp, out)
    return out


def _stamp(path: Path) -> tuple | None:
    """What changes when the file (or a symlink's target) does; None when it cannot be read (a dangling
    link): such a tree is read again, and the read says what is wrong with it."""
    try:
        own = os.lstat(path)
        both = (own, os.stat(path)) if stat.S_ISLNK(own.st_mode) else (own,)
    except OSError:
        return None
    return tuple((s.st_ino, s.st_dev, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_mode) for s in both)


def _source_files(root: Path, base: Path) -> list[Path]:
    """The kernel package's files in read order, folders excluded as the input hash excludes them."""
    files = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not _excluded_dir(d))
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                rel = Path(dirpath, d).relative_to(root).as_posix()
                raise SpecError(
                    f"{rel}: a symlink to a folder in the kernel sources", hint="replace it with the folder"
                )
        files += [Path(dirpath, name) for name in sorted(filenames) if not name.endswith(EXCLUDED_SUFFIXES)]
    return files


def _read_source_files(root: Path, kernel_source: str, files: list[Path]) -> tuple[SourceFile, ...]:
    out: list[SourceFile] = []
    total = 0
    for full in files:
        data = safeio.read_bytes(full, what="kernel source", error=SpecError, max_bytes=MAX_SOURCE_BYTES, root=root)
        total += len(data)
        if total > MAX_SOURCES_TOTAL:
            raise SpecError(f"{kernel_source}: the kernel sources exceed {MAX_SOURCES_TOTAL // safeio.MIB} MiB")
        mode = "100755" if os.stat(full).st_mode & stat.S_IXUSR else "100644"
        out.append(SourceFile(full.relative_to(root).as_posix(), mode, data, hashlib.sha256(data).hexdigest()))
    return tuple(sorted(out, key=lambda s: s.path))


def wheel_source_problems(spec: EnvSpec, src: EnvSpec) -> list[str]:
    """Why ``spec`` may not install the wheel ``src`` builds (empty: it may). The wheel is one file for
    both, so everything it depends on must hold in both: torch's stable ABI, the CUDA major, the GPU
    targets compiled into it, and a base at least as new as the one it was built on."""
    problems = []
    if src.wheel_from:
        problems.append(f"{src.id} takes its own wheel from {src.wheel_from}; name the env that builds it")
    if src.torch_abi != "stable":
        problems.append(
            f"{src.id} builds a wheel bound to torch {src.torch_series} (version ABI), which loads on that torch only; "
            f"a shared wheel must be built on torch's stable ABI (torch >= {compat.STABLE_ABI_MIN_TORCH})"
        )
    if spec.torch_abi != "stable":
        problems.append(
            f"torch {spec.torch} has no stable ABI for flash_kernels (needs >= {compat.STABLE_ABI_MIN_TORCH}, CUDA)"
        )
    if (spec.accelerator.kind, spec.accelerator.major) != (src.accelerator.kind, src.accelerator.major):
        problems.append(
            f"{src.id} is {src.accelerator}, this env {spec.accelerator}: the wheel links one CUDA runtime major"
        )
    if spec.gpu_targets != src.gpu_targets:
        problems.append(
            f"gpu_targets {list(spec.gpu_targets)} differ from {src.id}'s {list(src.gpu_targets)}, the archs its wheel carries"
        )
    if not _base_runs_wheels_of(spec.base, src.base):
        problems.append(
            f"base {spec.base.flavor}/{spec.base.suite} is not {src.id}'s {src.base.flavor}/{src.base.suite} or a "
            "newer Debian release (the wheel needs the C and C++ runtime it was built against, or a newer one)"
        )
    return problems


def _base_runs_wheels_of(base, src_base) -> bool:
    """Whether a wheel built on ``src_base`` loads on ``base``: the same base, or a newer Debian release (glibc
    and libstdc++ keep every symbol version of older releases; the abi tier checks the .so in the image)."""
    if (base.flavor, base.suite) == (src_base.flavor, src_base.suite):
        return True
    suites = compat.DEBIAN_SUITES
    if (
        base.flavor != "debian"
        or src_base.flavor != "debian"
        or base.suite not in suites
        or src_base.suite not in suites
    ):
        return False
    return suites[base.suite].release >= suites[src_base.suite].release


def plan_of(root: Path, spec: EnvSpec) -> Plan:
    """The plan of an already-validated spec (the rest of its inputs read now)."""
    root = Path(root)
    wheel_source = None
    if spec.wheel_from:
        try:
            wheel_source = plan_of(root, load_env(root, spec.wheel_from))
        except SpecError as exc:
            raise SpecError(f"{spec.source}: wheel_from: {exc}") from None
        problems = wheel_source_problems(spec, wheel_source.spec)
        if problems:
            raise SpecError(
                f"{spec.source}: wheel_from: {spec.wheel_from}'s wheel cannot serve this env:\n  - "
                + "\n  - ".join(problems),
                hint="fix the field, or leave wheel_from out to build this env's own wheel",
            )
    locks = read_locks(root, str(spec.id), spec.python, with_base=spec.base.flavor == "debian")
    template = read_template(root)
    sources = read_sources(root, spec.kernel_source)
    h = inputhash.digest(manifest_of(spec, locks, template, sources, wheel_source))
    problems = check(spec, locks.runtime, locks.build)
    if locks.base is not None:
        problems += baselock.check(spec, locks.base)
    return Plan(spec, locks, template, sources, h, tuple(problems), wheel_source)


def load_plan(root: Path, env_id: str) -> Plan:
    return plan_of(root, load_env(root, env_id))


def keep_accepted(plans: list[Plan], named: bool) -> tuple[list[Plan], list[str]]:
    """The plans the rules accept, and why the others were left out. Envs named on the command line
    must be accepted (a rejection raises, exit 4); envs taken from --all are left out with the reason."""
    kept, skipped = [], []
    for plan in plans:
        if named:
            rules.require_accepted(plan.spec)
        elif rules.rejections(plan.spec):
            skipped.extend(rules.format_rejection(plan.spec, v) for v in rules.rejections(plan.spec))
            continue
        kept.append(plan)
    return kept, skipped
