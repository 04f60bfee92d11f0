"""What this project's hosts can do with an env, derived from the measured host facts in ``hosts.toml``
(package data beside this module).

The statement is computed, not hand-written per env, so it stays true when an env changes; the facts are
data, so a host that changes is one edit of that file. The file is read once, through the readers' limits
(:func:`flashkit.core.safeio.read_text`), and checked field by field: a bad value is a SpecError naming the
file, the field and what is allowed.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from packaging.version import Version

from flashkit.core.errors import SpecError
from flashkit.core.safeio import KIB, read_text
from flashkit.plan.spec import ACCEL_KINDS, FLAVORS

DATA = "hosts.toml"
MAX_BYTES = 16 * KIB
VENDOR = {"cuda": "NVIDIA", "rocm": "AMD"}
# gpu_host's fields: the pattern a value must match whole, and what to write.
_GPU_FIELDS = {
    "gpu": (r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,39}", "a GPU's name, e.g. H200"),
    "accelerator": ("|".join(ACCEL_KINDS), " or ".join(ACCEL_KINDS)),
    "sm": (r"[0-9]{1,2}\.[0-9]", "its compute capability, e.g. 9.0"),
    "torch": (r"[0-9]+\.[0-9]+", "the torch series it runs, e.g. 2.11"),
    "cuda": (r"[0-9]{1,2}\.[0-9]", "the CUDA version of that torch, e.g. 13.0"),
}


@dataclass(frozen=True)
class GpuHost:
    gpu: str
    accelerator: str
    sm: str
    torch: str
    cuda: str

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])


@dataclass(frozen=True)
class Hosts:
    unreachable: dict[str, str]  # base flavor -> why the build host cannot get its base image
    gpu: GpuHost


def _bad(shown: str, message: str) -> SpecError:
    return SpecError(f"{shown}: {message}", hint=f"correct it in {shown}; its comments say what each field holds")


def _fields(value: object, name: str, shown: str, allowed: tuple[str, ...]) -> dict:
    """``value``, the table ``name``, checked to hold only ``allowed`` keys."""
    if not isinstance(value, dict):
        raise _bad(shown, f"{name}: {'missing' if value is None else 'not a table'}; expected a table")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise _bad(shown, f"{name}.{unknown[0]}: unknown field; allowed here: {', '.join(allowed)}")
    return value


def parse(text: str, shown: str) -> Hosts:
    """The facts of ``text`` (the file ``shown``), or SpecError naming the field that is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _bad(shown, f"not valid TOML: {exc}") from None
    except ValueError as exc:  # an integer of more than 4300 digits, which Python refuses to convert
        raise _bad(shown, f"not a file of host facts: {str(exc)[:120]}") from None
    except RecursionError:  # tomllib reads nested arrays and tables recursively
        raise _bad(shown, "nested deeper than any file of host facts") from None
    unknown = sorted(set(data) - {"build_host", "gpu_host"})
    if unknown:
        raise _bad(shown, f"{unknown[0]}: unknown table; allowed: build_host, gpu_host")
    build = _fields(data.get("build_host"), "build_host", shown, ("unreachable",))
    unreachable = _fields(build.get("unreachable"), "build_host.unreachable", shown, FLAVORS)
    for flavor, why in unreachable.items():
        if not isinstance(why, str) or not why.strip():
            raise _bad(shown, f"build_host.unreachable.{flavor}: {why!r}; expected text saying why it is unreachable")
    gpu = _fields(data.get("gpu_host"), "gpu_host", shown, tuple(_GPU_FIELDS))
    for field, (pattern, what) in _GPU_FIELDS.items():
        value = gpu.get(field)
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            got = "missing" if value is None else f"{value!r} is not valid"
            raise _bad(shown, f"gpu_host.{field}: {got}; expected {what}, as a quoted string")
    return Hosts(dict(unreachable), GpuHost(**gpu))


@functools.cache
def load(path: Path | None = None) -> Hosts:
    """This project's hosts, from the package's ``hosts.toml`` (or ``path``)."""
    with resources.as_file(resources.files("flashkit.plan") / DATA) as packaged:
        where = path or packaged
        text = read_text(where, what="host facts", error=SpecError, max_bytes=MAX_BYTES)
    return parse(text, str(where))


@dataclass(frozen=True)
class HostSupport:
    build: bool
    gpu_tier: bool
    why: tuple[str, ...]

    def summary(self) -> str:
        """Short form for tables: what can be done with this env on this project's hosts."""
        if not self.build:
            return "render+lock only"
        return "build, cpu+gpu tests" if self.gpu_tier else "build, cpu tests"


def support(spec, hosts: Hosts | None = None) -> HostSupport:
    h = hosts or load()
    g = h.gpu
    why: list[str] = []
    unreachable = h.unreachable.get(spec.base.flavor)
    build = unreachable is None
    if not build:
        why.append(f"image not buildable here: {unreachable}")
    elif spec.base.flavor == "debian":
        why.append(f"base made locally with mmdebstrap ({spec.base.suite}, locked), toolchain from Debian/PyPI")
    else:
        why.append(f"base image {spec.base.ref} reachable from the build host")

    on_host_gpu = any(t.split("+")[0].rstrip("af") == g.sm for t in spec.gpu_targets)
    runs = build and spec.accelerator.kind == g.accelerator and on_host_gpu
    same_torch = spec.torch_series == g.torch and spec.accelerator.major == g.cuda_major
    stable = spec.torch_abi == "stable" and Version(spec.torch_series) <= Version(g.torch)
    gpu = runs and (same_torch or stable)
    sm = f"sm_{g.sm.replace('.', '')}"
    if gpu and same_torch:
        why.append(
            f"the wheel can be tested on the {g.gpu} host (same torch {g.torch} + CUDA {g.cuda_major}, {sm} built)"
        )
    elif gpu:
        beside = "" if spec.accelerator.major == g.cuda_major else ", with the env's CUDA runtime wheel beside torch's"
        why.append(f"the stable-ABI wheel can be tested on the {g.gpu} host under its torch {g.torch}{beside}")
    elif spec.accelerator.kind != g.accelerator:
        why.append(f"no {VENDOR[spec.accelerator.kind]} GPU on this project's hosts")
    elif runs and "device-code" in spec.gpu_evidence:
        why.append(
            f"its wheel cannot load on the {g.gpu} host's torch {g.torch}: GPU evidence through "
            "identical device code (a GPU run of another env's wheel with the same cubins and PTX)"
        )
    else:
        why.append(
            f"GPU tests not possible here: the {g.gpu} host runs torch {g.torch}+cu{g.cuda.replace('.', '')} without "
            "docker, so only a wheel built for that torch can be run there"
        )
    return HostSupport(build=build, gpu_tier=gpu, why=tuple(why))
