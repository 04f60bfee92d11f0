"""Build flash_kernels: a cp39-abi3 wheel with the CUDA extension, or a pure Triton-only wheel.

Which one is decided here, before anything compiles, and said on stderr:
- the CUDA wheel needs torch importable at build time (build with `pip wheel --no-build-isolation`),
  a CUDA (not ROCm) torch, nvcc whose CUDA major matches torch's, and ninja;
- otherwise the Triton-only wheel (py3-none-any), unless FLASH_KERNELS_BUILD_CUDA=1 makes that an error.
FLASH_KERNELS_TORCH_ABI picks how ops.cpp binds to torch: `stable` (torch's stable C ABI, torch >= 2.10 at
build time; the wheel serves torch 2.10 and later) or `version` (ATen/c10; the wheel serves the build's torch
minor only); `auto`, the default, is stable where the build's torch has it. See STABLE_ABI.md.
The pure decisions (arch flags, job sizing, version label, ABI mode) live in tools/build_config.py.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tools import build_config as bc  # noqa: E402  (needs HERE on sys.path)

BASE_VERSION = "0.1.0"
# Oldest CPython whose stable ABI the extension targets when torch does not choose one itself.
DEFAULT_LIMITED_API_HEX = "0x03090000"


def say(msg: str) -> None:
    print(f"flash_kernels setup: {msg}", file=sys.stderr, flush=True)


class SkipCuda(Exception):
    """The CUDA extension cannot be built here; the message says why (Triton-only wheel instead)."""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return bc.mem_available_from_meminfo(f.read())
    except OSError:
        return None


def cuda_extension_and_cmdclass():
    """Return (ext_modules, cmdclass, local_version, abi3 tag); raise SkipCuda with the reason when not buildable."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as e:
        raise SkipCuda(
            f"torch is not importable in the build environment ({e}); the CUDA extension is built against "
            "the installed torch, so build with `pip wheel --no-build-isolation` in an environment that has it"
        ) from None
    if getattr(torch.version, "hip", None):
        raise SkipCuda(f"torch {torch.__version__} is a ROCm build; the CUDA kernels are NVIDIA-only")
    if not torch.version.cuda:
        raise SkipCuda(f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)")
    cuda_home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else None
    if not nvcc or not os.path.exists(nvcc):
        raise SkipCuda("no nvcc found (set CUDA_HOME to a CUDA toolkit to build the CUDA extension)")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    nvcc_version = bc.parse_nvcc_version(out)
    # nvcc learned -frandom-seed in CUDA 12.x (12.4 rejects it); ask this nvcc rather than guess the version.
    nvcc_help = subprocess.run([nvcc, "--help"], capture_output=True, text=True).stdout
    seed_flags = ["-frandom-seed=flash_kernels"] if "frandom-seed" in nvcc_help else []
    # Checked before compiling: a major mismatch would otherwise surface as a load or launch failure.
    bc.check_cuda_major(nvcc_version, torch.version.cuda, cuda_home)
    if not cpp_extension.is_ninja_available():
        raise bc.BuildConfigError(
            "ninja is required to compile the CUDA extension in parallel but was not found; "
            "fix: `pip install ninja` in the build environment (or FLASH_KERNELS_BUILD_CUDA=0 for Triton-only)"
        )

    # The compiler cpp_extension links with (CXX, else c++) must link libstdc++ dynamically: asked here, before
    # a 1-3 minute compile, because a statically linked copy only shows when the module first raises.
    get_cxx = getattr(cpp_extension, "get_cxx_compiler", None)
    cxx = get_cxx() if get_cxx else os.environ.get("CXX", "c++")
    try:
        libstdcxx = subprocess.run(
            [cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise bc.BuildConfigError(
            f"the C++ compiler {cxx!r} could not be run ({e}); set CXX to a C++ compiler"
        ) from None
    bc.check_shared_libstdcxx(cxx, libstdcxx, os.path.exists(libstdcxx))

    # torch >= 2.6 adds -DPy_LIMITED_API=<its oldest supported CPython> to py_limited_api extensions
    # (0x030A0000 in torch 2.11), after our flags, so that value is what the .so is really built
    # against; the wheel tag follows it, so the tag never claims an older CPython than the build used.
    limited_hex = getattr(cpp_extension, "min_supported_cpython", None)
    limited_flags = [] if limited_hex else [f"-DPy_LIMITED_API={DEFAULT_LIMITED_API_HEX}"]
    limited_tag = bc.limited_api_tag(limited_hex or DEFAULT_LIMITED_API_HEX)

    archs, arch_source = bc.select_arch_list(os.environ)
    plan = bc.plan_jobs(os.environ, _cores(), _mem_available(), len(archs))
    # cpp_extension's ninja build reads MAX_JOBS from the environment.
    os.environ["MAX_JOBS"] = str(plan.max_jobs)
    # FLASH_KERNELS_TORCH_ABI: stable (torch's stable C ABI; csrc/torch_api.h, STABLE_ABI.md) or version.
    abi_mode = bc.torch_abi_mode(os.environ, torch.__version__)
    if abi_mode == "stable":
        abi_flags = bc.stable_abi_flags()
        local = bc.stable_local_version(torch.version.cuda)
        target = ".".join(map(str, bc.STABLE_ABI_TARGET))
        abi_text = f"stable (C shim only; loads on torch >= {target})"
    else:
        abi_flags = []
        local = bc.local_version(torch.__version__, torch.version.cuda, bool(torch._C._GLIBCXX_USE_CXX11_ABI))
        abi_text = f"version-bound (ATen/c10 of torch {torch.__version__})"
    torch_include = cpp_extension.include_paths()[0]
    try:
        with open(os.path.join(torch_include, "ATen", "ATen.h"), encoding="utf-8") as f:
            host_std = bc.host_cxx_std(f.read())
    except OSError:
        host_std = bc.host_cxx_std(None)
    # Header paths reach the .so through __FILE__ in torch's check macros; mapped to fixed names, the bytes
    # do not depend on where torch or CUDA is installed (a venv, system site-packages, /usr/local/cuda).
    prefix_maps = [f"-fmacro-prefix-map={torch_include}=torch/include", f"-fmacro-prefix-map={cuda_home}=cuda"]
    say(f"building the CUDA extension: torch {torch.__version__}, nvcc {nvcc_version} at {cuda_home}")
    say(f"torch ABI: {abi_text}; local version +{local}; host C++ standard {host_std} (torch's headers)")
    say(f"archs {', '.join(map(str, archs))} (from {arch_source}); CPython limited API {limited_tag}-abi3")
    say(f"jobs: {plan.reason}")
    if not seed_flags:
        say(f"nvcc {nvcc_version} has no -frandom-seed: the compiled module is not bit-reproducible")

    csrc = os.path.join("csrc")
    sources = sorted(glob.glob(os.path.join(csrc, "*.cpp"))) + sorted(
        glob.glob(os.path.join(csrc, "instantiations", "*.cu"))
    )
    if not any(s.endswith(".cu") for s in sources):
        raise bc.BuildConfigError(
            "csrc/instantiations/ has no .cu files; regenerate them with `python tools/generate_instantiations.py`"
        )
    ext = cpp_extension.CUDAExtension(
        name="flash_kernels._C",
        sources=sources,
        include_dirs=[os.path.join(HERE, "csrc")],
        py_limited_api=True,
        # nvcc names each intermediate file tmpxft_<pid>_..., and that name reaches the .so as a local FILE
        # symbol, so two builds of the same sources differed. Dropping local symbols (-x) makes the .so a
        # function of the sources and toolchain only; exported and dynamic symbols are untouched.
        extra_link_args=["-Wl,-x"],
        extra_compile_args={
            # Only the host compiler sees the ABI flags: the .cu files include no torch header, so their
            # objects are the same in both modes.
            "cxx": ["-O3", f"-std={host_std}", *prefix_maps, *limited_flags, *bc.define_flags(archs), *abi_flags],
            "nvcc": [
                "-O3",
                "-std=c++17",
                "--use_fast_math",
                "--expt-relaxed-constexpr",
                # nvcc otherwise draws a fresh random number into the names of internal-linkage functions
                # (_INTERNAL_<file hash>_..._<n>), so two builds of one source differed. A fixed seed is
                # safe for every file: the names already carry the file's own hash.
                *seed_flags,
                # Line tables (for compute-sanitizer/ncu source lines) only on request: they embed each
                # header's mtime, and the CUDA headers' mtimes are their install time in the image.
                *(["-lineinfo"] if os.environ.get("FLASH_KERNELS_LINEINFO") == "1" else []),
                f"--threads={plan.nvcc_threads}",
                *bc.gencode_flags(archs),
                *bc.define_flags(archs),
                *limited_flags,
            ],
        },
    )
    build_ext = cpp_extension.BuildExtension.with_options(use_ninja=True)
    return [ext], {"build_ext": build_ext}, local, limited_tag


def main() -> None:
    try:
        want = bc.build_cuda_setting(os.environ)
    except bc.BuildConfigError as err:
        raise SystemExit(f"flash_kernels setup: {err}") from None
    ext_modules, cmdclass, options, version = [], {}, {}, BASE_VERSION
    if "sdist" in sys.argv[1:]:
        # A source distribution serves every torch/CUDA combination: plain version, sources only
        # (MANIFEST.in); the wheel built from it decides CUDA or Triton-only as below.
        say("source distribution: sources only, no local version")
    elif want is False:
        say("FLASH_KERNELS_BUILD_CUDA=0: building the Triton-only wheel (no compiled extension)")
    else:
        try:
            ext_modules, cmdclass, local, limited_tag = cuda_extension_and_cmdclass()
            version = f"{BASE_VERSION}+{local}"
            options = {"bdist_wheel": {"py_limited_api": limited_tag}}
        except SkipCuda as why:
            if want is True:
                raise SystemExit(f"flash_kernels setup: FLASH_KERNELS_BUILD_CUDA=1 but {why}") from None
            say(f"building the Triton-only wheel: {why}")
        except bc.BuildConfigError as err:
            raise SystemExit(f"flash_kernels setup: {err}") from None
    setup(
        version=version,
        packages=find_packages(where=HERE, include=["flash_kernels", "flash_kernels.*"]),
        ext_modules=ext_modules,
        cmdclass=cmdclass,
        options=options,
    )


main()
