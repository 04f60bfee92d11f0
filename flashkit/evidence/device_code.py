"""Device code: the GPU code a CUDA wheel carries, as one content digest.

A CUDA extension's ``.nv_fatbin`` section holds one fat binary container per translation unit, each a list
of entries (a cubin for one arch, or PTX). Its bytes also hold things that are not code: container order
(link order), padding, and header fields such as the producer's identifier. What runs on a GPU is only the
entries' payloads, so the digest covers exactly those: for each extension in the wheel, the sorted list of
(kind, arch, compressed or not, payload size, payload sha256). Two wheels with the same digest hand the
driver the same cubins and PTX, byte for byte; a payload that differs by one byte gives another digest.

Payloads are hashed as stored. A payload compressed by another fatbinary release (same code, other bytes)
therefore counts as different: the comparison errs towards "not the same", never the other way.

Standard library only (no pyelftools, no toolkit): ``flashkit.evidence.artifact_check`` computes the digest
on a GPU host from the very files it installed and ran, with nothing but this repository on its path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from collections.abc import Iterator
from typing import IO

from flashkit.evidence import wheelzip

SCHEME = "flashkit-device-code-1"

FATBIN_MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
# kind, ?, header size, padded payload size, payload size, ?, minor, major, arch; flags at offset 40
_ENTRY = struct.Struct("<HHIQIIHHI")
ENTRY_MIN = 48
KIND_PTX, KIND_ELF = 1, 2
# Entry flag bits (cross-checked with cuobjdump --list-elf/--list-ptx on nvcc 12.4 and 13.0 output).
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a / compute_90a
FLAG_FAMILY_SPECIFIC = 0x200000  # sm_100f / compute_120f
FLAG_COMPRESSED = 0x2000 | 0x8000  # LZ4-style (CUDA <= 12) and zstd (newer) payloads
MAX_ENTRIES = 100_000


class DeviceCodeError(ValueError):
    """A fat binary or ELF file that cannot be read as one."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One cubin or PTX payload, as the driver receives it."""

    kind: str  # "cubin" | "ptx"
    arch: str  # "sm_90a", "compute_80"
    compressed: bool
    size: int
    sha256: str

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


def arch_name(prefix: str, arch: int, flags: int) -> str:
    suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
    return f"{prefix}_{arch}{suffix}"


def walk(section: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(kind, arch, flags, payload offset, payload size) of every entry of every container in a section.

    Raises :class:`DeviceCodeError` on anything that is not a sequence of containers (zero padding between
    them is allowed), and when no container is found at all.
    """
    off = containers = entries = 0
    while off + _CONTAINER.size <= len(section):
        magic, _version, header_size, size = _CONTAINER.unpack_from(section, off)
        if magic != FATBIN_MAGIC:
            if any(section[off : off + 8]):
                raise DeviceCodeError(f"no fat binary header at offset {off:#x} (magic {magic:#010x})")
            off += 8  # zero padding between containers
            continue
        end = off + header_size + size
        if header_size < _CONTAINER.size or end > len(section):
            raise DeviceCodeError(f"fat binary container at {off:#x} claims {size} bytes past the section end")
        entry = off + header_size
        while entry + ENTRY_MIN <= end:
            kind, _, ehsize, padded, payload, _, _, _, arch = _ENTRY.unpack_from(section, entry)
            (flags,) = struct.unpack_from("<Q", section, entry + 40)
            if ehsize < ENTRY_MIN or payload > padded or entry + ehsize + padded > end:
                raise DeviceCodeError(f"fat binary entry at {entry:#x} has sizes that do not fit its container")
            entries += 1
            if entries > MAX_ENTRIES:
                raise DeviceCodeError(f"more than {MAX_ENTRIES} fat binary entries")
            yield kind, arch, flags, entry + ehsize, payload
            entry += ehsize + padded
        containers += 1
        off = (end + 7) & ~7
    if containers == 0:
        raise DeviceCodeError("the .nv_fatbin section holds no fat binary container")


def entries_of_section(section: bytes) -> list[Entry]:
    out = []
    for kind, arch, flags, start, size in walk(section):
        if kind not in (KIND_ELF, KIND_PTX):
            continue  # neither code for a GPU nor for its JIT: nothing the driver runs
        payload = section[start : start + size]
        out.append(
            Entry(
                kind="cubin" if kind == KIND_ELF else "ptx",
                arch=arch_name("sm" if kind == KIND_ELF else "compute", arch, flags),
                compressed=bool(flags & FLAG_COMPRESSED),
                size=size,
                sha256=hashlib.sha256(payload).hexdigest(),
            )
        )
    return out


def elf_section(data: bytes, name: str) -> bytes | None:
    """The contents of section ``name`` of a 64-bit little-endian ELF file, None when it has none."""
    if data[:4] != b"\x7fELF":
        raise DeviceCodeError("not an ELF file")
    if data[4:6] != b"\x02\x01":
        raise DeviceCodeError("not a 64-bit little-endian ELF file")
    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        if shoff == 0 or shnum == 0:
            return None
        if shentsize < 64 or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
            raise DeviceCodeError("the ELF section header table lies outside the file")

        def header(i: int) -> tuple[int, int, int, int]:
            sh_name, sh_type, _flags, _addr, sh_offset, sh_size = struct.unpack_from(
                "<IIQQQQ", data, shoff + i * shentsize
            )
            return sh_name, sh_type, sh_offset, sh_size

        _, _, str_off, str_size = header(shstrndx)
        names = data[str_off : str_off + str_size]
        for i in range(shnum):
            sh_name, sh_type, offset, size = header(i)
            end = names.find(b"\0", sh_name)
            if names[sh_name : end if end >= 0 else None] != name.encode():
                continue
            if sh_type == 8:  # SHT_NOBITS: no bytes in the file
                return b""
            if offset + size > len(data):
                raise DeviceCodeError(f"section {name} lies outside the file")
            return data[offset : offset + size]
    except struct.error as exc:
        raise DeviceCodeError(f"truncated ELF file ({exc})") from None
    return None


@dataclasses.dataclass(frozen=True)
class DeviceCode:
    """The device code of a set of extensions: ``{path in the wheel: [entries, sorted]}``."""

    extensions: dict[str, tuple[Entry, ...]]

    @property
    def digest(self) -> str:
        return digest_of(self.as_json())

    def as_json(self) -> dict[str, list[dict]]:
        return {path: [e.as_json() for e in entries] for path, entries in sorted(self.extensions.items())}

    def archs(self) -> tuple[str, ...]:
        return tuple(sorted({e.arch for entries in self.extensions.values() for e in entries}))

    def count(self) -> int:
        return sum(len(entries) for entries in self.extensions.values())

    def summary(self) -> str:
        return self.summary_of(self.as_json())

    @staticmethod
    def summary_of(extensions_json: dict[str, list[dict]]) -> str:
        """ "204 payloads in 1 extension(s); cubins sm_80, sm_90a" for a listing as :meth:`as_json` writes it."""
        entries = [e for es in extensions_json.values() for e in es]
        cubins = sorted({str(e.get("arch")) for e in entries if e.get("kind") == "cubin"})
        ptx = sorted({str(e.get("arch")) for e in entries if e.get("kind") == "ptx"})
        parts = [f"{len(entries)} payloads in {len(extensions_json)} extension(s)"]
        if cubins:
            parts.append("cubins " + ", ".join(cubins))
        if ptx:
            parts.append("PTX " + ", ".join(ptx))
        return "; ".join(parts)


def digest_of(extensions_json: dict[str, list[dict]]) -> str:
    """The digest of a device-code listing (as :meth:`DeviceCode.as_json` writes it): recomputable by anyone."""
    body = {"scheme": SCHEME, "extensions": {k: extensions_json[k] for k in sorted(extensions_json)}}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _sorted(entries: list[Entry]) -> tuple[Entry, ...]:
    return tuple(sorted(entries, key=lambda e: (e.kind, e.arch, e.sha256, e.size, e.compressed)))


def of_files(files: dict[str, bytes]) -> DeviceCode:
    """The device code of ELF files by name; files without a ``.nv_fatbin`` section carry none."""
    out = {}
    for path, data in sorted(files.items()):
        section = elf_section(data, ".nv_fatbin")
        if section:
            try:
                out[path] = _sorted(entries_of_section(section))
            except DeviceCodeError as exc:
                raise DeviceCodeError(f"{path}: {exc}") from None
    return DeviceCode(out)


def is_shared_object(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.endswith(".so") or ".so." in base


def of_wheel(source: str | IO[bytes], shown: str | None = None) -> DeviceCode:
    """The device code of every shared object in a wheel (``*.so`` members), read without installing it.
    ``source``: the wheel's path, or the wheel opened for reading (``shown`` names it in errors)."""
    shown = shown or (source if isinstance(source, str) else "the wheel")
    try:
        files = wheelzip.read_members(source, shown, is_shared_object)
    except wheelzip.WheelError as exc:
        raise DeviceCodeError(str(exc)) from None
    return of_files(files)


def of_installed(site: str, package: str) -> DeviceCode:
    """The device code of an installed package's shared objects, named as they are in its wheel."""
    files = {}
    top = os.path.join(site, package)
    for dirpath, _dirs, names in os.walk(top):
        for name in names:
            if name.endswith(".so") or ".so." in name:
                full = os.path.join(dirpath, name)
                with open(full, "rb") as fh:
                    files[os.path.relpath(full, site).replace(os.sep, "/")] = fh.read()
    return of_files(files)
