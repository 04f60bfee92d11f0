"""The input hash: one content hash over everything an image is built from, Nix-style.

Scheme 1 hashes the canonical JSON (sorted keys, no whitespace, ASCII) of this manifest:

    {"scheme": 1,
     "spec": EnvSpec.normalized()          -- the typed values, not the YAML bytes: comments, key order,
                                              notes and digest_note do not change an image's identity
     "lock": {"runtime_sha256", "build_sha256"}   -- the lockfiles' exact bytes
     "template_sha256": sha256 of templates/Dockerfile.j2
     "kernel_sources": [[repo-relative posix path, "100644"|"100755"|"120000", sha256], ...] sorted}

Kernel sources are every file under the spec's kernel_source directory except build outputs and
caches (EXCLUDED_DIRS, EXCLUDED_SUFFIXES); the walk needs no git, so a tarball of the repository
hashes the same as a checkout. The result is "fk1-<64 hex>": the prefix names the scheme, so a
future scheme can never collide with this one. Site inputs (proxy CA, mirrors, build host memory)
are deliberately not part of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from flashkit.plan import lock
from flashkit.core.errors import SpecError
from flashkit.plan.render import read_template, sha256_text
from flashkit.plan.spec import EnvSpec

SCHEME = 1
PREFIX = f"fk{SCHEME}-"

# Build outputs and caches that may sit in a working tree but are not sources. Keep .dockerignore in
# step with this list so that the build context and the hash see the same files.
EXCLUDED_DIRS = frozenset(
    {"__pycache__", "build", "dist", ".eggs", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".git"}
)
EXCLUDED_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".egg-info")


def _excluded_dir(name: str) -> bool:
    return name in EXCLUDED_DIRS or name.endswith(".egg-info")


def kernel_sources(repo_root: Path, kernel_source: str) -> list[list[str]]:
    root = Path(repo_root)
    base = root / kernel_source
    if not base.is_dir():
        raise SpecError(
            f"kernel sources {kernel_source!r} not found under the repository root ({root}); the input hash needs them"
        )
    out: list[list[str]] = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not _excluded_dir(d))
        for name in filenames:
            if name.endswith(EXCLUDED_SUFFIXES):
                continue
            full = Path(dirpath, name)
            relpath = full.relative_to(root).as_posix()
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                out.append([relpath, "120000", hashlib.sha256(os.readlink(full).encode()).hexdigest()])
            elif stat.S_ISREG(st.st_mode):
                mode = "100755" if st.st_mode & stat.S_IXUSR else "100644"
                out.append([relpath, mode, hashlib.sha256(full.read_bytes()).hexdigest()])
    return sorted(out)


def manifest(
    spec: EnvSpec, *, lock_text: str, build_lock_text: str, template_text: str, sources: list[list[str]]
) -> dict:
    return {
        "scheme": SCHEME,
        "spec": spec.normalized(),
        "lock": {"runtime_sha256": sha256_text(lock_text), "build_sha256": sha256_text(build_lock_text)},
        "template_sha256": sha256_text(template_text),
        "kernel_sources": sources,
    }


def digest(man: dict) -> str:
    canonical = json.dumps(man, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return PREFIX + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def input_hash(repo_root: Path, spec: EnvSpec) -> str:
    """``fk1-<sha256>`` over spec, lockfiles, template and kernel sources read from the repository."""
    texts = lock.read(repo_root, spec)
    return digest(
        manifest(
            spec,
            lock_text=texts.runtime,
            build_lock_text=texts.build,
            template_text=read_template(repo_root),
            sources=kernel_sources(repo_root, spec.kernel_source),
        )
    )


def tag_suffix(h: str) -> str:
    """A short, tag-safe form for immutable image tags: ``fk1-<first 16 hex>``."""
    if not h.startswith(PREFIX):
        raise ValueError(f"not a flashkit input hash: {h!r}")
    return h[: len(PREFIX) + 16]


__all__ = ["PREFIX", "SCHEME", "digest", "input_hash", "kernel_sources", "manifest", "tag_suffix"]
