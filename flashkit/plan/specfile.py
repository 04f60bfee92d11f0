"""Reading ``envs/<id>.yaml``: the file, safely, and its validation into an :class:`~flashkit.plan.spec.EnvSpec`.

The validator collects every problem in the file and reports each with its line, field, value, what is
allowed and, for a typo, the closest valid value. Unknown fields are refused. Every value that ends up
in a Dockerfile line, an image reference, a label or a path is matched whole against a strict pattern
(no trailing newline, no control character), so a spec can never inject into a rendered Dockerfile.

YAML is read with PyYAML's safe loader, after two guards: the document is small (``MAX_SPEC_BYTES``)
and has no anchors or aliases (a handful of nested aliases expands into billions of nodes).
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from packaging.version import Version

from flashkit.core import paths
from flashkit.core.errors import SpecError
from flashkit.core.safeio import read_text
from flashkit.core.textcheck import control_characters, whole
from flashkit.plan import compat
from flashkit.plan.envid import EnvId
from flashkit.plan.spec import (
    ACCEL_KINDS,
    BACKENDS,
    COMPILER_SOURCES,
    FLAVORS,
    GPU_EVIDENCE,
    SCHEMA_VERSION,
    Accelerator,
    Base,
    Compiler,
    EnvSpec,
    default_gpu_evidence,
)

MAX_SPEC_BYTES = 64 * 1024
MAX_DEPTH = 8

# Docker's grammar for a tag, and a conservative one for a repository path (registry host allowed).
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_REPO_RE = re.compile(
    r"(?:[a-z0-9]+(?:[.-][a-z0-9]+)*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_PY_RE = re.compile(r"3\.(?:[0-9]|1[0-9])")
_ACCEL_VERSION_RE = re.compile(r"[1-9][0-9]?\.[0-9]")
_CUDA_ARCH_RE = re.compile(r"(?P<cc>[0-9]{1,2}\.[0-9])(?P<suffix>[af])?(?P<ptx>\+PTX)?")
_GFX_RE = re.compile(r"gfx[0-9a-f]{3,4}")
# Debian versions: [epoch:]upstream[-revision]; no whitespace or shell metacharacters possible.
_DEB_VERSION_RE = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*")
_EXACT_VERSION_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:(?:a|b|rc)[0-9]+)?(?:\+[A-Za-z0-9.]+)?")
_PYPI_NVCC_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
_KERNEL_SOURCE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")
_NOTE_MAX = 2000

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
    "wheel_from": False,
    "gpu_evidence": False,
}
_BASE = {
    "flavor": True,
    "ref": True,
    "digest": True,
    "digest_note": False,
    "suite": False,
    "runtime_ref": False,
    "runtime_digest": False,
}


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


# --------------------------------------------------------------------------------------------------
# Reading the YAML safely, and locating values in it so every error can name its line.


_TAG_PREFIX = "tag:yaml.org,2002:"


class _Where:
    """The field the YAML event stream is at (``base.ref``, ``gpu_targets[1]``), to name it in errors that
    come before there is a node tree to walk."""

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []  # [kind, key or index, whether the next node is a key]

    def path(self) -> str:
        out = ""
        for kind, at, _ in self.stack:
            if kind == "map" and at is not None:
                out = f"{out}.{at}" if out else str(at)
            elif kind == "seq":
                out += f"[{at}]"
        return out or "<top>"

    def is_key(self) -> bool:
        return bool(self.stack) and self.stack[-1][0] == "map" and self.stack[-1][2]

    def done(self, event: yaml.Event) -> None:
        """A node ended (a scalar, or a collection's end event)."""
        if not self.stack:
            return
        top = self.stack[-1]
        if top[0] == "seq":
            top[1] += 1
        elif top[2]:
            top[1] = event.value if isinstance(event, yaml.ScalarEvent) else None
            top[2] = False
        else:
            top[2] = True


def _events(text: str, display: str) -> None:
    """Refuse what the safe loader would choke on or an env spec has no use for, naming line and field:
    anchors and aliases, explicit tags, keys that are not plain names, merge keys, and nesting deeper than
    any field (checked on the event stream, before composing, which recurses once per level)."""
    where = _Where()
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise SpecError(
                f"{display}:{line}: YAML anchors and aliases (&name, *name) are not allowed in env specs",
                hint="write the value out; a spec must read the same to a person and to flashkit",
            )
        if isinstance(event, yaml.CollectionEndEvent):
            where.stack.pop()
            where.done(event)
            continue
        if not isinstance(event, yaml.NodeEvent):
            continue
        key, field = where.is_key(), where.path()
        if event.tag is not None:
            shown = event.tag.replace(_TAG_PREFIX, "!!")
            raise SpecError(
                f"{display}:{line}: {field}: the YAML tag {shown!r}{' on a key' if key else ''} is not allowed "
                "in env specs; "
                "allowed: plain values (text, numbers, true/false, null, lists, mappings)",
                hint="remove the tag; quote the value to keep it as text",
            )
        if key and not isinstance(event, yaml.ScalarEvent):
            raise SpecError(
                f"{display}:{line}: {field}: a key must be a plain field name, not a list or mapping; "
                "allowed: the field names of the spec, e.g. 'torch'",
            )
        if key and event.value == "<<" and event.style is None:
            raise SpecError(
                f"{display}:{line}: {field}: the YAML merge key '<<' is not allowed in env specs; write the fields out"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            if len(where.stack) > MAX_DEPTH:
                raise SpecError(
                    f"{display}:{line}: {where.path()}: nested deeper than {MAX_DEPTH} levels; no spec field is "
                    "(the deepest, e.g. base.ref, is two)"
                )
            where.stack.append(["map" if isinstance(event, yaml.MappingStartEvent) else "seq", 0, True])
            if isinstance(event, yaml.MappingStartEvent):
                where.stack[-1][1] = None
        else:
            where.done(event)


def _compose(text: str, display: str) -> yaml.Node | None:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(f"{display}: the spec is larger than {MAX_SPEC_BYTES // 1024} KiB; an env spec is a page")
    try:
        _events(text, display)
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{display}:{mark.line + 1}:{mark.column + 1}" if mark else display
        raise SpecError(
            f"{where}: YAML syntax error: {exc.problem or exc}. Fix the YAML syntax at that position."
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{display}: YAML error: {exc}") from None


def _construct(node: yaml.Node, display: str, lines: dict[str, int]) -> Any:
    """The document's values. Only implicit scalars are left by now; one that matches a type's pattern but
    is not a value of it (``2026-13-01``, a date with month 13) is an error on its field."""
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    except (yaml.YAMLError, ValueError, OverflowError) as exc:
        bad = _first_bad_scalar(node, "", loader)
        path, scalar = bad if bad else ("<top>", node)
        line = lines.get(path, scalar.start_mark.line + 1)
        kind = scalar.tag.replace(_TAG_PREFIX, "") if isinstance(scalar, yaml.ScalarNode) else "value"
        raise SpecError(
            f"{display}:{line}: {path}: {_show(getattr(scalar, 'value', ''))} reads as a {kind} but is not "
            f"a valid one ({str(exc).splitlines()[0]}); quote it to keep it as text",
        ) from None


def _first_bad_scalar(node: yaml.Node, prefix: str, loader: yaml.SafeLoader) -> tuple[str, yaml.Node] | None:
    if isinstance(node, yaml.ScalarNode):
        try:
            loader.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError):
            return prefix or "<top>", node
        return None
    items = node.value if isinstance(node, yaml.MappingNode) else enumerate(node.value)
    for key, value in items:
        path = f"{prefix}[{key}]" if isinstance(key, int) else (f"{prefix}.{key.value}" if prefix else key.value)
        found = None if isinstance(key, int) else _first_bad_scalar(key, f"{path} (the key)", loader)
        found = found or _first_bad_scalar(value, path, loader)
        if found:
            return found
    return None


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
                    sub, f"unknown field {key!r}; allowed fields here: {', '.join(allowed)}." + suggest(key, allowed)
                )
        for key, required in allowed.items():
            if required and key not in data:
                self.error(f"{path}.{key}" if path != "<top>" else key, f"missing required field {key!r}")
        return data

    def choice(self, value: object, path: str, allowed: Iterable[str]) -> str | None:
        options = tuple(allowed)
        if not isinstance(value, str) or value not in options:
            self.error(path, f"{_show(value)} is not allowed; allowed: {', '.join(options)}." + suggest(value, options))
            return None
        return value

    def string(self, value: object, path: str, pattern: re.Pattern[str], what: str) -> str | None:
        if isinstance(value, float):
            # YAML reads 3.10 as the float 3.1: the version the user wrote is already lost.
            self.error(path, f'{_show(value)} was read as a number; quote it, e.g. "{value}" ({what})')
            return None
        if isinstance(value, str) and control_characters(value):
            bad = ", ".join(control_characters(value))
            self.error(path, f"{_show(value)} contains control characters ({bad}); expected {what}")
            return None
        if not whole(pattern, value):
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
            elif item in out:
                self.error(f"{path}[{i}]", f"{item!r} is listed twice")
            else:
                out.append(item)
        return out

    def free_text(self, value: object, path: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or len(value) > _NOTE_MAX:
            self.error(path, f"expected text of at most {_NOTE_MAX} characters")
            return None
        bad = control_characters(value, free_text=True)
        if bad:
            self.error(path, f"contains control characters ({', '.join(bad)}); only text, newlines and tabs")
            return None
        return value.strip()


# --------------------------------------------------------------------------------------------------
# One function per section of the spec.


def check_ref(r: _Reader, value: object, path: str) -> str | None:
    """An image reference ``repo[:port]/path:tag`` (a tag is required: it is the readable half)."""
    if not isinstance(value, str) or ":" not in value.rsplit("/", 1)[-1]:
        r.error(
            path,
            f"{_show(value)} is not valid: expected an image reference with a tag, e.g. "
            "'nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04' (put the digest in the digest field)",
        )
        return None
    if control_characters(value):
        r.error(path, f"{_show(value)} contains control characters ({', '.join(control_characters(value))})")
        return None
    if "@" in value:
        r.error(path, f"{_show(value)} is not valid: put the digest in the digest field, not in the reference")
        return None
    repo, tag = value.rsplit(":", 1)
    if not whole(_REPO_RE, repo):
        r.error(
            path,
            f"{_show(value)} is not valid: repository {repo!r} must be lower-case letters, digits and separators (. _ - /)",
        )
        return None
    if not whole(TAG_RE, tag):
        r.error(
            path,
            f"{_show(value)} is not valid: tag {tag!r} may hold only letters, digits, '_', '.', '-' "
            "(128 at most, not starting with '.' or '-')",
        )
        return None
    return value


def _digest(r: _Reader, value: object, path: str) -> str | None:
    """A ``sha256:<64 hex>`` digest or None; ``"invalid"`` marks one that was given but is wrong."""
    if value is None:
        return None
    if not whole(DIGEST_RE, value):
        r.error(
            path,
            f"{_show(value)} is not a digest: expected 'sha256:' and 64 lower-case hex digits, "
            "or null with a digest_note saying why none is pinned",
        )
        return "invalid"
    return value


def _accelerator(r: _Reader, raw: object) -> Accelerator | None:
    a = r.mapping(raw, "accelerator", {"kind": True, "version": True})
    if a is None:
        return None
    kind = r.choice(a.get("kind"), "accelerator.kind", ACCEL_KINDS) if "kind" in a else None
    ver = None
    if "version" in a:
        ver = r.string(a["version"], "accelerator.version", _ACCEL_VERSION_RE, 'a "major.minor" version such as "12.4"')
    return Accelerator(kind, ver) if kind and ver else None


def _compiler(r: _Reader, raw: object) -> Compiler | None:
    c = r.mapping(raw, "compiler", {"source": True, "version": False})
    if c is None:
        return None
    src = r.choice(c.get("source"), "compiler.source", COMPILER_SOURCES) if "source" in c else None
    version = c.get("version")
    if src == "base-image":
        if version is not None:
            r.error(
                "compiler.version", "must be null when the compiler comes from the base image (the image decides it)"
            )
            return None
    elif src == "debian":
        version = r.string(
            version,
            "compiler.version",
            _DEB_VERSION_RE,
            'the exact Debian version of nvidia-cuda-toolkit, e.g. "12.4.131~12.4.1-2"',
        )
    elif src == "pypi":
        version = r.string(
            version, "compiler.version", _PYPI_NVCC_RE, 'the exact nvidia-cuda-nvcc version, e.g. "13.0.88"'
        )
    if src is None or (src != "base-image" and version is None):
        return None
    return Compiler(src, version)


def _gpu_targets(r: _Reader, raw: object, accel: Accelerator | None) -> tuple[str, ...] | None:
    targets = r.string_list(raw, "gpu_targets")
    if targets is None or accel is None:
        return None
    good = []
    for i, t in enumerate(targets):
        path = f"gpu_targets[{i}]"
        if accel.kind == "cuda":
            m = _CUDA_ARCH_RE.fullmatch(t)
            if not m or m["cc"] not in compat.CUDA_ARCHS:
                r.error(
                    path,
                    f"{_show(t)} is not a known CUDA compute capability; allowed: {', '.join(compat.CUDA_ARCHS)} "
                    "(optionally with 'a'/'f' and/or '+PTX')." + suggest(t, compat.CUDA_ARCHS),
                )
                continue
        elif not whole(_GFX_RE, t) or t not in compat.ROCM_GFX:
            r.error(
                path,
                f"{_show(t)} is not a known ROCm target; allowed: {', '.join(compat.ROCM_GFX)}."
                + suggest(t, compat.ROCM_GFX),
            )
            continue
        good.append(t)
    return tuple(good) if len(good) == len(targets) else None


def _backends(r: _Reader, raw: object) -> tuple[str, ...] | None:
    listed = r.string_list(raw, "backends")
    if listed is None:
        return None
    good = [b for i, b in enumerate(listed) if r.choice(b, f"backends[{i}]", BACKENDS)]
    return tuple(sorted(good)) if len(good) == len(listed) else None


def _suite(r: _Reader, b: dict[str, Any], flavor: str | None) -> str | None:
    suite = b.get("suite")
    if flavor == "debian":
        if suite is None:
            r.error(
                "base.suite",
                f"missing required field 'suite' for the debian flavor; allowed: {', '.join(compat.DEBIAN_SUITES)}",
            )
            return None
        return r.choice(suite, "base.suite", compat.DEBIAN_SUITES)
    if suite is not None:
        r.error("base.suite", f"only the debian flavor takes a suite (flavor is {flavor!r})")
    return None


def _base(r: _Reader, raw: object) -> Base | None:
    b = r.mapping(raw, "base", _BASE)
    if b is None:
        return None
    flavor = r.choice(b.get("flavor"), "base.flavor", FLAVORS) if "flavor" in b else None
    ref = check_ref(r, b.get("ref"), "base.ref") if "ref" in b else None
    digest = _digest(r, b.get("digest"), "base.digest")
    note = r.free_text(b.get("digest_note"), "base.digest_note")
    if "digest" in b and digest is None and not note:
        r.error("base.digest_note", "required when digest is null: say why no digest is pinned (never invent one)")
    suite = _suite(r, b, flavor)
    runtime_ref = check_ref(r, b["runtime_ref"], "base.runtime_ref") if b.get("runtime_ref") is not None else None
    runtime_digest = _digest(r, b.get("runtime_digest"), "base.runtime_digest")
    if runtime_digest not in (None, "invalid") and runtime_ref is None:
        r.error("base.runtime_digest", "given without base.runtime_ref")
    if not (flavor and ref and "digest" in b) or "invalid" in (digest, runtime_digest):
        return None
    return Base(flavor, ref, digest, note, suite, runtime_ref, runtime_digest)


def _publish_tags(r: _Reader, raw: object) -> tuple[str, ...] | None:
    listed = r.string_list(raw, "publish_tags")
    if listed is None:
        return None
    ok = True
    for i, t in enumerate(listed):
        if whole(TAG_RE, t):
            continue
        bad = sorted({ch for ch in t if not re.fullmatch(r"[A-Za-z0-9_.-]", ch)})
        why = (
            f"contains {', '.join(repr(ch) for ch in bad)}"
            if bad
            else "must not start with '.' or '-' and is at most 128 characters"
        )
        r.error(
            f"publish_tags[{i}]",
            f"{t!r} is not a valid image tag: it {why}; allowed: letters, digits, '_', '.', '-' "
            "(128 at most, not starting with '.' or '-')",
        )
        ok = False
    return tuple(listed) if ok else None


def _instant(r: _Reader, raw: object) -> str | None:
    lk = r.mapping(raw, "lock", {"exclude_newer": True})
    if lk is None or "exclude_newer" not in lk:
        return None
    value, path = lk["exclude_newer"], "lock.exclude_newer"
    if isinstance(value, dt.datetime | dt.date) or not isinstance(value, str):
        r.error(path, f'{_show(value)} is not valid: quote it as an RFC 3339 UTC instant, e.g. "2026-11-30T00:00:00Z"')
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None or not whole(re.compile(r"[0-9T:.+-]+Z"), value):
        r.error(
            path,
            f'{_show(value)} is not valid: expected an RFC 3339 UTC instant ending in Z, e.g. "2026-11-30T00:00:00Z"',
        )
        return None
    return value


def _kernel_source(r: _Reader, value: object, repo_root: Path) -> str | None:
    """A package folder of the repository: relative, inside it, holding pyproject.toml or setup.py."""
    path = "kernel_source"
    if not isinstance(value, str) or not value:
        r.error(path, f"{_show(value)} is not valid: expected a repo-relative package folder such as 'flash_kernels'")
        return None
    p = PurePosixPath(value)
    if p.is_absolute() or value.startswith("~") or "\\" in value or ".." in p.parts:
        r.error(path, f"{value!r} escapes the repository: use a relative path without '..'")
        return None
    if not whole(_KERNEL_SOURCE_RE, value):
        r.error(
            path, f"{_show(value)} is not valid: letters, digits, '_', '-', '.' and '/' only, no empty or hidden parts"
        )
        return None
    folder = repo_root / value
    if folder.is_symlink() or not folder.resolve().is_relative_to(repo_root.resolve()):
        r.error(path, f"{value!r} is a symlink or leads outside the repository; name the folder itself")
        return None
    if not any((folder / m).is_file() for m in ("pyproject.toml", "setup.py")):
        r.error(
            path,
            f"{value!r} is not a Python package folder (no pyproject.toml or setup.py in it); the build "
            "context holds exactly this folder, so it must be the kernel package, not a parent of it",
        )
        return None
    return p.as_posix()


def _wheel_from(r: _Reader, value: object, env_id: str) -> str | None:
    """Another env's id (its file must exist; what it must be is checked with both specs in hand)."""
    if not isinstance(value, str):
        r.error("wheel_from", f"{_show(value)} is not valid: expected the id of another env, e.g. 'cu130-torch211'")
        return None
    try:
        EnvId.parse(value)
    except SpecError as exc:
        r.error("wheel_from", f"{exc}")
        return None
    if value == env_id:
        r.error("wheel_from", "names this env itself; leave it out to build this env's own wheel")
        return None
    return value


def _gpu_evidence(r: _Reader, value: object, wheel_from: str | None) -> tuple[str, ...] | None:
    """Which GPU evidence the env's gate accepts (``own``, ``wheel-from``, ``device-code``); see EnvSpec."""
    items = r.string_list(value, "gpu_evidence")
    if items is None:
        return None
    out = []
    for i, item in enumerate(items):
        if r.choice(item, f"gpu_evidence[{i}]", GPU_EVIDENCE) is not None:
            out.append(item)
    if "wheel-from" in out and wheel_from is None:
        r.error("gpu_evidence", "'wheel-from' needs wheel_from: this env builds its own wheel")
    return tuple(out)


def _agrees_with_id(r: _Reader, eid: EnvId, env_id: str, accel: Accelerator | None, torch: str | None) -> None:
    """The id in the file name states accelerator and torch series; the fields must agree with it."""
    if accel is not None and (accel.kind != eid.accel_kind or accel.version != eid.accel_version):
        kind = "CUDA" if eid.accel_kind == "cuda" else "ROCm"
        r.error(
            "accelerator",
            f"{accel} does not match the env id {env_id!r} ({kind} {eid.accel_version}); rename the file or fix the field",
        )
    if torch is not None:
        try:
            tv = Version(torch)
        except ValueError:  # InvalidVersion, or a number past Python's 4300-digit conversion limit
            r.error("torch", f"{torch[:40]!r} is not a version")
            return
        if f"{tv.major}.{tv.minor}" != eid.torch_series:
            r.error(
                "torch",
                f"{torch!r} does not match the env id {env_id!r} (torch {eid.torch_series}.x); rename the file or fix the field",
            )


def parse_spec(text: str, *, env_id: str, display: str, source: Path, repo_root: Path) -> EnvSpec:
    """Validate one spec document. ``display`` names the file in messages (repo-relative)."""
    node = _compose(text, display)
    if node is None:
        required = ", ".join(k for k, req in _TOP.items() if req)
        raise SpecError(f"{display}: the file is empty; an env spec needs the fields {required}")
    lines: dict[str, int] = {}
    dups: list[tuple[str, int]] = []
    _locate(node, "", lines, dups)
    data = _construct(node, display, lines)
    r = _Reader(display, lines)
    r.errors += [f"{display}:{line}: {path}: field given twice; keep one" for path, line in dups]
    try:
        eid = EnvId.parse(env_id)
    except SpecError as exc:
        raise SpecError(f"{display}: file name: {exc}. Rename the file to <id>.yaml.") from None
    top = r.mapping(data, "<top>", _TOP)
    if top is None:
        raise SpecError("\n".join(r.errors))
    if "schema" in top and top["schema"] != SCHEMA_VERSION:
        r.error("schema", f"{_show(top['schema'])} is not supported; this flashkit reads schema {SCHEMA_VERSION}")
    python = r.string(top["python"], "python", _PY_RE, 'a CPython version "3.X", quoted') if "python" in top else None
    torch = None
    if "torch" in top:
        torch = r.string(
            top["torch"], "torch", _EXACT_VERSION_RE, 'an exact torch version such as "2.7.1" (not a range)'
        )
    cxx11 = r.boolean(top["cxx11_abi"], "cxx11_abi") if "cxx11_abi" in top else None
    accel = _accelerator(r, top["accelerator"]) if "accelerator" in top else None
    compiler = _compiler(r, top["compiler"]) if "compiler" in top else None
    targets = _gpu_targets(r, top["gpu_targets"], accel) if "gpu_targets" in top else None
    backends = _backends(r, top["backends"]) if "backends" in top else None
    base = _base(r, top["base"]) if "base" in top else None
    tags = _publish_tags(r, top["publish_tags"]) if "publish_tags" in top else None
    exclude_newer = _instant(r, top["lock"]) if "lock" in top else None
    kernel_source = _kernel_source(r, top["kernel_source"], repo_root) if "kernel_source" in top else paths.KERNELS_DIR
    notes = r.free_text(top.get("notes"), "notes")
    wheel_from = _wheel_from(r, top["wheel_from"], env_id) if "wheel_from" in top else None
    evidence = _gpu_evidence(r, top["gpu_evidence"], wheel_from) if "gpu_evidence" in top else None
    _agrees_with_id(r, eid, env_id, accel, torch)
    values = (python, torch, cxx11, accel, compiler, targets, backends, base, tags, exclude_newer, kernel_source)
    if r.errors or any(v is None for v in values):
        raise SpecError("\n".join(r.errors) or f"{display}: the spec is incomplete")
    return EnvSpec(
        id=eid,
        source=source,
        python=python,
        torch=torch,
        cxx11_abi=cxx11,
        accelerator=accel,
        compiler=compiler,
        gpu_targets=targets,
        backends=backends,
        base=base,
        publish_tags=tags,
        lock_exclude_newer=exclude_newer,
        kernel_source=kernel_source,
        notes=notes,
        wheel_from=wheel_from,
        gpu_evidence=evidence or default_gpu_evidence(wheel_from),
    )


# --------------------------------------------------------------------------------------------------
# Loading: the edge that reads envs/<id>.yaml (through core.safeio) and hands the text to the validator.


def env_ids(repo_root: Path) -> list[str]:
    d = repo_root / paths.ENVS_DIR
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def load_env(repo_root: Path, env_id_str: str) -> EnvSpec:
    """Read and validate ``envs/<env_id_str>.yaml``."""
    repo_root = Path(repo_root)
    known = env_ids(repo_root)
    if env_id_str not in known:
        try:
            EnvId.parse(env_id_str)
        except SpecError as exc:
            raise SpecError(
                f"{exc}. Known envs: {', '.join(known) or '(none)'}." + suggest(env_id_str, known)
            ) from None
        raise SpecError(
            f"unknown env {env_id_str!r}: no file {paths.ENVS_DIR}/{env_id_str}.yaml. "
            f"Known envs: {', '.join(known) or '(none)'}." + suggest(env_id_str, known)
        )
    path = paths.env_file(repo_root, env_id_str)
    display = f"{paths.ENVS_DIR}/{path.name}"
    text = read_text(path, what="env spec", error=SpecError, max_bytes=MAX_SPEC_BYTES, root=repo_root)
    return parse_spec(text, env_id=env_id_str, display=display, source=Path(display), repo_root=repo_root)


def load_each(repo_root: Path) -> tuple[list[EnvSpec], dict[str, SpecError]]:
    """Every valid spec under envs/, sorted by id, and the error of each file that is not (by its name):
    for the commands that report on all envs, where one broken file must not hide the others."""
    specs: list[EnvSpec] = []
    broken: dict[str, SpecError] = {}
    for env_id in env_ids(Path(repo_root)):
        try:
            specs.append(load_env(repo_root, env_id))
        except SpecError as exc:
            broken[env_id] = exc
    return sorted(specs, key=lambda s: str(s.id)), broken


def load_all(repo_root: Path) -> list[EnvSpec]:
    """Every spec under envs/, sorted by id; all files' errors are reported together."""
    specs, broken = load_each(repo_root)
    if broken:
        raise broken_specs(broken)
    return specs


def broken_specs(broken: dict[str, SpecError]) -> SpecError:
    """One error naming every broken spec, each with its own messages (exit 3)."""
    return SpecError("\n".join(str(exc) for exc in broken.values()))
