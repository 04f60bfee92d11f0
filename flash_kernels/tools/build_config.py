"""Pure build decisions for flash_kernels' setup.py: arch flags, job sizing, versions.

Everything here takes plain values (environment strings, core counts, byte counts, version strings) and
returns plain values, so it is testable without torch, nvcc or a GPU (tools/tests/test_build_config.py).
setup.py does the probing and passes the results in.
"""

from __future__ import annotations

import dataclasses
import os
import re

# sm_80 is the oldest target: the kernels use cp.async and bf16 mma.sync, both Ampere instructions.
MIN_ARCH = (8, 0)
# 9.0a: Hopper's arch-specific code (wgmma), which the sm_90 forward kernel needs; its cubin runs on cc 9.0
# only, so newer GPUs get the generic compute_90 PTX instead (see gencode_flags).
DEFAULT_ARCHS = "8.0;9.0a"

# Memory allowed per concurrent compile job. Measured peaks on the build host (/usr/bin/time -v, see
# benchmarks/results/cuda_build.md): nvcc on one instantiation file for sm_80+sm_90 0.22 GB; g++ on
# ops.cpp (torch headers) about 1.0 GB, the largest job. 1 GiB covers the largest with the many small
# nvcc jobs leaving headroom for the linker and other users of the machine.
NVCC_MEM_PER_JOB_BYTES = 1 * 1024**3


class BuildConfigError(ValueError):
    """A build setting is invalid; the message says which variable, what is allowed and what to do."""


@dataclasses.dataclass(frozen=True)
class CudaArch:
    major: int
    minor: int
    ptx: bool = False  # also embed PTX of this arch (forward compatibility with newer GPUs)
    specific: bool = False  # "9.0a": arch-specific instructions (wgmma), a cubin for exactly this GPU

    @property
    def sm(self) -> str:
        return f"{self.major}{self.minor}" + ("a" if self.specific else "")

    @property
    def generic_sm(self) -> str:
        return f"{self.major}{self.minor}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}" + ("a" if self.specific else "") + ("+PTX" if self.ptx else "")


_ARCH_RE = re.compile(r"^(\d+)\.(\d+)(a)?(\+PTX)?$", re.IGNORECASE)


def parse_arch_list(text: str, variable: str) -> list[CudaArch]:
    """Parse "8.0;9.0a" / "8.0 9.0+PTX" (TORCH_CUDA_ARCH_LIST syntax) into sorted, unique archs.

    PTX is always added for the newest arch, so a GPU newer than every cubin can still JIT it.
    "9.0" and "9.0a" together collapse to "9.0a" (its cubin covers the same GPUs).
    """
    items = [t for t in re.split(r"[;\s,]+", text.strip()) if t]
    if not items:
        raise BuildConfigError(f"{variable} is empty; set it to e.g. {DEFAULT_ARCHS!r} or unset it")
    archs: dict[tuple[int, int], CudaArch] = {}
    for item in items:
        m = _ARCH_RE.match(item)
        if not m:
            raise BuildConfigError(
                f"{variable}: {item!r} is not a CUDA arch; use MAJOR.MINOR with an optional 'a' and +PTX, "
                f"separated by ';' (e.g. {DEFAULT_ARCHS!r})"
            )
        major, minor = int(m.group(1)), int(m.group(2))
        if (major, minor) < MIN_ARCH:
            raise BuildConfigError(
                f"{variable}: arch {major}.{minor} is older than sm_80, which the CUDA kernels need "
                f"(cp.async, bf16 tensor cores); remove it (older GPUs use the Triton path)"
            )
        specific = bool(m.group(3))
        if specific and (major, minor) != (9, 0):
            raise BuildConfigError(
                f"{variable}: {item!r}: the only arch-specific target the kernels have code for is 9.0a "
                f"(Hopper's wgmma); use {major}.{minor} without the 'a'"
            )
        prev = archs.get((major, minor))
        archs[(major, minor)] = CudaArch(
            major,
            minor,
            bool(m.group(4)) or (prev.ptx if prev else False),
            specific or (prev.specific if prev else False),
        )
    ordered = [archs[k] for k in sorted(archs)]
    newest = ordered[-1]
    ordered[-1] = dataclasses.replace(newest, ptx=True)
    return ordered


def select_arch_list(env: dict[str, str]) -> tuple[list[CudaArch], str]:
    """FLASH_KERNELS_CUDA_ARCHS wins over TORCH_CUDA_ARCH_LIST; returns (archs, where it came from)."""
    for var in ("FLASH_KERNELS_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST"):
        if env.get(var, "").strip():
            return parse_arch_list(env[var], var), var
    return parse_arch_list(DEFAULT_ARCHS, "default"), f"default ({DEFAULT_ARCHS})"


def gencode_flags(archs: list[CudaArch]) -> list[str]:
    """Real code (cubin) for every arch, PTX where asked (always for the newest).

    PTX is always the generic arch's (compute_90 for 9.0a): arch-specific PTX would JIT on no other GPU,
    which defeats its purpose. The -gencode form, not -arch=sm_90a: the shorthand also runs a plain sm_90
    pass, which rejects wgmma.
    """
    flags = []
    for a in archs:
        flags.append(f"-gencode=arch=compute_{a.sm},code=sm_{a.sm}")
        if a.ptx:
            flags.append(f"-gencode=arch=compute_{a.generic_sm},code=compute_{a.generic_sm}")
    return flags


def define_flags(archs: list[CudaArch]) -> list[str]:
    """-D flags for the host and device compilers: FLASH_KERNELS_SM90A when 9.0a code is compiled, so the
    host dispatch (ops.cpp) offers the wgmma forward kernel only when the module carries it."""
    return ["-DFLASH_KERNELS_SM90A=1"] if any(a.specific for a in archs) else []


@dataclasses.dataclass(frozen=True)
class JobPlan:
    max_jobs: int
    nvcc_threads: int
    reason: str


def _positive_int(env: dict[str, str], var: str) -> int | None:
    raw = env.get(var, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise BuildConfigError(f"{var}={raw!r}: must be a positive integer (or unset to size it automatically)")
    return int(raw)


def plan_jobs(env: dict[str, str], cores: int, mem_available_bytes: int | None, n_archs: int) -> JobPlan:
    """Choose ninja's MAX_JOBS and nvcc's --threads so that jobs x threads fits cores and free memory.

    Each nvcc thread compiles one arch of one file, so parallel compiler processes = jobs x threads,
    and each needs about NVCC_MEM_PER_JOB_BYTES. Files outnumber archs, so parallelism goes to ninja
    jobs first (less duplicated front-end work) and to nvcc threads only with cores to spare.
    """
    env_jobs = _positive_int(env, "MAX_JOBS")
    env_threads = _positive_int(env, "NVCC_THREADS")
    cores = max(1, cores)
    if mem_available_bytes is None:
        by_mem, mem_text = cores, "MemAvailable unknown"
    else:
        by_mem = max(1, mem_available_bytes // NVCC_MEM_PER_JOB_BYTES)
        mem_text = (f"MemAvailable {mem_available_bytes / 1024**3:.1f} GiB / "
                    f"{NVCC_MEM_PER_JOB_BYTES / 1024**3:.0f} GiB per job = {by_mem}")
    budget = max(1, min(cores, by_mem))
    parts = []
    if env_jobs is not None:
        jobs = env_jobs
        parts.append(f"MAX_JOBS={jobs} from the environment")
    else:
        jobs = budget
        parts.append(f"MAX_JOBS={jobs} = min(cores {cores}, {mem_text})")
    if env_threads is not None:
        threads = env_threads
        parts.append(f"NVCC_THREADS={threads} from the environment")
    else:
        threads = max(1, min(n_archs, budget // jobs))
        parts.append(f"NVCC_THREADS={threads} = min(archs {n_archs}, spare budget {budget}//{jobs})")
    return JobPlan(jobs, threads, "; ".join(parts))


def mem_available_from_meminfo(text: str) -> int | None:
    """Bytes of MemAvailable from the text of /proc/meminfo, or None if absent."""
    m = re.search(r"^MemAvailable:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def local_version(torch_version: str, cuda_version: str, cxx11_abi: bool) -> str:
    """Local version label of a compiled wheel, e.g. cu130torch2.11cxx11abiTRUE.

    Minor torch versions differ in C++ ABI, so the label names torch's major.minor; the CUDA part
    names the toolkit torch was built with (which the build checked nvcc's major against).
    """
    tm = re.match(r"^(\d+)\.(\d+)", torch_version)
    cm = re.match(r"^(\d+)\.(\d+)", cuda_version)
    if not tm or not cm:
        raise BuildConfigError(
            f"cannot read versions torch={torch_version!r} cuda={cuda_version!r} (expected MAJOR.MINOR...)"
        )
    return f"cu{cm.group(1)}{cm.group(2)}torch{tm.group(1)}.{tm.group(2)}cxx11abi{'TRUE' if cxx11_abi else 'FALSE'}"


# The oldest torch whose stable ABI has everything ops.cpp uses (STABLE_ABI.md has the table): 2.10 adds
# torch::stable::empty with a device, typed const/mutable data pointers, std::vector (int[]) returns and
# versioned op registration (torch_library_impl). A stable build targets it through TORCH_TARGET_VERSION,
# so one wheel loads on this torch and every later one.
STABLE_ABI_TARGET = (2, 10)
TORCH_ABI_MODES = ("stable", "version")


def _major_minor(version: str, what: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", version)
    if not m:
        raise BuildConfigError(f"cannot read {what} version {version!r} (expected MAJOR.MINOR...)")
    return int(m.group(1)), int(m.group(2))


def torch_abi_mode(env: dict[str, str], torch_version: str) -> str:
    """FLASH_KERNELS_TORCH_ABI: 'stable' (torch's stable C ABI: one wheel for torch >= STABLE_ABI_TARGET),
    'version' (ATen/c10: the wheel is bound to the build's torch minor), 'auto' (stable where the build's
    torch has it, and the default)."""
    raw = env.get("FLASH_KERNELS_TORCH_ABI", "").strip().lower() or "auto"
    if raw not in (*TORCH_ABI_MODES, "auto"):
        raise BuildConfigError(
            f"FLASH_KERNELS_TORCH_ABI={raw!r}: use stable (torch's stable ABI, one wheel for torch >= "
            f"{STABLE_ABI_TARGET[0]}.{STABLE_ABI_TARGET[1]}), version (bound to the build's torch) or auto")
    has_stable = _major_minor(torch_version, "torch") >= STABLE_ABI_TARGET
    if raw == "auto":
        return "stable" if has_stable else "version"
    if raw == "stable" and not has_stable:
        t = ".".join(map(str, STABLE_ABI_TARGET))
        raise BuildConfigError(
            f"FLASH_KERNELS_TORCH_ABI=stable needs torch >= {t} at build time, but this is torch {torch_version}: "
            f"the stable ABI the extension targets ({t}: TORCH_TARGET_VERSION, torch::stable::empty, typed data "
            f"pointers, int[] returns, torch_library_impl) is not in its headers. Fix: build with torch {t} or "
            "newer (the wheel then runs on that torch and every later one), or FLASH_KERNELS_TORCH_ABI=version.")
    return raw


def stable_abi_flags(target: tuple[int, int] = STABLE_ABI_TARGET) -> list[str]:
    """Host-compiler flags of a stable-ABI build: csrc/torch_api.h's switch, and TORCH_TARGET_VERSION in
    torch's encoding (major << 56 | minor << 48), with which torch's non-stable headers refuse to compile."""
    major, minor = target
    return ["-DFLASH_KERNELS_STABLE_ABI=1", f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000"]


def stable_local_version(cuda_version: str, target: tuple[int, int] = STABLE_ABI_TARGET) -> str:
    """Local version label of a stable-ABI wheel, e.g. cu13stable2.10: the CUDA major (one runtime soname per
    major) and the oldest torch whose stable ABI it uses. No torch minor and no cxx11abi flag: only C
    symbols cross into libtorch."""
    cuda_major, _ = _major_minor(cuda_version, "CUDA")
    return f"cu{cuda_major}stable{target[0]}.{target[1]}"


_CPLUSPLUS_STD = {201703: "c++17", 202002: "c++20", 202302: "c++23"}
MIN_CXX_STD = "c++17"


def host_cxx_std(aten_header_text: str | None) -> str:
    """The C++ standard for the host compiler: the one torch's own ATen.h demands (its
    ``#if __cplusplus < NNNNNNL`` / ``#error C++NN or later`` guard), at least C++17.

    torch 2.15's headers require C++20 while 2.11's accept C++17, and g++'s default (gnu++17) fails the
    newer ones; asking the headers rather than keeping a version table stays right for the next torch.
    The .cu files include no torch header and keep C++17, so their objects do not depend on the torch.
    """
    if not aten_header_text:
        return MIN_CXX_STD
    found = [int(v) for v in re.findall(r"__cplusplus\s*<\s*(\d{6})L", aten_header_text)]
    need = max(found, default=0)
    if need and need not in _CPLUSPLUS_STD:
        raise BuildConfigError(
            f"torch's ATen.h requires __cplusplus >= {need}L, a standard this build does not know; "
            "update tools/build_config.py:_CPLUSPLUS_STD")
    return _CPLUSPLUS_STD[need] if need > 201703 else MIN_CXX_STD


def check_cuda_major(nvcc_version: str, torch_cuda: str, cuda_home: str) -> None:
    """nvcc and torch must share the CUDA major (device code and runtime calls must match the driver API torch uses).

    A different minor works (cpp_extension only warns); a different major fails at load or at run time.
    """
    nv_major = nvcc_version.split(".")[0]
    t_major = torch_cuda.split(".")[0]
    if nv_major != t_major:
        raise BuildConfigError(
            f"nvcc at {cuda_home} is CUDA {nvcc_version}, but torch was built with CUDA {torch_cuda}: the majors "
            f"must match. Fix: point CUDA_HOME at a CUDA {t_major}.x toolkit, or install the torch build for "
            f"CUDA {nv_major}, or build the Triton-only wheel with FLASH_KERNELS_BUILD_CUDA=0."
        )


def check_shared_libstdcxx(compiler: str, print_file_name: str, found: bool) -> None:
    """The C++ compiler must link libstdc++ as the shared library torch itself uses.

    `print_file_name` is `<compiler> -print-file-name=libstdc++.so`; `found` whether that names an existing
    file. A toolchain without the shared library (a GCC built or installed with only libstdc++.a) links the
    archive into the extension instead. The module then carries a second libstdc++ whose iostream and locale
    code runs against the state of the one torch loaded; where the two differ in version, the process dies
    of SIGSEGV the first time an error message formats a number (seen on a GPU host whose CXX was such a
    GCC): a bad shape or running out of memory crashes instead of raising.
    """
    if os.path.isabs(print_file_name) and found:
        return
    raise BuildConfigError(
        f"the C++ compiler {compiler!r} has no shared libstdc++ (`{compiler} -print-file-name=libstdc++.so` gives "
        f"{print_file_name.strip()!r}), so it would link libstdc++.a into the extension, which then crashes the "
        "process when it reports an error (two libstdc++ copies in one process). Fix: build with a compiler "
        "whose libstdc++.so is installed, e.g. CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ (Debian/Ubuntu: "
        "apt-get install g++), or install that toolchain's shared libstdc++."
    )


def parse_nvcc_version(output: str) -> str:
    """'Cuda compilation tools, release 13.0, V13.0.88' -> '13.0'."""
    m = re.search(r"release (\d+\.\d+)", output)
    if not m:
        raise BuildConfigError(
            f"could not read the CUDA release from `nvcc --version` output: {output.strip()[:200]!r}")
    return m.group(1)


def build_cuda_setting(env: dict[str, str]) -> bool | None:
    """FLASH_KERNELS_BUILD_CUDA: '1' force (every obstacle is an error), '0' Triton-only, unset: auto."""
    raw = env.get("FLASH_KERNELS_BUILD_CUDA", "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise BuildConfigError(
        f"FLASH_KERNELS_BUILD_CUDA={raw!r}: use 1 (require the CUDA extension), 0 (Triton-only) "
        "or leave unset (auto)")


def limited_api_tag(limited_hex: str) -> str:
    """'0x03090000' (a Py_LIMITED_API value) -> 'cp39', the wheel's abi3 python tag."""
    m = re.fullmatch(r"0x([0-9a-fA-F]{2})([0-9a-fA-F]{2})[0-9a-fA-F]{4}", limited_hex.strip())
    if not m:
        raise BuildConfigError(f"cannot read Py_LIMITED_API value {limited_hex!r} (expected like 0x03090000)")
    return f"cp{int(m.group(1), 16)}{int(m.group(2), 16)}"
