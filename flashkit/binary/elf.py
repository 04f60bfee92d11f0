"""Read what the dynamic loader will need from ELF shared objects, and check it.

Facts, not verdicts: this module says which symbols, versions, libraries and
CUDA architectures an object needs or carries, and which of those a set of
providers does not satisfy. Naming the likely cause and the fix is
:mod:`flashkit.doctor.report`'s job; the ``abi``/``build`` verification tiers reuse
the same facts.

Every function takes paths *inside* a filesystem root (``root="/"`` by
default), so a mounted image filesystem or an unpacked wheel is inspected the
same way as the running system: ``$ORIGIN``, RUNPATH entries, ``ld.so.conf``
and symlinks are all resolved inside the root.

Optional tools, each missing one reported, never crashed on:

- pyelftools (:class:`ElfToolsMissing` when not importable): everything that
  reads an ELF object.
- ``c++filt`` from binutils: demangling; without it, libstdc++'s own
  ``__cxa_demangle`` (through ctypes), and only without both do names stay
  mangled, as :func:`demangler_available` says.
- abi3info (:class:`Abi3InfoMissing`): the CPython stable-ABI symbol list for
  :func:`limited_api_violations`. It is William Woodruff's maintained package
  generated from CPython's ``Misc/stable_abi.toml``, with the version each
  symbol joined the stable ABI.
- ``cuobjdump``: only a fallback when the ``.nv_fatbin`` section cannot be
  parsed directly (:func:`cuda_code`).
"""

from __future__ import annotations

import array
import dataclasses
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "Abi3InfoMissing",
    "CudaCode",
    "DynSymbol",
    "ElfObject",
    "ElfReadError",
    "ElfToolsMissing",
    "ExtensionTag",
    "FatbinError",
    "LibrarySearch",
    "LimitedApiIssue",
    "MissingLibrary",
    "MissingVersion",
    "NearMiss",
    "ObjectCache",
    "Resolution",
    "UnresolvedSymbol",
    "cuda_code",
    "cxx_abi_of",
    "demangle",
    "demangler_available",
    "extension_tag",
    "glibc_of_policy",
    "host_path",
    "limited_api_violations",
    "max_version",
    "parse_fatbin",
    "qualified_name",
    "read_object",
    "resolve",
    "system_library_dirs",
    "versions_newer_than",
]


class ElfToolsMissing(RuntimeError):
    """pyelftools is not importable in this interpreter."""

    def __init__(self) -> None:
        super().__init__(
            "pyelftools is not installed in the interpreter running flashkit "
            f"({sys.executable}): ELF symbol checks skipped. Fix: pip install pyelftools"
        )


class Abi3InfoMissing(RuntimeError):
    """abi3info is not importable in this interpreter."""

    def __init__(self) -> None:
        super().__init__(
            "abi3info is not installed in the interpreter running flashkit "
            f"({sys.executable}): limited-API (abi3) check skipped. Fix: pip install abi3info"
        )


class ElfReadError(ValueError):
    """A file could not be read as an ELF shared object; says which and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class FatbinError(ValueError):
    """The CUDA fat binary of an object could not be listed."""


# ---------------------------------------------------------------------------
# Reading one object


@dataclasses.dataclass(frozen=True)
class DynSymbol:
    """One entry of the dynamic symbol table.

    ``version`` is the GNU symbol version (``GLIBC_2.34``) or None when the
    object has no version for it; ``version_file`` is, for an undefined
    symbol, the library the version was recorded against (``libc.so.6``).
    ``default`` is False for a defined non-default version (``sym@V`` rather
    than ``sym@@V``), which only references asking for V can bind to.
    """

    name: str
    version: str | None
    defined: bool
    weak: bool
    kind: str
    version_file: str | None = None
    default: bool = True


@dataclasses.dataclass(frozen=True)
class ElfObject:
    """What the dynamic loader sees of one ELF object (path is inside the root)."""

    path: str
    elf_class: int
    machine: str
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    undefined: tuple[DynSymbol, ...]
    # name -> every (version, default) it is defined with; version None = unversioned
    defined: Mapping[str, tuple[tuple[str | None, bool], ...]]
    # library file -> versions required from it (.gnu.version_r)
    version_needs: Mapping[str, tuple[str, ...]]
    # versions this object defines (.gnu.version_d), without the base (soname) entry
    version_defs: tuple[str, ...]
    has_fatbin: bool

    def defines(self, name: str, version: str | None) -> bool:
        entries = self.defined.get(name)
        if not entries:
            return False
        if version is None:
            # an unversioned reference binds to the default definition
            return any(default for _, default in entries)
        if not self.version_defs:
            # an object without version definitions satisfies any version
            return True
        return any(v == version for v, _ in entries)


_SYM_KINDS = {
    0: "NOTYPE",
    1: "OBJECT",
    2: "FUNC",
    3: "SECTION",
    4: "FILE",
    5: "COMMON",
    6: "TLS",
    10: "IFUNC",
}
_STB_LOCAL, _STB_WEAK = 0, 2
_SHN_UNDEF = 0
_VERSYM_HIDDEN = 0x8000


def _elftools():
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.dynamic import DynamicSection
        from elftools.elf.elffile import ELFFile
    except ImportError as exc:
        raise ElfToolsMissing() from exc
    return ELFFile, DynamicSection, ELFError


def host_path(root: str, path: str) -> str:
    """The host path of ``path`` inside ``root``, following symlinks inside the root.

    An absolute symlink in a mounted image points into the image, not the host,
    so links are resolved by hand when the root is not ``/``.
    """
    if root in ("", "/"):
        return os.path.realpath(path)
    parts = [p for p in path.split("/") if p]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        if os.path.islink(candidate):
            hops += 1
            if hops > 40:
                raise ElfReadError(path, f"too many levels of symbolic links inside root {root}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        resolved.append(part)
    return os.path.join(root, *resolved)


def read_object(path: str, root: str = "/") -> ElfObject:
    """Read the dynamic-linking facts of the ELF object at ``path`` (inside ``root``).

    Raises :class:`ElfReadError` for a file that is missing or not ELF, and
    :class:`ElfToolsMissing` without pyelftools.
    """
    ELFFile, DynamicSection, ELFError = _elftools()
    hpath = host_path(root, path)
    try:
        with open(hpath, "rb") as stream:
            if stream.read(4) != b"\x7fELF":
                raise ElfReadError(path, "not an ELF file (no \\x7fELF magic)")
            stream.seek(0)
            return _read(ELFFile(stream), path, DynamicSection)
    except ElfReadError:
        raise
    except OSError as exc:
        raise ElfReadError(path, exc.strerror or str(exc)) from exc
    except (ELFError, struct.error, ValueError, KeyError) as exc:
        raise ElfReadError(path, f"malformed ELF: {exc}") from exc


def _read(elf, path: str, DynamicSection) -> ElfObject:
    soname = None
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                d_tag = tag.entry.d_tag
                if d_tag == "DT_NEEDED":
                    needed.append(tag.needed)
                elif d_tag == "DT_SONAME":
                    soname = tag.soname
                elif d_tag == "DT_RPATH":
                    rpath.extend(p for p in tag.rpath.split(":") if p)
                elif d_tag == "DT_RUNPATH":
                    runpath.extend(p for p in tag.runpath.split(":") if p)
            break

    # index -> (version name, library file); from .gnu.version_r and .gnu.version_d
    need_by_index: dict[int, tuple[str, str]] = {}
    version_needs: dict[str, list[str]] = {}
    def_by_index: dict[int, str] = {}
    version_defs: list[str] = []
    verneed = elf.get_section_by_name(".gnu.version_r")
    if verneed is not None:
        for vn, auxes in verneed.iter_versions():
            for aux in auxes:
                need_by_index[aux["vna_other"]] = (aux.name, vn.name)
                version_needs.setdefault(vn.name, []).append(aux.name)
    verdef = elf.get_section_by_name(".gnu.version_d")
    if verdef is not None:
        for vd, auxes in verdef.iter_versions():
            names = [aux.name for aux in auxes]
            if not names:
                continue
            def_by_index[vd["vd_ndx"]] = names[0]
            if not vd["vd_flags"] & 0x1:  # VER_FLG_BASE names the object itself
                version_defs.append(names[0])

    undefined: list[DynSymbol] = []
    defined: dict[str, list[tuple[str | None, bool]]] = {}
    for name, info, shndx, versym in _dynamic_symbols(elf):
        bind, kind = info >> 4, info & 0xF
        if bind == _STB_LOCAL or not name:
            continue
        index = versym & 0x7FFF if versym is not None else 1
        if shndx == _SHN_UNDEF:
            version, vfile = need_by_index.get(index, (None, None))
            undefined.append(DynSymbol(name, version, False, bind == _STB_WEAK, _SYM_KINDS.get(kind, str(kind)), vfile))
        else:
            version = def_by_index.get(index) if index > 1 else None
            hidden = versym is not None and bool(versym & _VERSYM_HIDDEN)
            defined.setdefault(name, []).append((version, not hidden))

    return ElfObject(
        path=path,
        elf_class=elf.elfclass,
        machine=elf["e_machine"],
        soname=soname,
        needed=tuple(needed),
        rpath=tuple(rpath),
        runpath=tuple(runpath),
        undefined=tuple(undefined),
        defined={k: tuple(v) for k, v in defined.items()},
        version_needs={k: tuple(v) for k, v in version_needs.items()},
        version_defs=tuple(version_defs),
        has_fatbin=elf.get_section_by_name(".nv_fatbin") is not None,
    )


def _dynamic_symbols(elf) -> Iterable[tuple[str, int, int, int | None]]:
    """(name, st_info, st_shndx, versym) for each .dynsym entry.

    pyelftools locates the sections; the table itself is unpacked in bulk
    because pyelftools' per-symbol parsing costs ~0.1 ms a symbol, 9 s for
    libtorch_cpu.so's 79k symbols, against ~0.1 s this way.
    """
    dynsym = elf.get_section_by_name(".dynsym")
    if dynsym is None or dynsym["sh_entsize"] == 0:
        return
    strtab = elf.get_section(dynsym["sh_link"]).data()
    data = dynsym.data()
    endian = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:
        fmt, name_at, info_at, shndx_at = endian + "IBBHQQ", 0, 1, 3
    else:
        fmt, name_at, info_at, shndx_at = endian + "IIIBBH", 0, 3, 5
    size = struct.calcsize(fmt)
    if dynsym["sh_entsize"] != size:
        raise ValueError(f".dynsym entry size {dynsym['sh_entsize']} is not {size}")
    versyms: array.array | None = None
    versym_section = elf.get_section_by_name(".gnu.version")
    if versym_section is not None:
        versyms = array.array("H")
        versyms.frombytes(versym_section.data())
        if (sys.byteorder == "little") != elf.little_endian:
            versyms.byteswap()
    usable = len(data) - len(data) % size
    for i, entry in enumerate(struct.iter_unpack(fmt, data[:usable])):
        offset = entry[name_at]
        end = strtab.find(b"\0", offset)
        name = strtab[offset : end if end >= 0 else len(strtab)].decode("utf-8", "replace")
        versym = versyms[i] if versyms is not None and i < len(versyms) else None
        yield name, entry[info_at], entry[shndx_at], versym


# ---------------------------------------------------------------------------
# Symbol versions (glibc, libstdc++)


def _version_key(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in text.split("."))
    except ValueError:
        return None


def max_version(obj: ElfObject, prefix: str) -> str | None:
    """Highest version with ``prefix`` the object requires, e.g. ``max_version(o, "GLIBC_")`` -> "2.34"."""
    best: tuple[tuple[int, ...], str] | None = None
    for versions in obj.version_needs.values():
        for v in versions:
            if not v.startswith(prefix):
                continue
            key = _version_key(v[len(prefix) :])
            if key is not None and (best is None or key > best[0]):
                best = (key, v[len(prefix) :])
    return best[1] if best else None


def versions_newer_than(obj: ElfObject, prefix: str, limit: str) -> tuple[DynSymbol, ...]:
    """Undefined symbols whose ``prefix`` version is newer than ``limit`` ("2.28")."""
    bound = _version_key(limit)
    if bound is None:
        raise ValueError(f"version limit {limit!r} is not dotted numbers like '2.28'")
    out = []
    for sym in obj.undefined:
        if sym.version and sym.version.startswith(prefix):
            key = _version_key(sym.version[len(prefix) :])
            if key is not None and key > bound:
                out.append(sym)
    return tuple(out)


_LEGACY_MANYLINUX = {"manylinux1": "2.5", "manylinux2010": "2.12", "manylinux2014": "2.17"}


def glibc_of_policy(policy: str) -> str:
    """The glibc version a manylinux policy allows: ``manylinux_2_28`` -> "2.28" (PEP 600)."""
    tag = policy.split("_x86_64")[0].split("_aarch64")[0]
    if tag in _LEGACY_MANYLINUX:
        return _LEGACY_MANYLINUX[tag]
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)", tag)
    if not m:
        raise ValueError(
            f"policy {policy!r} is not a manylinux tag; allowed: manylinux_X_Y (PEP 600), "
            + ", ".join(sorted(_LEGACY_MANYLINUX))
        )
    return f"{m.group(1)}.{m.group(2)}"


# ---------------------------------------------------------------------------
# Demangling


def demangler_available() -> bool:
    return shutil.which("c++filt") is not None or _cxa_demangle() is not None


_demangled: dict[str, str] = {}
_CXA: list = []  # [function or None] once looked up


def _cxa_demangle():
    """libstdc++'s own ``abi::__cxa_demangle`` through ctypes, or None without libstdc++.

    The fallback when binutils (c++filt) is absent, as in slim runtime images:
    every environment with a C++ torch extension has libstdc++.so.6, and its
    demangler is the one c++filt's output matches.
    """
    if not _CXA:
        fn = None
        try:
            import ctypes

            lib = ctypes.CDLL("libstdc++.so.6")
            fn = lib.__cxa_demangle
            fn.restype = ctypes.c_void_p
            fn.argtypes = [
                ctypes.c_char_p,
                ctypes.c_char_p,
                ctypes.POINTER(ctypes.c_size_t),
                ctypes.POINTER(ctypes.c_int),
            ]
            free = ctypes.CDLL(None).free
            free.argtypes = [ctypes.c_void_p]

            def call(name: str, _fn=fn, _free=free, _ct=ctypes) -> str | None:
                status = _ct.c_int(0)
                ptr = _fn(name.encode("ascii", "replace"), None, None, _ct.byref(status))
                if status.value != 0 or not ptr:
                    return None
                try:
                    return _ct.string_at(ptr).decode("utf-8", "replace")
                finally:
                    _free(ptr)

            fn = call
        except (OSError, AttributeError):
            fn = None
        _CXA.append(fn)
    return _CXA[0]


def demangle(names: Iterable[str]) -> dict[str, str]:
    """Demangled form of each name (itself when not a C++ name or no demangler).

    One ``c++filt`` process per call for all names not seen before; without
    c++filt, libstdc++'s ``__cxa_demangle`` (same output).
    """
    names = list(dict.fromkeys(names))
    todo = [n for n in names if n not in _demangled and n.startswith("_Z")]
    exe = shutil.which("c++filt")
    if todo and exe:
        try:
            proc = subprocess.run(
                [exe], input="\n".join(todo) + "\n", capture_output=True, text=True, timeout=60, check=True
            )
            lines = proc.stdout.splitlines()
            if len(lines) == len(todo):
                _demangled.update(zip(todo, lines, strict=True))
        except (OSError, subprocess.SubprocessError):
            pass
    todo = [n for n in todo if n not in _demangled]
    cxa = _cxa_demangle() if todo else None
    if cxa is not None:
        for n in todo:
            d = cxa(n)
            if d is not None:
                _demangled[n] = d
    return {n: _demangled.get(n, n) for n in names}


def qualified_name(demangled: str) -> str:
    """``c10::cuda::SetDevice(int)`` -> ``c10::cuda::SetDevice``; data names come back whole."""
    depth = 0
    i = 0
    while i < len(demangled):
        c = demangled[i]
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif c == "(" and depth == 0:
            head = demangled[:i]
            if head.endswith("operator"):
                i += 2  # operator() names itself with parentheses
                continue
            return head
        i += 1
    return demangled


_CXX11_STRING = "std::basic_string<char, std::char_traits<char>, std::allocator<char> >"


def _abi_neutral(demangled: str) -> str:
    """The name with the libstdc++ dual-ABI markers erased, to compare across ABIs."""
    text = demangled.replace("[abi:cxx11]", "").replace("std::__cxx11::", "std::")
    return text.replace("std::string", _CXX11_STRING)


def cxx_abi_of(demangled_names: Iterable[str]) -> str | None:
    """Which libstdc++ string ABI names use: "cxx11", "pre-cxx11", "both" or None (no evidence)."""
    new = old = False
    for name in demangled_names:
        if "std::__cxx11::" in name or "[abi:cxx11]" in name:
            new = True
        elif "std::string" in name or "std::basic_string<" in name:
            old = True
    if new and old:
        return "both"
    return "cxx11" if new else "pre-cxx11" if old else None


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
    root = search.root
    cache = cache or ObjectCache(root)
    system_dirs = search.system_dirs if search.system_dirs is not None else system_library_dirs(root)
    mod = cache.get(module)

    unreadable: list[tuple[str, str]] = []
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
            dirs = (
                ([_expand_origin(d, obj.path) for d in obj.rpath] if not obj.runpath else [])
                + list(search.extra_dirs)
                + [_expand_origin(d, obj.path) for d in obj.runpath]
                + list(system_dirs)
            )
            candidates = [name] if "/" in name else [os.path.join(d, name) for d in dirs]
            hit = None
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
                hit = lib
                break
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

    scope = closure[1:] + [p for p in preloaded if all(p is not c for c in closure)]

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

    missing = [s for s in mod.undefined if not s.weak and not any(o.defines(s.name, s.version) for o in scope)]
    have_demangler = demangler_available()
    demangled = demangle(s.name for s in missing)
    unresolved = []
    for s in missing:
        unresolved.append(
            UnresolvedSymbol(
                name=s.name,
                demangled=demangled[s.name],
                version=s.version,
                version_file=s.version_file,
                kind=s.kind,
                near_misses=_near_misses(demangled[s.name], s.name, scope),
            )
        )
    return Resolution(
        module=module,
        loaded=tuple(loaded),
        missing_libraries=tuple(missing_libs),
        missing_versions=tuple(missing_versions),
        unresolved=tuple(unresolved),
        unreadable=tuple(unreadable),
        demangler=have_demangler,
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


# ---------------------------------------------------------------------------
# CPython extension modules


@dataclasses.dataclass(frozen=True)
class ExtensionTag:
    """What an extension module's file name says about the interpreter it is for.

    kind: "cpython" (``.cpython-312-x86_64-linux-gnu.so``), "abi3"
    (``.abi3.so``), "plain" (``.so``: loadable by any CPython 3, no claim).
    """

    kind: str
    python: tuple[int, int] | None = None
    free_threaded: bool = False
    platform: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "cpython" and self.python:
            return f"cp{self.python[0]}{self.python[1]}{'t' if self.free_threaded else ''}"
        return self.kind


_CPYTHON_SUFFIX = re.compile(r"\.cpython-(\d)(\d+)(t?)(?:d?)-([A-Za-z0-9_-]+)\.so$")


def extension_tag(filename: str) -> ExtensionTag:
    base = os.path.basename(filename)
    m = _CPYTHON_SUFFIX.search(base)
    if m:
        return ExtensionTag("cpython", (int(m.group(1)), int(m.group(2))), bool(m.group(3)), m.group(4))
    if base.endswith(".abi3.so"):
        return ExtensionTag("abi3")
    return ExtensionTag("plain")


@dataclasses.dataclass(frozen=True)
class LimitedApiIssue:
    symbol: str
    reason: str
    added: str | None  # the Python version the symbol joined the stable ABI, if it did


def limited_api_violations(obj: ElfObject, minimum: tuple[int, int] | None = None) -> tuple[LimitedApiIssue, ...]:
    """Python C-API symbols the object uses that abi3 for CPython >= ``minimum`` does not offer.

    Covers every undefined ``Py*``/``_Py*`` symbol: not in the stable ABI at
    all, or added to it after ``minimum`` (a ``cp39-abi3`` module using a 3.11
    function fails to load on 3.9 and 3.10). ``minimum`` None (the claim is
    unknown, e.g. a bare ``.abi3.so``) checks membership only.
    """
    try:
        import abi3info
        from abi3info.models import Symbol
    except ImportError as exc:
        raise Abi3InfoMissing() from exc
    issues = []
    for sym in obj.undefined:
        if not (sym.name.startswith("Py") or sym.name.startswith("_Py")):
            continue
        entry = abi3info.FUNCTIONS.get(Symbol(sym.name)) or abi3info.DATAS.get(Symbol(sym.name))
        if entry is None:
            issues.append(LimitedApiIssue(sym.name, "not in the CPython stable ABI", None))
            continue
        added = (entry.added.major, entry.added.minor)
        if minimum is not None and added > minimum:
            issues.append(
                LimitedApiIssue(
                    sym.name,
                    f"joined the stable ABI in {added[0]}.{added[1]}, after {minimum[0]}.{minimum[1]}",
                    f"{added[0]}.{added[1]}",
                )
            )
    return tuple(issues)


# ---------------------------------------------------------------------------
# CUDA fat binaries

_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
# kind, ?, header size, padded payload size, payload size, ?, minor, major, arch, ...flags at 40
_FATBIN_ENTRY = struct.Struct("<HHIQIIHHI")
_KIND_PTX, _KIND_ELF = 1, 2
# Entry flag bits, seen on nvcc 13.0 output (cross-checked with cuobjdump --list-elf/--list-ptx):
_FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a / compute_90a
_FLAG_FAMILY_SPECIFIC = 0x200000  # sm_100f / compute_120f


@dataclasses.dataclass(frozen=True)
class CudaCode:
    """The GPU code an object carries: cubins ("sm_90a") and PTX ("compute_80").

    ``source`` says how it was listed: "fatbin" (parsed here) or "cuobjdump".
    """

    cubins: tuple[str, ...]
    ptx: tuple[str, ...]
    source: str

    def runs_on(self, capability: tuple[int, int]) -> tuple[str, str] | None:
        """("cubin", arch) or ("ptx", arch) the driver would pick for a GPU, or None.

        A cubin runs on its own major at an equal or higher minor (never across
        majors); "a" cubins run on exactly their arch. PTX is JIT-compiled for
        any GPU at or above its arch ("a" PTX: only its own).
        """
        best = None
        for arch in self.cubins:
            cc, suffix = _parse_arch(arch)
            ok = cc == capability if suffix == "a" else (cc[0] == capability[0] and cc[1] <= capability[1])
            if ok and (best is None or cc > best[0]):
                best = (cc, arch)
        if best:
            return ("cubin", best[1])
        for arch in self.ptx:
            cc, suffix = _parse_arch(arch)
            if suffix == "a":
                ok = cc == capability
            elif suffix == "f":
                ok = cc[0] == capability[0] and cc[1] <= capability[1]
            else:
                ok = cc <= capability
            if ok and (best is None or cc > best[0]):
                best = (cc, arch)
        return ("ptx", best[1]) if best else None


def _parse_arch(arch: str) -> tuple[tuple[int, int], str]:
    m = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)([af]?)", arch)
    if not m:
        raise ValueError(f"not a CUDA arch name: {arch!r}")
    return (int(m.group(1)), int(m.group(2))), m.group(3)


def _arch_name(prefix: str, arch: int, flags: int) -> str:
    suffix = "a" if flags & _FLAG_ARCH_SPECIFIC else "f" if flags & _FLAG_FAMILY_SPECIFIC else ""
    return f"{prefix}_{arch}{suffix}"


def parse_fatbin(data: bytes) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(cubin archs, PTX archs) of the fat binary containers in a ``.nv_fatbin`` section.

    A section holds one container per compiled translation unit (plus nvcc's
    device-link one), each a 16-byte header and entries of [header, payload];
    only the entry headers are read, so compressed payloads need no decoding.
    """
    cubins: dict[str, None] = {}
    ptx: dict[str, None] = {}
    off = 0
    containers = 0
    while off + _FATBIN_HEADER.size <= len(data):
        magic, _version, header_size, size = _FATBIN_HEADER.unpack_from(data, off)
        if magic != _FATBIN_MAGIC:
            if any(data[off : off + 8]):
                raise FatbinError(f"no fat binary header at offset {off:#x} (magic {magic:#010x})")
            off += 8  # zero padding between containers
            continue
        end = off + header_size + size
        if header_size < _FATBIN_HEADER.size or end > len(data):
            raise FatbinError(f"fat binary container at {off:#x} claims {size} bytes past the section end")
        entry = off + header_size
        while entry + 48 <= end:
            kind, _, ehsize, padded, _, _, _, _, arch = _FATBIN_ENTRY.unpack_from(data, entry)
            (flags,) = struct.unpack_from("<Q", data, entry + 40)
            if ehsize < 48:
                raise FatbinError(f"fat binary entry at {entry:#x} has header size {ehsize}")
            if kind == _KIND_ELF:
                cubins[_arch_name("sm", arch, flags)] = None
            elif kind == _KIND_PTX:
                ptx[_arch_name("compute", arch, flags)] = None
            entry += ehsize + padded
        containers += 1
        off = (end + 7) & ~7
    if containers == 0:
        raise FatbinError("the .nv_fatbin section holds no fat binary container")
    return tuple(sorted(cubins, key=_arch_order)), tuple(sorted(ptx, key=_arch_order))


def _arch_order(arch: str) -> tuple[tuple[int, int], str]:
    return _parse_arch(arch)


def cuda_code(path: str, root: str = "/") -> CudaCode | None:
    """The cubins and PTX in an object's ``.nv_fatbin`` section, or None when it has none.

    Parsed directly so no CUDA toolkit is needed; when the parse fails and
    ``cuobjdump`` is on PATH, its listing is used instead (``source`` says
    which). Raises :class:`FatbinError` when neither works.
    """
    ELFFile, _, ELFError = _elftools()
    hpath = host_path(root, path)
    try:
        with open(hpath, "rb") as fh:
            elf = ELFFile(fh)
            section = elf.get_section_by_name(".nv_fatbin")
            if section is None:
                return None
            data = section.data()
    except OSError as exc:
        raise ElfReadError(path, exc.strerror or str(exc)) from exc
    except ELFError as exc:
        raise ElfReadError(path, f"malformed ELF: {exc}") from exc
    try:
        cubins, ptx = parse_fatbin(data)
        return CudaCode(cubins, ptx, "fatbin")
    except FatbinError as parse_error:
        exe = shutil.which("cuobjdump")
        if not exe:
            raise FatbinError(f"{path}: {parse_error}; cuobjdump is not on PATH to list it instead") from None
        return _cuobjdump_listing(exe, hpath, path, parse_error)


_CUOBJDUMP_LINE = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.(sm_\d+[af]?)\.(?:cubin|ptx)$")


def _cuobjdump_listing(exe: str, hpath: str, path: str, parse_error: Exception) -> CudaCode:
    cubins: dict[str, None] = {}
    ptx: dict[str, None] = {}
    for flag in ("--list-elf", "--list-ptx"):
        try:
            proc = subprocess.run([exe, flag, hpath], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            raise FatbinError(f"{path}: {parse_error}; cuobjdump {flag} failed: {exc}") from None
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            raise FatbinError(f"{path}: {parse_error}; cuobjdump {flag} cannot list it either: {why[0]}")
        for line in proc.stdout.splitlines():
            m = _CUOBJDUMP_LINE.match(line.strip())
            if not m:
                continue
            if m.group(1) == "ELF":
                cubins[m.group(2)] = None
            else:
                ptx[m.group(2).replace("sm_", "compute_")] = None
    return CudaCode(tuple(sorted(cubins, key=_arch_order)), tuple(sorted(ptx, key=_arch_order)), "cuobjdump")
