"""Env specs: ``envs/<id>.yaml`` parsed into frozen dataclasses, with errors a user can act on.

YAML is read with PyYAML's safe loader; the typed values are built by the validator below, which
collects every problem in the file and reports each with its line, field, value, what is allowed and,
for a typo, the closest valid value. Unknown fields are refused. Values that end up in shell lines,
image references or file paths (tags, refs, digests, paths) are checked against strict patterns, so
a spec can never inject into a rendered Dockerfile.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from flashkit.plan import compat
from flashkit.core import paths
from flashkit.plan.envid import EnvId
from flashkit.core.errors import SpecError

SCHEMA_VERSION = 1

ACCEL_KINDS = ("cuda", "rocm")
COMPILER_SOURCES = ("base-image", "debian", "pypi")
BACKENDS = ("cuda", "triton")
FLAVORS = ("ngc", "cuda", "rocm", "debian")

# Docker's grammar for a tag, and a conservative one for a repository path (registry host allowed).
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REPO_RE = re.compile(
    r"^(?:[a-z0-9]+(?:[.-][a-z0-9]+)*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_PY_RE = re.compile(r"^3\.(?:[0-9]|1[0-9])$")
_ACCEL_VERSION_RE = re.compile(r"^[1-9][0-9]?\.[0-9]$")
_CUDA_ARCH_RE = re.compile(r"^(?P<cc>[0-9]{1,2}\.[0-9])(?P<suffix>[af])?(?P<ptx>\+PTX)?$")
_GFX_RE = re.compile(r"^gfx[0-9a-f]{3,4}$")
# Debian versions: [epoch:]upstream[-revision]; no whitespace or shell metacharacters possible.
_DEB_VERSION_RE = re.compile(r"^(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*$")
_EXACT_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(?:(?:a|b|rc)[0-9]+)?(?:\+[A-Za-z0-9.]+)?$")
_NOTE_MAX = 2000


@dataclass(frozen=True)
class Accelerator:
    kind: str  # "cuda" | "rocm"
    version: str  # "12.4"

    @property
    def parsed(self) -> Version:
        return Version(self.version)

    @property
    def major(self) -> int:
        return self.parsed.major

    def __str__(self) -> str:
        return f"{'CUDA' if self.kind == 'cuda' else 'ROCm'} {self.version}"


@dataclass(frozen=True)
class Compiler:
    source: str  # "base-image" | "debian" | "pypi"
    version: str | None  # exact Debian package version, exact PyPI nvcc version, or None (base image)


@dataclass(frozen=True)
class Base:
    flavor: str  # "ngc" | "cuda" | "rocm" | "debian"
    ref: str  # readable reference with tag, e.g. "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
    digest: str | None  # "sha256:..." or None when no digest can be had (then digest_note says why)
    digest_note: str | None
    suite: str | None  # Debian suite for the debian flavor ("trixie")
    runtime_ref: str | None = None  # a different (compiler-free) image for the runtime stage
    runtime_digest: str | None = None

    @property
    def pinned(self) -> bool:
        return self.digest is not None and (self.runtime_ref is None or self.runtime_digest is not None)

    @property
    def pin_state(self) -> str:
        """ "pinned" (registry digest), "local" (made here by debootstrap; its id is recorded at build)
        or "unpinned" (a registry image without a known digest)."""
        if self.flavor == "debian":
            return "local"
        return "pinned" if self.pinned else "unpinned"

    @property
    def image(self) -> str:
        """The FROM reference of the builder stage: pinned by digest when one is known."""
        return f"{self.ref}@{self.digest}" if self.digest else self.ref

    @property
    def runtime_image(self) -> str:
        if self.runtime_ref is None:
            return self.image
        return f"{self.runtime_ref}@{self.runtime_digest}" if self.runtime_digest else self.runtime_ref

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


@dataclass(frozen=True)
class EnvSpec:
    id: EnvId
    source: Path  # repo-relative path of the YAML file
    python: str
    torch: str
    cxx11_abi: bool
    accelerator: Accelerator
    compiler: Compiler
    gpu_targets: tuple[str, ...]
    backends: tuple[str, ...]
    base: Base
    publish_tags: tuple[str, ...]
    lock_exclude_newer: str  # RFC 3339 instant given to the resolver so re-locking is reproducible
    kernel_source: str = paths.KERNELS_DIR
    notes: str | None = None
    schema: int = SCHEMA_VERSION

    @property
    def torch_source(self) -> str:
        """Where torch comes from: the base image (NGC, ROCm) or PyPI wheels pinned in the lockfile."""
        return "base-image" if self.base.flavor in ("ngc", "rocm") else "pypi"

    @property
    def torch_version(self) -> Version:
        return Version(self.torch)

    @property
    def torch_series(self) -> str:
        return compat.series(self.torch)

    @property
    def host_support(self):
        """What this project's hosts can and cannot do with this env (flashkit.plan.hosts.HostSupport)."""
        from flashkit.plan import hosts

        return hosts.support(self)

    def normalized(self) -> dict[str, Any]:
        """Canonical plain-data form: what the input hash covers (not the YAML bytes, so comments
        and key order do not change an image's identity)."""
        return {
            "schema": self.schema,
            "id": str(self.id),
            "python": self.python,
            "torch": self.torch,
            "cxx11_abi": self.cxx11_abi,
            "accelerator": {"kind": self.accelerator.kind, "version": self.accelerator.version},
            "compiler": {"source": self.compiler.source, "version": self.compiler.version},
            "gpu_targets": list(self.gpu_targets),
            "backends": list(self.backends),
            "base": {
                "flavor": self.base.flavor,
                "ref": self.base.ref,
                "digest": self.base.digest,
                "suite": self.base.suite,
                "runtime_ref": self.base.runtime_ref,
                "runtime_digest": self.base.runtime_digest,
            },
            "publish_tags": list(self.publish_tags),
            "lock_exclude_newer": self.lock_exclude_newer,
            "kernel_source": self.kernel_source,
        }


# --------------------------------------------------------------------------------------------------
# Locating values in the YAML text, so that every error can name its line.


def _locate(node: yaml.Node, prefix: str, lines: dict[str, int], dups: list[tuple[str, int]]) -> None:
    lines.setdefault(prefix or "<top>", node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            path = f"{prefix}.{key}" if prefix else key
            if key in seen:
                dups.append((path, key_node.start_mark.line + 1))
            seen.add(key)
            lines[path] = key_node.start_mark.line + 1
            _locate(value_node, path, lines, dups)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _locate(item, f"{prefix}[{i}]", lines, dups)


def suggest(value: object, allowed: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for a near miss, else the empty string."""
    if not isinstance(value, str):
        return ""
    choices = list(allowed)
    lowered = {c.lower(): c for c in choices}
    if value.lower() in lowered and lowered[value.lower()] != value:
        return f" Did you mean {lowered[value.lower()]!r}?"
    match = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f" Did you mean {match[0]!r}?" if match else ""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Reader:
    """Walks one parsed YAML document, recording every problem with its location."""

    def __init__(self, display: str, lines: dict[str, int]):
        self.display = display
        self.lines = lines
        self.errors: list[str] = []

    def error(self, path: str, message: str) -> None:
        line = self.lines.get(path)
        if line is None and "." in path:
            line = self.lines.get(path.rsplit(".", 1)[0])
        where = f"{self.display}:{line}" if line else self.display
        self.errors.append(f"{where}: {path}: {message}")

    def mapping(self, data: object, path: str, allowed: dict[str, bool]) -> dict[str, Any] | None:
        """``allowed`` maps each key to whether it is required."""
        if not isinstance(data, dict):
            self.error(path, f"expected a mapping with keys {', '.join(allowed)}, got {_show(data)}")
            return None
        for key in data:
            if not isinstance(key, str) or key not in allowed:
                sub = f"{path}.{key}" if path != "<top>" else str(key)
                self.error(
                    sub,
                    f"unknown field {key!r}; allowed fields here: {', '.join(allowed)}." + suggest(key, allowed),
                )
        for key, required in allowed.items():
            if required and key not in data:
                sub = f"{path}.{key}" if path != "<top>" else key
                self.error(sub, f"missing required field {key!r}")
        return data

    def choice(self, value: object, path: str, allowed: Iterable[str]) -> str | None:
        options = tuple(allowed)
        if not isinstance(value, str) or value not in options:
            self.error(
                path,
                f"{_show(value)} is not allowed; allowed: {', '.join(options)}." + suggest(value, options),
            )
            return None
        return value

    def string(self, value: object, path: str, pattern: re.Pattern[str], what: str) -> str | None:
        if isinstance(value, float):
            # YAML reads 3.10 as the float 3.1: the version the user wrote is already lost.
            self.error(path, f'{_show(value)} was read as a number; quote it, e.g. "{value}" ({what})')
            return None
        if not isinstance(value, str) or not pattern.match(value):
            self.error(path, f"{_show(value)} is not valid: expected {what}")
            return None
        return value

    def boolean(self, value: object, path: str) -> bool | None:
        if not isinstance(value, bool):
            self.error(path, f"{_show(value)} is not valid: expected true or false")
            return None
        return value

    def string_list(self, value: object, path: str) -> list[str] | None:
        if not isinstance(value, list) or not value:
            self.error(path, f"{_show(value)} is not valid: expected a non-empty list")
            return None
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.error(f"{path}[{i}]", f"{_show(item)} is not valid: expected a quoted string")
                continue
            if item in out:
                self.error(f"{path}[{i}]", f"{item!r} is listed twice")
                continue
            out.append(item)
        return out


def check_ref(reader: _Reader, value: object, path: str) -> str | None:
    """An image reference ``repo[:port]/path:tag`` (a tag is required: it is the readable half)."""
    if not isinstance(value, str) or ":" not in value.rsplit("/", 1)[-1]:
        reader.error(
            path,
            f"{_show(value)} is not valid: expected an image reference with a tag, e.g. 'nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04' (put the digest in the digest field)",
        )
        return None
    if "@" in value:
        reader.error(path, f"{_show(value)} is not valid: put the digest in the digest field, not in the reference")
        return None
    repo, tag = value.rsplit(":", 1)
    if not _REPO_RE.match(repo):
        reader.error(
            path,
            f"{_show(value)} is not valid: repository {repo!r} must be lower-case letters, digits and separators (. _ - /)",
        )
        return None
    if not _TAG_RE.match(tag):
        reader.error(
            path,
            f"{_show(value)} is not valid: tag {tag!r} may hold only letters, digits, '_', '.', '-' (128 at most, not starting with '.' or '-')",
        )
        return None
    return value


def _safe_text(reader: _Reader, value: object, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > _NOTE_MAX:
        reader.error(path, f"expected text of at most {_NOTE_MAX} characters")
        return None
    return value.strip()


def _check_kernel_source(reader: _Reader, value: object, path: str, repo_root: Path) -> str | None:
    if not isinstance(value, str) or not value:
        reader.error(path, f"{_show(value)} is not valid: expected a repo-relative directory such as 'flash_kernels'")
        return None
    p = PurePosixPath(value)
    if p.is_absolute() or value.startswith("~") or "\\" in value:
        reader.error(path, f"{value!r} escapes the repository: use a path relative to the repository root")
        return None
    if ".." in p.parts:
        reader.error(path, f"{value!r} escapes the repository: '..' is not allowed")
        return None
    resolved = (repo_root / value).resolve()
    if not resolved.is_relative_to(repo_root.resolve()):
        reader.error(path, f"{value!r} escapes the repository (a symlink points outside it)")
        return None
    if not re.match(r"^[A-Za-z0-9_./-]+$", value):
        reader.error(path, f"{value!r} is not valid: only letters, digits, '_', '-', '.', '/' are allowed")
        return None
    return p.as_posix()


def _parse_instant(reader: _Reader, value: object, path: str) -> str | None:
    if isinstance(value, dt.datetime | dt.date) or not isinstance(value, str):
        reader.error(
            path, f'{_show(value)} is not valid: quote it as an RFC 3339 UTC instant, e.g. "2026-11-30T00:00:00Z"'
        )
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None or not value.endswith("Z"):
        reader.error(
            path, f'{value!r} is not valid: expected an RFC 3339 UTC instant ending in Z, e.g. "2026-11-30T00:00:00Z"'
        )
        return None
    return value


_TOP = {
    "schema": True,
    "python": True,
    "torch": True,
    "cxx11_abi": True,
    "accelerator": True,
    "compiler": True,
    "gpu_targets": True,
    "backends": True,
    "base": True,
    "publish_tags": True,
    "lock": True,
    "kernel_source": False,
    "notes": False,
}


def parse_spec(text: str, *, env_id: str, display: str, source: Path, repo_root: Path) -> EnvSpec:
    """Validate one spec document. ``display`` names the file in messages (repo-relative)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{display}:{mark.line + 1}:{mark.column + 1}" if mark else display
        raise SpecError(
            f"{where}: YAML syntax error: {exc.problem or exc}. Fix the YAML syntax at that position."
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{display}: YAML error: {exc}") from None
    if node is None:
        raise SpecError(
            f"{display}: the file is empty; an env spec needs the fields {', '.join(k for k, r in _TOP.items() if r)}"
        )
    lines: dict[str, int] = {}
    dups: list[tuple[str, int]] = []
    _locate(node, "", lines, dups)
    r = _Reader(display, lines)
    for path, line in dups:
        r.errors.append(f"{display}:{line}: {path}: field given twice; keep one")

    try:
        eid = EnvId.parse(env_id)
    except SpecError as exc:
        raise SpecError(f"{display}: file name: {exc}. Rename the file to <id>.yaml.") from None

    top = r.mapping(data, "<top>", _TOP)
    if top is None:
        raise SpecError("\n".join(r.errors))

    if "schema" in top and top["schema"] != SCHEMA_VERSION:
        r.error("schema", f"{_show(top['schema'])} is not supported; this flashkit reads schema {SCHEMA_VERSION}")

    python = (
        r.string(top.get("python"), "python", _PY_RE, 'a CPython version "3.X", quoted') if "python" in top else None
    )

    torch = None
    if "torch" in top:
        torch = r.string(
            top["torch"], "torch", _EXACT_VERSION_RE, 'an exact torch version such as "2.7.1" (not a range)'
        )
    cxx11 = r.boolean(top["cxx11_abi"], "cxx11_abi") if "cxx11_abi" in top else None

    accel = None
    if "accelerator" in top:
        a = r.mapping(top["accelerator"], "accelerator", {"kind": True, "version": True})
        if a is not None:
            kind = r.choice(a.get("kind"), "accelerator.kind", ACCEL_KINDS) if "kind" in a else None
            ver = (
                r.string(
                    a.get("version"), "accelerator.version", _ACCEL_VERSION_RE, 'a "major.minor" version such as "12.4"'
                )
                if "version" in a
                else None
            )
            if kind and ver:
                accel = Accelerator(kind, ver)

    compiler = None
    if "compiler" in top:
        c = r.mapping(top["compiler"], "compiler", {"source": True, "version": False})
        if c is not None:
            src = r.choice(c.get("source"), "compiler.source", COMPILER_SOURCES) if "source" in c else None
            cver = c.get("version")
            ok = True
            if src == "base-image" and cver is not None:
                r.error(
                    "compiler.version",
                    "must be null when the compiler comes from the base image (the image decides it)",
                )
                ok = False
            elif src == "debian":
                ok = (
                    r.string(
                        cver,
                        "compiler.version",
                        _DEB_VERSION_RE,
                        'the exact Debian version of nvidia-cuda-toolkit, e.g. "12.4.131~12.4.1-2"',
                    )
                    is not None
                )
            elif src == "pypi":
                ok = (
                    r.string(
                        cver,
                        "compiler.version",
                        re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$"),
                        'the exact nvidia-cuda-nvcc version, e.g. "13.0.88"',
                    )
                    is not None
                )
            if src and ok:
                compiler = Compiler(src, cver)

    targets = None
    if "gpu_targets" in top:
        targets = r.string_list(top["gpu_targets"], "gpu_targets")
        if targets is not None and accel is not None:
            good = []
            for i, t in enumerate(targets):
                path = f"gpu_targets[{i}]"
                if accel.kind == "cuda":
                    m = _CUDA_ARCH_RE.match(t)
                    if not m or m["cc"] not in compat.CUDA_ARCHS:
                        r.error(
                            path,
                            f"{t!r} is not a known CUDA compute capability; allowed: {', '.join(compat.CUDA_ARCHS)} (optionally with 'a'/'f' and/or '+PTX')."
                            + suggest(t, compat.CUDA_ARCHS),
                        )
                        continue
                else:
                    if not _GFX_RE.match(t) or t not in compat.ROCM_GFX:
                        r.error(
                            path,
                            f"{t!r} is not a known ROCm target; allowed: {', '.join(compat.ROCM_GFX)}."
                            + suggest(t, compat.ROCM_GFX),
                        )
                        continue
                good.append(t)
            targets = good if len(good) == len(targets) else None

    backends = None
    if "backends" in top:
        bl = r.string_list(top["backends"], "backends")
        if bl is not None:
            good = [b for i, b in enumerate(bl) if r.choice(b, f"backends[{i}]", BACKENDS)]
            backends = tuple(sorted(good)) if len(good) == len(bl) else None

    base = None
    if "base" in top:
        b = r.mapping(
            top["base"],
            "base",
            {
                "flavor": True,
                "ref": True,
                "digest": True,
                "digest_note": False,
                "suite": False,
                "runtime_ref": False,
                "runtime_digest": False,
            },
        )
        if b is not None:
            flavor = r.choice(b.get("flavor"), "base.flavor", FLAVORS) if "flavor" in b else None
            ref = check_ref(r, b.get("ref"), "base.ref") if "ref" in b else None
            digest = b.get("digest")
            if digest is not None and (not isinstance(digest, str) or not _DIGEST_RE.match(digest)):
                r.error(
                    "base.digest",
                    f"{_show(digest)} is not a digest: expected 'sha256:' and 64 lower-case hex digits, or null with a digest_note saying why none is pinned",
                )
                digest = "invalid"
            note = _safe_text(r, b.get("digest_note"), "base.digest_note")
            if "digest" in b and digest is None and not note:
                r.error(
                    "base.digest_note", "required when digest is null: say why no digest is pinned (never invent one)"
                )
            suite = b.get("suite")
            if flavor == "debian":
                if suite is None:
                    r.error(
                        "base.suite",
                        f"missing required field 'suite' for the debian flavor; allowed: {', '.join(compat.DEBIAN_SUITES)}",
                    )
                else:
                    suite = r.choice(suite, "base.suite", compat.DEBIAN_SUITES)
            elif suite is not None:
                r.error("base.suite", f"only the debian flavor takes a suite (flavor is {flavor!r})")
            runtime_ref = (
                check_ref(r, b["runtime_ref"], "base.runtime_ref") if b.get("runtime_ref") is not None else None
            )
            runtime_digest = b.get("runtime_digest")
            if runtime_digest is not None and (
                not isinstance(runtime_digest, str) or not _DIGEST_RE.match(runtime_digest)
            ):
                r.error(
                    "base.runtime_digest",
                    f"{_show(runtime_digest)} is not a digest: expected 'sha256:' and 64 lower-case hex digits, or null",
                )
            elif runtime_digest is not None and runtime_ref is None:
                r.error("base.runtime_digest", "given without base.runtime_ref")
            if flavor and ref and digest != "invalid" and "digest" in b:
                base = Base(flavor, ref, digest, note, suite, runtime_ref, runtime_digest)

    tags = None
    if "publish_tags" in top:
        tl = r.string_list(top["publish_tags"], "publish_tags")
        if tl is not None:
            ok = True
            for i, t in enumerate(tl):
                if not _TAG_RE.match(t):
                    bad = sorted({ch for ch in t if not re.match(r"[A-Za-z0-9_.-]", ch)})
                    why = (
                        f"contains {', '.join(repr(ch) for ch in bad)}"
                        if bad
                        else "must not start with '.' or '-' and is at most 128 characters"
                    )
                    r.error(
                        f"publish_tags[{i}]",
                        f"{t!r} is not a valid image tag: it {why}; allowed: letters, digits, '_', '.', '-' (128 at most, not starting with '.' or '-')",
                    )
                    ok = False
            tags = tuple(tl) if ok else None

    exclude_newer = None
    if "lock" in top:
        lk = r.mapping(top["lock"], "lock", {"exclude_newer": True})
        if lk is not None and "exclude_newer" in lk:
            exclude_newer = _parse_instant(r, lk["exclude_newer"], "lock.exclude_newer")

    kernel_source = paths.KERNELS_DIR
    if "kernel_source" in top:
        kernel_source = _check_kernel_source(r, top["kernel_source"], "kernel_source", repo_root)
    notes = _safe_text(r, top.get("notes"), "notes")

    # The id in the file name states accelerator and torch series; the fields must agree with it.
    if accel is not None and (accel.kind != eid.accel_kind or accel.version != eid.accel_version):
        r.error(
            "accelerator",
            f"{accel} does not match the env id {env_id!r} ({'CUDA' if eid.accel_kind == 'cuda' else 'ROCm'} {eid.accel_version}); rename the file or fix the field",
        )
    if torch is not None:
        try:
            tv = Version(torch)
            if f"{tv.major}.{tv.minor}" != eid.torch_series:
                r.error(
                    "torch",
                    f"{torch!r} does not match the env id {env_id!r} (torch {eid.torch_series}.x); rename the file or fix the field",
                )
        except InvalidVersion:
            r.error("torch", f"{torch!r} is not a version")

    if r.errors:
        raise SpecError("\n".join(r.errors))
    assert (
        python
        and torch
        and accel
        and compiler
        and targets
        and backends
        and base
        and tags
        and exclude_newer
        and kernel_source is not None
        and cxx11 is not None
    )
    return EnvSpec(
        id=eid,
        source=source,
        python=python,
        torch=torch,
        cxx11_abi=cxx11,
        accelerator=accel,
        compiler=compiler,
        gpu_targets=tuple(targets),
        backends=backends,
        base=base,
        publish_tags=tags,
        lock_exclude_newer=exclude_newer,
        kernel_source=kernel_source,
        notes=notes,
    )


def env_ids(repo_root: Path) -> list[str]:
    d = repo_root / paths.ENVS_DIR
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def load_env(repo_root: Path, env_id_str: str) -> EnvSpec:
    """Read and validate ``envs/<env_id_str>.yaml``."""
    repo_root = Path(repo_root)
    path = paths.env_file(repo_root, env_id_str)
    if not re.match(r"^[A-Za-z0-9_.-]+$", env_id_str) or not path.is_file():
        known = env_ids(repo_root)
        raise SpecError(
            f"unknown env {env_id_str!r}: no file {paths.ENVS_DIR}/{env_id_str}.yaml. "
            f"Known envs: {', '.join(known) or '(none)'}." + suggest(env_id_str, known)
        )
    display = f"{paths.ENVS_DIR}/{path.name}"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{display}: not UTF-8 text") from None
    return parse_spec(text, env_id=env_id_str, display=display, source=Path(display), repo_root=repo_root)


def load_all(repo_root: Path) -> list[EnvSpec]:
    """Every spec under envs/, sorted by id; all files' errors are reported together."""
    specs: list[EnvSpec] = []
    errors: list[str] = []
    for env_id in env_ids(Path(repo_root)):
        try:
            specs.append(load_env(repo_root, env_id))
        except SpecError as exc:
            errors.append(str(exc))
    if errors:
        raise SpecError("\n".join(errors))
    return sorted(specs, key=lambda s: str(s.id))


__all__ = [
    "Accelerator",
    "Base",
    "Compiler",
    "EnvSpec",
    "load_all",
    "load_env",
    "parse_spec",
]
