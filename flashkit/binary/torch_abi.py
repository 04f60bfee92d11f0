"""How a compiled extension binds to torch, as its symbols and its wheel's label show it.

- Version-bound (ATen/c10): it calls torch's C++ API, whose symbols live in the namespaces
  :data:`TORCH_NAMESPACES` and change between torch minors. Its wheel is labelled
  ``+cu130torch2.11cxx11abiTRUE`` and loads on that torch minor only.
- Stable ABI (torch/csrc/stable, ``TORCH_TARGET_VERSION``): only torch's C shim, the
  ``aoti_torch_*`` and ``torch_*`` C functions of libtorch_cpu.so/libtorch_cuda.so, crosses into
  libtorch. Its wheel is labelled ``+cu13stable2.10`` (CUDA major, oldest torch) and loads on that
  torch and every later one of the CUDA major.

Facts only, shared by the ``abi`` tier and :mod:`flashkit.doctor`, which judge them.
"""

from __future__ import annotations

import re

from flashkit.binary import elf

# C++ namespaces of torch's own API: an undefined symbol in them ties a module to one torch minor.
TORCH_NAMESPACES = ("c10::", "at::", "torch::", "caffe2::")
# torch's stable C shim: C names, never mangled.
TORCH_SHIM_PREFIXES = ("aoti_torch_", "torch_")
# A stable-ABI wheel's local version, as flash_kernels/tools/build_config.stable_local_version writes it.
# No torch minor and no cxx11abi flag: only C symbols cross into libtorch.
STABLE_LABEL = re.compile(r"cu(?P<cu>\d+)stable(?P<major>\d+)\.(?P<minor>\d+)", re.IGNORECASE)


def is_shim_symbol(name: str) -> bool:
    """Whether ``name`` is a function of torch's stable C shim (``aoti_torch_get_dim``, ``torch_library_impl``)."""
    return name.startswith(TORCH_SHIM_PREFIXES)


def wheel_local_version(wheel_name: str) -> str:
    """``cu13stable2.10`` of ``flash_kernels-0.1.0+cu13stable2.10-cp39-abi3-linux_x86_64.whl``; "" without one."""
    parts = wheel_name.split("-")
    return parts[1].partition("+")[2] if len(parts) >= 5 else ""


def stable_abi_target(wheel_name: str) -> tuple[int, int] | None:
    """(2, 10) for a stable-ABI wheel (``+cu13stable2.10``: torch's stable ABI as of torch 2.10); None for a
    version-bound one (``+cu130torch2.11cxx11abiTRUE``) or a wheel without a label."""
    m = STABLE_LABEL.fullmatch(wheel_local_version(wheel_name))
    return (int(m.group("major")), int(m.group("minor"))) if m else None


def torch_cxx_symbols(obj: elf.ElfObject) -> list[str]:
    """The demangled undefined symbols of ``obj`` in torch's C++ namespaces, sorted (mangled without a demangler)."""
    names = elf.demangle(s.name for s in obj.undefined if s.name.startswith("_Z"))
    return sorted({d for d in names.values() if elf.in_namespaces(d, TORCH_NAMESPACES)})
