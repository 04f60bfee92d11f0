"""Where the repository's inputs live, found from the working directory (or FLASHKIT_ROOT)."""

from __future__ import annotations

import os
from pathlib import Path

from flashkit.core.errors import SpecError

ENVS_DIR = "envs"
LOCKFILES_DIR = "lockfiles"
TEMPLATE = "templates/Dockerfile.j2"
KERNELS_DIR = "flash_kernels"

# A directory is the repository root when it holds both of these; the pair is specific enough that a
# parent checkout of some other project is never mistaken for ours.
_MARKERS = (ENVS_DIR, TEMPLATE)


def is_repo_root(path: Path) -> bool:
    # os.path: False, not OSError, for a name too long to look up
    return all(os.path.exists(path / m) for m in _MARKERS)


def find_repo_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) holding envs/ and the template."""
    env = os.environ.get("FLASHKIT_ROOT")
    if env:
        root = Path(env).resolve()
        if not is_repo_root(root):
            raise SpecError(f"FLASHKIT_ROOT={env} is not a flashkit repository (it needs {', '.join(_MARKERS)})")
        return root
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if is_repo_root(candidate):
            return candidate
    raise SpecError(
        f"no flashkit repository at or above {here}: looked for a directory holding "
        f"{' and '.join(_MARKERS)}. Run flashkit inside the checkout or set FLASHKIT_ROOT."
    )


def root_of(args) -> Path:
    """The repository a CLI command works on: its global --repo, else found from the working directory."""
    repo = getattr(args, "repo", None)
    return find_repo_root(Path(repo) if repo else None)


def env_file(repo_root: Path, env_id: str) -> Path:
    return repo_root / ENVS_DIR / f"{env_id}.yaml"


def lock_dir(repo_root: Path, env_id: str) -> Path:
    """The env's resolved sets: one file per Python (``py3.12.txt``) and the builder's additions."""
    return repo_root / LOCKFILES_DIR / env_id


def python_lock_file(repo_root: Path, env_id: str, python: str) -> Path:
    """The set resolved for one Python; the image's Python's file is what the published image installs."""
    return lock_dir(repo_root, env_id) / f"py{python}.txt"


def build_lock_file(repo_root: Path, env_id: str) -> Path:
    """Builder-only lock: toolchain packages the runtime image must not carry."""
    return lock_dir(repo_root, env_id) / "build.txt"


def production_file(repo_root: Path, env_id: str) -> Path:
    """Production requirements for every covered Python in one file (pins marked by Python): what users install."""
    return repo_root / LOCKFILES_DIR / f"{env_id}.txt"


def base_lock_file(repo_root: Path, env_id: str) -> Path:
    """Base lock: every Debian package of a debian-flavoured env's builder and runtime bases."""
    return lock_dir(repo_root, env_id) / "base.txt"


def rel(repo_root: Path, path: Path) -> str:
    """A repo-relative POSIX path for messages and manifests (never an absolute path)."""
    try:
        return path.resolve().relative_to(repo_root.resolve()).as_posix()
    except ValueError:
        return str(path)
