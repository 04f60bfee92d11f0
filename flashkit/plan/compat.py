"""Compatibility facts as data: what torch, CUDA, ROCm, Debian and the vendor images provide.

Every table says where its rows came from. The rules in flashkit.plan.rules read these tables; adding a
torch release or a Debian suite is a data change here, not a code change there.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

# Python versions with a CPython (not free-threaded) manylinux x86_64 wheel on PyPI, per torch series.
# Source: PyPI's simple index for torch, read 2026-11-30 (every patch release of a series agrees).
TORCH_PYTHONS: dict[str, tuple[str, ...]] = {
    "2.0": ("3.8", "3.9", "3.10", "3.11"),
    "2.1": ("3.8", "3.9", "3.10", "3.11"),
    "2.2": ("3.8", "3.9", "3.10", "3.11", "3.12"),
    "2.3": ("3.8", "3.9", "3.10", "3.11", "3.12"),
    "2.4": ("3.8", "3.9", "3.10", "3.11", "3.12"),
    "2.5": ("3.9", "3.10", "3.11", "3.12", "3.13"),
    "2.6": ("3.9", "3.10", "3.11", "3.12", "3.13"),
    "2.7": ("3.9", "3.10", "3.11", "3.12", "3.13"),
    "2.8": ("3.9", "3.10", "3.11", "3.12", "3.13"),
    "2.9": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.10": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.11": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.12": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.13": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.14": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.15": ("3.11", "3.12", "3.13", "3.14", "3.15"),
}

# PyPI torch series whose triton requirement leaves out some of the Pythons it has wheels for, from the
# wheels' Requires-Dist: torch 2.5.1 pins `triton==3.1.0; ... and python_version < "3.13"` (triton 3.1 has no
# cp313 wheel), so on Python 3.13 that torch comes without triton. Series not listed pin triton for all.
TORCH_TRITON_PYTHONS: dict[str, tuple[str, ...]] = {
    "2.5": ("3.9", "3.10", "3.11", "3.12"),
}

# CUDA version the default Linux x86_64 torch wheel on PyPI is built with, per torch series.
# Source: the wheels on PyPI as measured on 2026-11-30, re-checked for 2.6-2.15 against the wheels' dependencies (2.6-2.10:
# nvidia-cuda-runtime-cu12==12.4/12.6/12.8; 2.11-2.14: cuda-toolkit==13.0.x; 2.15: cuda-toolkit==13.2.2).
TORCH_DEFAULT_CUDA: dict[str, str] = {
    "2.4": "12.1",
    "2.5": "12.4",
    "2.6": "12.4",
    "2.7": "12.6",
    "2.8": "12.8",
    "2.9": "12.8",
    "2.10": "12.8",
    "2.11": "13.0",
    "2.12": "13.0",
    "2.13": "13.0",
    "2.14": "13.0",
    "2.15": "13.2",
}

# The CUDA versions PyTorch's own index (https://download.pytorch.org/whl/cuXYZ) has Linux x86_64 torch wheels
# for, per torch series: what `torch.version.cuda` reports for a torch installed from there rather than PyPI.
# Source: the "Linux and Windows" wheel commands of https://pytorch.org/get-started/previous-versions
# (v2.6.0 to v2.9.1). Series not listed: only their PyPI default (above) is known here.
TORCH_INDEX_CUDA: dict[str, tuple[str, ...]] = {
    "2.6": ("11.8", "12.4", "12.6"),
    "2.7": ("11.8", "12.6", "12.8"),
    "2.8": ("12.6", "12.8", "12.9"),
    "2.9": ("12.6", "12.8", "13.0"),
}


@dataclass(frozen=True)
class PlatformFloor:
    """The oldest Linux every published wheel must load on: the glibc, libstdc++ (GLIBCXX_) and C++ ABI (CXXABI_)
    versions it may need at most, which the abi tier holds every build to."""

    glibc: str
    glibcxx: str
    cxxabi: str
    systems: str

    def text(self) -> str:
        return f"Linux x86_64 with glibc >= {self.glibc} and GCC 12's libstdc++ or newer ({self.systems})"


# Debian 12 (glibc 2.36, GCC 12) and Ubuntu 22.04 (glibc 2.35, GCC 12's libstdc++ 3.4.30), the oldest systems
# the builds here can serve: bookworm's own toolchain is that old, and trixie's wheels are compiled with its
# g++-12 (DebianSuite.extension_gcc). torch's own wheels ask less (manylinux_2_28); a wheel of ours never asks
# more than this.
PLATFORM_FLOOR = PlatformFloor(
    glibc="2.35", glibcxx="3.4.30", cxxabi="1.3.13", systems="Debian 12, Ubuntu 22.04 or newer"
)

# From torch 2.7 the PyPI wheels are manylinux_2_28 and built with the cxx11 ABI; older ones are not.
PYPI_CXX11_ABI_FROM = Version("2.7")

# The oldest torch whose stable C ABI (torch/csrc/stable, TORCH_TARGET_VERSION) has everything flash_kernels'
# entry points use; see flash_kernels/STABLE_ABI.md. A wheel built that way loads on that torch and every
# later one of the same CUDA major, so it is not tied to the build's torch minor.
STABLE_ABI_MIN_TORCH = Version("2.10")

# CUDA 13 support arrived in torch 2.9 (first release with CUDA 13 builds).
CUDA13_MIN_TORCH = Version("2.9")


@dataclass(frozen=True)
class ArchSupport:
    min_cuda: Version
    # First CUDA major that dropped the target (None: still supported).
    dropped_in_major: int | None = None


# Compute capabilities nvcc can target, with the first CUDA release that knows them. Source: CUDA
# toolkit release notes (sm_90 since 11.8; sm_100/sm_120 since 12.8; sm_103/sm_121 since 12.9;
# CUDA 13.0 dropped sm_5x-sm_72 and renamed Thor's sm_101 to sm_110).
CUDA_ARCHS: dict[str, ArchSupport] = {
    "7.0": ArchSupport(Version("9.0"), dropped_in_major=13),
    "7.5": ArchSupport(Version("10.0")),
    "8.0": ArchSupport(Version("11.0")),
    "8.6": ArchSupport(Version("11.1")),
    "8.7": ArchSupport(Version("11.4")),
    "8.9": ArchSupport(Version("11.8")),
    "9.0": ArchSupport(Version("11.8")),
    "10.0": ArchSupport(Version("12.8")),
    "10.3": ArchSupport(Version("12.9")),
    "11.0": ArchSupport(Version("13.0")),
    "12.0": ArchSupport(Version("12.8")),
    "12.1": ArchSupport(Version("12.9")),
}
# Arch-specific ("9.0a") targets need CUDA 12.0; family-specific ("10.0f") targets need CUDA 12.9.
ARCH_SUFFIX_MIN_CUDA = {"a": Version("12.0"), "f": Version("12.9")}

# flash_kernels' CUDA path uses Ampere features (cp.async, bf16 mma): sm_80 is the floor.
KERNELS_MIN_SM = Version("8.0")

# AMD GPU targets with the first ROCm release that supports them. Source: ROCm release notes
# (MI200 gfx90a from 5.0, MI300 gfx942 from 6.0, MI350 gfx950 from 7.0).
ROCM_GFX: dict[str, Version] = {
    "gfx90a": Version("5.0"),
    "gfx942": Version("6.0"),
    "gfx950": Version("7.0"),
}


@dataclass(frozen=True)
class DebianSuite:
    release: int  # Debian's release number: a newer suite keeps the C and C++ runtimes of an older one
    python: str
    cuda: str | None  # CUDA version of the suite's non-free nvidia-cuda-toolkit
    toolkit_version: str | None  # exact Debian version of nvidia-cuda-toolkit
    # Exact versions of the packages the template installs; `apt-get install pkg=version` fails loudly
    # when the mirror no longer carries them, which is the reproducible failure we want.
    packages: dict[str, str]
    # nvcc of this suite accepts GCC up to this major; nvcc compiles the CUDA sources' host side with it.
    cuda_host_gcc: str | None = None
    # The GCC the extension's C++ sources are compiled with (CXX), where the suite's default g++ is newer than
    # the oldest systems the wheel is for: each GCC's libstdc++ headers add symbols only its own runtime has
    # (GCC 13's std::ios_base_library_init, GLIBCXX_3.4.32; GCC 14's __cxa_call_terminate, CXXABI_1.3.15), and
    # a wheel that needs them fails to load on Debian 12 or Ubuntu 22.04. nvcc keeps its own host GCC, so the
    # device code does not change. None: the suite's g++ is that old already.
    extension_gcc: str | None = None


# Source: `apt-cache madison` against deb.debian.org (trixie and bookworm main + non-free), 2026-11-30.
DEBIAN_SUITES: dict[str, DebianSuite] = {
    "bookworm": DebianSuite(
        release=12,
        python="3.11",
        cuda="11.8",
        toolkit_version="11.8.89~11.8.0-5~deb12u1",
        packages={
            "python3": "3.11.2-1+b1",
            "python3-venv": "3.11.2-1+b1",
            "python3-dev": "3.11.2-1+b1",
            "g++": "4:12.2.0-3",
            "ca-certificates": "20230311+deb12u1",
        },
    ),
    "trixie": DebianSuite(
        release=13,
        python="3.13",
        cuda="12.4",
        toolkit_version="12.4.131~12.4.1-2",
        packages={
            "python3": "3.13.5-1",
            "python3-venv": "3.13.5-1",
            "python3-dev": "3.13.5-1",
            "g++": "4:14.2.0-1",
            "g++-13": "13.3.0-16",
            "g++-12": "12.4.0-5",
            "ca-certificates": "20250419+deb13u1",
        },
        cuda_host_gcc="13",
        extension_gcc="12",
    ),
}

# The PyPI nvcc wheels: only the CUDA 13 series ships the nvcc driver (the -cu12 wheels carry ptxas
# and libnvvm only, as measured on the build host). nvcc, nvvm and crt must share one exact version.
PYPI_NVCC_MIN_MAJOR = 13
PYPI_NVCC_SAME_VERSION = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt")

# The kernel suite's CPU tier runs Triton's interpreter, which the triton that torch 2.7 and 2.11 pin
# (3.3.1, 3.6.0) cannot run under numpy >= 2.4: 71 of 95 CPU tests failed in both images with
# "InterpreterError: only 0-dimensional arrays can be converted to Python scalars"; numpy 2.3.5 passed
# all of them (2026-11-30, flashkit test cu130-torch211 / cu124-torch27).
NUMPY_FOR_TRITON_INTERPRETER = "numpy<2.4"

# Python of the Ubuntu releases nvidia/cuda images are built on.
UBUNTU_PYTHON: dict[str, str] = {"22.04": "3.10", "24.04": "3.12"}


@dataclass(frozen=True)
class NgcRelease:
    torch: str
    cuda: str
    python: str
    source: str


# NGC PyTorch container contents. Source: NVIDIA's PyTorch release notes (docs.nvidia.com/deeplearning/
# frameworks/pytorch-release-notes/rel-25-12.html): based on CUDA 13.1.0, PyTorch 2.10.0a0+b4e4ee81d3,
# installed under /usr/local/lib/python3.12/dist-packages.
NGC_RELEASES: dict[str, NgcRelease] = {
    "25.12": NgcRelease(
        torch="2.10.0a0+b4e4ee81d3",
        cuda="13.1",
        python="3.12",
        source="https://docs.nvidia.com/deeplearning/frameworks/pytorch-release-notes/rel-25-12.html",
    ),
}


def series(version: str) -> str:
    """``"2.7"`` for ``"2.7.1"`` or ``"2.10.0a0+b4e4ee81d3"``."""
    v = Version(version)
    return f"{v.major}.{v.minor}"
