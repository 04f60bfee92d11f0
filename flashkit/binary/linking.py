"""Resolving an extension's dynamic dependencies the way the loader would, inside a filesystem root.

``resolve`` follows DT_NEEDED through RUNPATH/RPATH, ``$ORIGIN``, ``ld.so.conf`` and the default
directories, then checks every undefined symbol and symbol version against what is in scope (the
preloaded objects first: what ``import torch`` put in the process), naming near misses such as a
definition that differs only in the C++11 string ABI.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from collections.abc import Sequence

from flashkit.binary.elf import (
    ElfObject,
    ElfReadError,
    _abi_neutral,
    demangle,
    demangler_available,
    host_path,
    qualified_name,
    read_object,
)

# ---------------------------------------------------------------------------
# Resolving undefined symbols against providers


@dataclasses.dataclass(frozen=True)
class LibrarySearch:
    """Where DT_NEEDED names are looked for, like the loader (paths inside ``root``).

    ``extra_dirs`` are searched like LD_LIBRARY_PATH. ``preloaded`` objects are
    already in the process (the interpreter, torch's libraries): their SONAME
    satisfies a DT_NEEDED and their symbols are in scope. ``system_dirs`` None
    means ``ld.so.conf`` of the root plus the standard directories.
    """

    root: str = "/"
    extra_dirs: tuple[str, ...] = ()
    preloaded: tuple[str, ...] = ()
    system_dirs: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class MissingLibrary:
    name: str
    needed_by: str
    searched: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class MissingVersion:
    """A version the module requires from a library that the found library does not define."""

    library: str
    version: str
    provider: str
    available: tuple[str, ...]  # versions with the same prefix the provider does define


@dataclasses.dataclass(frozen=True)
class NearMiss:
    """A definition in scope with the same qualified name but another signature or ABI."""

    symbol: str
    demangled: str
    version: str | None
    provider: str
    abi_only: bool  # identical once the libstdc++ dual-ABI markers are erased


@dataclasses.dataclass(frozen=True)
class UnresolvedSymbol:
    name: str
    demangled: str
    version: str | None
    version_file: str | None
    kind: str
    near_misses: tuple[NearMiss, ...]


@dataclasses.dataclass(frozen=True)
class Resolution:
    """The outcome of loading one module against a library search set."""

    module: str
    loaded: tuple[tuple[str, str], ...]  # (DT_NEEDED name, path found) in load order
    missing_libraries: tuple[MissingLibrary, ...]
    missing_versions: tuple[MissingVersion, ...]
    unresolved: tuple[UnresolvedSymbol, ...]
    unreadable: tuple[tuple[str, str], ...]  # (path, reason) of libraries that could not be read
    demangler: bool

    @property
    def ok(self) -> bool:
        return not (self.missing_libraries or self.missing_versions or self.unresolved or self.unreadable)


class ObjectCache:
    """Read each object once across many resolutions (torch's libraries are large)."""

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self._objects: dict[str, ElfObject | ElfReadError] = {}

    def get(self, path: str) -> ElfObject:
        key = os.path.normpath(path)
        if key not in self._objects:
            try:
                self._objects[key] = read_object(key, self.root)
            except ElfReadError as exc:
                self._objects[key] = exc
        found = self._objects[key]
        if isinstance(found, ElfReadError):
            raise found
        return found


_DEFAULT_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)


def system_library_dirs(root: str = "/") -> tuple[str, ...]:
    """Directories from the root's ``/etc/ld.so.conf`` (with includes) and the defaults."""
    dirs: list[str] = []
    seen_files: set[str] = set()

    def read_conf(conf: str) -> None:
        hconf = host_path(root, conf)
        if hconf in seen_files or not os.path.isfile(hconf):
            return
        seen_files.add(hconf)
        try:
            with open(hconf, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return
        for raw in lines:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include"):
                pattern = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
                if not pattern.startswith("/"):
                    pattern = os.path.join(os.path.dirname(conf), pattern)
                hits = glob.glob(os.path.join(root, pattern.lstrip("/")))
                for hit in sorted(hits):
                    read_conf("/" + os.path.relpath(hit, root) if root not in ("", "/") else hit)
            elif line.startswith("/"):
                dirs.append(line)

    read_conf("/etc/ld.so.conf")
    for d in _DEFAULT_DIRS:
        if d not in dirs:
            dirs.append(d)
    return tuple(dirs)


def _expand_origin(entry: str, obj_path: str) -> str:
    origin = os.path.dirname(obj_path)
    return entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)


def _exists(root: str, path: str) -> bool:
    try:
        return os.path.isfile(host_path(root, path))
    except ElfReadError:
        return False


def resolve(module: str, search: LibrarySearch, cache: ObjectCache | None = None) -> Resolution:
    """Load ``module`` like the dynamic loader would and report what does not resolve.

    DT_NEEDED names are satisfied by a preloaded object's SONAME first, then
    looked up in the object's RPATH (when it has no RUNPATH), ``extra_dirs``,
    its RUNPATH, then the system directories, breadth first. A candidate of
    another ELF class or machine is skipped, as the loader does. The module's
    undefined, non-weak symbols must then be defined, with the version they
    ask for, by some object in scope (its dependency closure and the preloaded
    objects); each one that is not comes back with near misses from scope.
    """
    cache = cache or ObjectCache(search.root)
    mod = cache.get(module)
    unreadable: list[tuple[str, str]] = []
    preloaded, by_name = _preload(search, cache, unreadable)
    closure, loaded, missing_libs = _load_closure(mod, search, cache, by_name, unreadable)
    scope = closure[1:] + [p for p in preloaded if all(p is not c for c in closure)]
    have_demangler = demangler_available()
    return Resolution(
        module=module,
        loaded=tuple(loaded),
        missing_libraries=tuple(missing_libs),
        missing_versions=_missing_versions(mod, by_name),
        unresolved=_unresolved(mod, scope),
        unreadable=tuple(unreadable),
        demangler=have_demangler,
    )


def _preload(
    search: LibrarySearch, cache: ObjectCache, unreadable: list[tuple[str, str]]
) -> tuple[list[ElfObject], dict[str, ElfObject]]:
    """The preloaded objects that can be read, and each by its SONAME (else file name), first one winning."""
    by_name: dict[str, ElfObject] = {}
    preloaded: list[ElfObject] = []
    for p in search.preloaded:
        try:
            obj = cache.get(p)
        except ElfReadError as exc:
            unreadable.append((p, exc.reason))
            continue
        preloaded.append(obj)
        by_name.setdefault(obj.soname or os.path.basename(p), obj)
    return preloaded, by_name


def _load_closure(
    mod: ElfObject,
    search: LibrarySearch,
    cache: ObjectCache,
    by_name: dict[str, ElfObject],
    unreadable: list[tuple[str, str]],
) -> tuple[list[ElfObject], list[tuple[str, str]], list[MissingLibrary]]:
    """Follow DT_NEEDED breadth first from ``mod``: (closure, (name, path) loaded, missing libraries).

    ``by_name`` gains each library found, under its DT_NEEDED name and SONAME;
    ``unreadable`` the candidates skipped for a missing library.
    """
    system_dirs = search.system_dirs if search.system_dirs is not None else system_library_dirs(search.root)
    loaded: list[tuple[str, str]] = []
    missing_libs: list[MissingLibrary] = []
    closure: list[ElfObject] = [mod]
    queue = [mod]
    while queue:
        obj = queue.pop(0)
        for name in obj.needed:
            if name in by_name:
                found = by_name[name]
                if all(found is not c for c in closure):
                    closure.append(found)
                    queue.append(found)
                continue
            dirs = _search_dirs(obj, search, system_dirs)
            hit, skipped = _find_library(name, dirs, mod, search.root, cache)
            if hit is None:
                unreadable.extend(skipped)
                missing_libs.append(MissingLibrary(name, obj.path, tuple(dict.fromkeys(dirs))))
                continue
            by_name[name] = hit
            if hit.soname:
                by_name.setdefault(hit.soname, hit)
            loaded.append((name, hit.path))
            closure.append(hit)
            queue.append(hit)
    return closure, loaded, missing_libs


def _search_dirs(obj: ElfObject, search: LibrarySearch, system_dirs: Sequence[str]) -> list[str]:
    """The directories the loader searches for ``obj``'s DT_NEEDED names, in its order."""
    return (
        ([_expand_origin(d, obj.path) for d in obj.rpath] if not obj.runpath else [])
        + list(search.extra_dirs)
        + [_expand_origin(d, obj.path) for d in obj.runpath]
        + list(system_dirs)
    )


def _find_library(
    name: str, dirs: Sequence[str], mod: ElfObject, root: str, cache: ObjectCache
) -> tuple[ElfObject | None, list[tuple[str, str]]]:
    """The first readable ``name`` in ``dirs`` of ``mod``'s class and machine, and the (path, reason) skipped."""
    candidates = [name] if "/" in name else [os.path.join(d, name) for d in dirs]
    skipped: list[tuple[str, str]] = []
    for cand in candidates:
        if not _exists(root, cand):
            continue
        try:
            lib = cache.get(cand)
        except ElfReadError as exc:
            skipped.append((cand, exc.reason))  # the loader skips it too and searches on
            continue
        if lib.elf_class != mod.elf_class or lib.machine != mod.machine:
            continue
        return lib, skipped
    return None, skipped


def _missing_versions(mod: ElfObject, by_name: dict[str, ElfObject]) -> tuple[MissingVersion, ...]:
    """The symbol versions ``mod`` requires that the library found for them does not define."""
    missing_versions: list[MissingVersion] = []
    for lib_name, versions in mod.version_needs.items():
        provider = by_name.get(lib_name)
        if provider is None:
            continue  # reported as a missing library
        for v in versions:
            if provider.version_defs and v not in provider.version_defs:
                prefix = re.sub(r"[\d.]+$", "", v)
                same = tuple(d for d in provider.version_defs if d.startswith(prefix) and d != prefix)
                missing_versions.append(MissingVersion(lib_name, v, provider.path, same))
    return tuple(missing_versions)


def _unresolved(mod: ElfObject, scope: Sequence[ElfObject]) -> tuple[UnresolvedSymbol, ...]:
    """``mod``'s undefined, non-weak symbols that nothing in ``scope`` defines, with their near misses."""
    missing = [s for s in mod.undefined if not s.weak and not any(o.defines(s.name, s.version) for o in scope)]
    demangled = demangle(s.name for s in missing)
    return tuple(
        UnresolvedSymbol(
            name=s.name,
            demangled=demangled[s.name],
            version=s.version,
            version_file=s.version_file,
            kind=s.kind,
            near_misses=_near_misses(demangled[s.name], s.name, scope),
        )
        for s in missing
    )


_SOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


def _near_misses(demangled: str, mangled: str, scope: Sequence[ElfObject]) -> tuple[NearMiss, ...]:
    if not mangled.startswith("_Z") or demangled == mangled:
        return ()
    qual = qualified_name(demangled)
    last = _SOURCE_NAME.search(qual)
    if not last:
        return ()
    # a mangled name spells each identifier as <length><identifier>
    needle = f"{len(last.group(0))}{last.group(0)}"
    found: list[tuple[str, str | None, str]] = []
    for obj in scope:
        for name, entries in obj.defined.items():
            if needle in name and name != mangled:
                found.extend((name, v, obj.path) for v, _ in entries)
    if not found:
        return ()
    names = demangle(n for n, _, _ in found)
    neutral = _abi_neutral(demangled)
    out = []
    for name, version, provider in found:
        d = names[name]
        if qualified_name(d) != qual and _abi_neutral(qualified_name(d)) != _abi_neutral(qual):
            continue
        out.append(NearMiss(name, d, version, provider, abi_only=_abi_neutral(d) == neutral))
    return tuple(dict.fromkeys(out))
