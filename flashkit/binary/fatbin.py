"""CUDA fat binaries: which cubins and PTX a compiled object carries, and which GPUs that serves.

The ``.nv_fatbin`` section is parsed directly, so no CUDA toolkit is needed; ``cuobjdump`` is only a
fallback when the parse fails.
"""

from __future__ import annotations

import dataclasses
import re
import shutil

from flashkit.binary.elf import ElfReadError, _elftools, host_path, open_regular
from flashkit.core import procs
from flashkit.evidence import device_code


class FatbinError(ValueError):
    """The CUDA fat binary of an object could not be listed."""


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


def parse_fatbin(data: bytes) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(cubin archs, PTX archs) of the fat binary containers in a ``.nv_fatbin`` section.

    A section holds one container per compiled translation unit (plus nvcc's device-link one); the walk
    is :func:`flashkit.evidence.device_code.walk`, and only entry headers are read here.
    """
    cubins: dict[str, None] = {}
    ptx: dict[str, None] = {}
    try:
        for kind, arch, flags, _start, _size in device_code.walk(data):
            if kind == device_code.KIND_ELF:
                cubins[device_code.arch_name("sm", arch, flags)] = None
            elif kind == device_code.KIND_PTX:
                ptx[device_code.arch_name("compute", arch, flags)] = None
    except device_code.DeviceCodeError as exc:
        raise FatbinError(str(exc)) from None
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
        with open_regular(hpath, path) as fh:
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
        proc = procs.run(
            [exe, flag, hpath], timeout=300, error=FatbinError, what=f"{path}: {parse_error}; cuobjdump {flag}",
            capture_output=True, text=True,
        )  # fmt: skip
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


def target_code(gpu_targets: tuple[str, ...] | list[str]) -> tuple[set[str], set[str]]:
    """Cubins and PTX a spec's targets ask for: "8.0" -> sm_80; "9.0a+PTX" -> sm_90a and compute_90a."""
    cubins, ptx = set(), set()
    for t in gpu_targets:
        m = re.fullmatch(r"(\d+)\.(\d)([af]?)(\+PTX)?", t)
        if not m:
            raise ValueError(f"gpu target {t!r} is not like '8.0', '9.0a' or '9.0+PTX'")
        arch = f"{m.group(1)}{m.group(2)}{m.group(3)}"
        cubins.add(f"sm_{arch}")
        if m.group(4):
            ptx.add(f"compute_{arch}")
    return cubins, ptx


def targets_cover(gpu_targets: tuple[str, ...] | list[str], capability: str) -> bool:
    """Does code built for ``gpu_targets`` run on a GPU of compute capability ``"9.0"``?"""
    try:
        cubins, ptx = target_code(gpu_targets)
        major, minor = (int(x) for x in capability.split(".")[:2])
        return CudaCode(tuple(sorted(cubins)), tuple(sorted(ptx)), "spec").runs_on((major, minor)) is not None
    except ValueError:
        return False
