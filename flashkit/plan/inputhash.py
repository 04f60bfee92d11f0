"""The input hash: one content hash over everything an image is built from, Nix-style. Pure.

Scheme 2 hashes the canonical JSON (sorted keys, no whitespace, ASCII) of this manifest:

    {"scheme": 2,
     "spec": EnvSpec.normalized()          -- the typed values, not the YAML bytes: comments, key order,
                                              notes and digest_note do not change an image's identity
     "lock": {"runtime_sha256", "build_sha256"[, "base_sha256"]}   -- the lockfiles' exact bytes; base_sha256
                                              (the Debian packages of the bases) for debian-flavoured envs
     "template_sha256": sha256 of templates/Dockerfile.j2
     "kernel_sources": [[repo-relative posix path, "100644"|"100755", sha256], ...] sorted
     "wheel_from": {"env", "input_hash"}   -- only for an env that installs another env's wheel}

The kernel sources are the bytes :func:`flashkit.plan.plan.load_plan` read, and the build context is
written from those same bytes, so what is hashed is exactly what is built. The result is
"fk2-<64 hex>": the prefix names the scheme, so schemes never collide. Scheme 1 (``fk1-``) had no base lock:
its images were built on bases whose packages were whatever the archive served that day; its hashes stay
valid names in old ledger lines (:func:`is_input_hash` accepts both) but no build makes them any more. Site
inputs (proxy CA, mirrors, build host memory) are deliberately not part of it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from flashkit.plan.spec import EnvSpec

SCHEME = 2
PREFIX = f"fk{SCHEME}-"
# Every scheme's hashes are valid names: old ledger lines keep theirs.
HASH_RE = re.compile(r"fk[12]-[0-9a-f]{64}")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def manifest(
    spec: EnvSpec,
    *,
    lock_text: str,
    build_lock_text: str,
    template_text: str,
    sources: Iterable[tuple[str, str, str]],
    base_lock_text: str | None = None,
    wheel_from: tuple[str, str] | None = None,
) -> dict:
    """``sources``: (repo-relative path, git-style mode, sha256) of every kernel source file;
    ``wheel_from``: (env, input hash) of the env whose builder makes this env's wheel."""
    lock = {"runtime_sha256": sha256_text(lock_text), "build_sha256": sha256_text(build_lock_text)}
    if base_lock_text is not None:
        lock["base_sha256"] = sha256_text(base_lock_text)
    man = {
        "scheme": SCHEME,
        "spec": spec.normalized(),
        "lock": lock,
        "template_sha256": sha256_text(template_text),
        "kernel_sources": sorted([path, mode, digest] for path, mode, digest in sources),
    }
    if wheel_from is not None:
        # The source's input hash covers everything its wheel is made of (its locks, base, compiler flags).
        man["wheel_from"] = {"env": wheel_from[0], "input_hash": wheel_from[1]}
    return man


def sources_digest(sources: Iterable[tuple[str, str, str]]) -> str:
    """sha256 (hex) of the kernel sources as the manifest lists them: what a source-tier verdict judges."""
    listed = sorted([path, mode, sha] for path, mode, sha in sources)
    return hashlib.sha256(json.dumps(listed, separators=(",", ":"), ensure_ascii=True).encode("ascii")).hexdigest()


def digest(man: dict) -> str:
    canonical = json.dumps(man, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return PREFIX + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def is_input_hash(value: object) -> bool:
    return isinstance(value, str) and HASH_RE.fullmatch(value) is not None


def tag_suffix(h: str) -> str:
    """A short, tag-safe form for immutable image tags: ``fk2-<first 16 hex>``."""
    if not is_input_hash(h):
        raise ValueError(f"not a flashkit input hash: {h!r}")
    return h[:20]


__all__ = [
    "HASH_RE",
    "PREFIX",
    "SCHEME",
    "digest",
    "is_input_hash",
    "manifest",
    "sha256_text",
    "sources_digest",
    "tag_suffix",
]
