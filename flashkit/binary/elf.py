"""Read what the dynamic loader will need from ELF shared objects, and check it.

Facts, not verdicts: this module says which symbols, versions, libraries and
CUDA architectures an object needs or carries, and which of those a set of
providers does not satisfy. Naming the likely cause and the fix is
:mod:`flashkit.doctor`'s job; the ``abi``/``build`` verification tiers reuse
the same facts.

Every function takes paths *inside* a filesystem root (``root="/"`` by
default), so a mounted image filesystem or an unpacked wheel is inspected the
same way as the running system: ``$ORIGIN``, RUNPATH entries, ``ld.so.conf``
and symlinks are all resolved inside the root.

:mod:`flashkit.binary.linking` resolves an object's dependencies like the loader and
:mod:`flashkit.binary.fatbin` lists its CUDA code; both build on the readers here.

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
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Iterable, Mapping


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


def open_regular(hpath: str, shown: str):
    """Open a file for reading only when it is a regular file: ``open`` on a FIFO where a library
    should be would block for ever, and a device could be read without end."""
    try:
        st = os.stat(hpath)
    except OSError as exc:
        raise ElfReadError(shown, exc.strerror or str(exc)) from exc
    if not stat.S_ISREG(st.st_mode):
        raise ElfReadError(shown, "not a regular file (a FIFO, socket, device or directory): skipped")
    fd = os.open(hpath, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ElfReadError(shown, "not a regular file: skipped")
    return os.fdopen(fd, "rb")


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
        with open_regular(hpath, path) as stream:
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


# What the demangler puts before the entity a special name is about ("vtable for c10::Error").
_SPECIAL_NAMES = (
    "vtable for ",
    "construction vtable for ",
    "VTT for ",
    "typeinfo for ",
    "typeinfo name for ",
    "typeinfo fn for ",
    "guard variable for ",
    "non-virtual thunk to ",
    "virtual thunk to ",
    "covariant return thunk to ",
    "transaction clone for ",
    "TLS init function for ",
    "TLS wrapper function for ",
)


def _top_level_words(text: str) -> list[str]:
    """``text`` split at the spaces outside <...> and (...): a return type and the name after it."""
    words, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth = max(0, depth - 1)
        elif c == " " and depth == 0:
            words.append(text[start:i])
            start = i + 1
    words.append(text[start:])
    return [w for w in words if w]


def in_namespaces(demangled: str, namespaces: Iterable[str]) -> bool:
    """Whether a demangled C++ name is an entity of one of ``namespaces`` ("c10::"), or a vtable, typeinfo or
    thunk of one. A function template's name comes after its return type ("void at::native::f<int>()"),
    so every top-level word of the qualified name counts; template arguments and parameters do not."""
    text = demangled
    while True:
        special = next((p for p in _SPECIAL_NAMES if text.startswith(p)), None)
        if special is None:
            break
        text = text[len(special) :]
    prefixes = tuple(namespaces)
    return any(w.startswith(prefixes) for w in _top_level_words(qualified_name(text)))


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


# Symbols that only libstdc++'s own library code defines (no header instantiates them), so an extension that
# exports one carries a copy of the C++ runtime: the library-only parts of locale, stream start-up and the
# exception runtime.
_CXX_RUNTIME_MARKERS = {
    "_ZNKSt6locale2id5_M_idEv": "std::locale::id::_M_id() const",
    "_ZNSt6localeC1Ev": "std::locale::locale()",
    "_ZNSt8ios_base4InitC1Ev": "std::ios_base::Init::Init()",
    "__cxa_throw": "__cxa_throw",
    "__cxa_allocate_exception": "__cxa_allocate_exception",
}


def embedded_cxx_runtime(obj: ElfObject) -> tuple[str, ...]:
    """The C++ runtime functions ``obj`` defines and exports itself (empty for a module that uses the shared
    libstdc++). A module linked with libstdc++.a runs its own copy beside the libstdc++.so torch loaded, over
    one set of exported global state (locale facets, stream start-up); where the two copies differ in
    version, the first error message that formats a number can end the process with SIGSEGV."""
    return tuple(shown for name, shown in _CXX_RUNTIME_MARKERS.items() if name in obj.defined)
