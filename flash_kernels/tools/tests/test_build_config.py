"""Tests of the pure build decisions (tools/build_config.py) and of the generated instantiation files.

Run from the repository root:  python -m pytest flash_kernels/tools/tests -q   (no torch, nvcc or GPU needed)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2]))
from tools import build_config as bc
from tools import generate_instantiations as gen

GiB = 1024**3


def test_arch_list_sorted_unique_and_ptx_on_newest():
    archs = bc.parse_arch_list("9.0;8.0 8.0,8.6", "X")
    assert [str(a) for a in archs] == ["8.0", "8.6", "9.0+PTX"]


def test_arch_list_keeps_explicit_ptx():
    assert [str(a) for a in bc.parse_arch_list("8.0+PTX;9.0", "X")] == ["8.0+PTX", "9.0+PTX"]


@pytest.mark.parametrize("bad", ["7.5", "sm_80", "8", "", "8.0;abc"])
def test_arch_list_rejects_with_variable_name(bad):
    with pytest.raises(bc.BuildConfigError, match="VAR"):
        bc.parse_arch_list(bad, "VAR")


def test_arch_source_precedence():
    env = {"FLASH_KERNELS_CUDA_ARCHS": "9.0", "TORCH_CUDA_ARCH_LIST": "8.0"}
    archs, source = bc.select_arch_list(env)
    assert source == "FLASH_KERNELS_CUDA_ARCHS" and [a.sm for a in archs] == ["90"]
    archs, source = bc.select_arch_list({"TORCH_CUDA_ARCH_LIST": "8.0"})
    assert source == "TORCH_CUDA_ARCH_LIST"
    archs, source = bc.select_arch_list({})
    assert [a.sm for a in archs] == ["80", "90a"] and source.startswith("default")


def test_gencode_flags():
    assert bc.gencode_flags(bc.parse_arch_list("8.0;9.0", "X")) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]
    assert bc.define_flags(bc.parse_arch_list("8.0;9.0", "X")) == []


def test_gencode_flags_arch_specific_hopper():
    archs = bc.parse_arch_list("8.0;9.0a", "X")
    # sm_90a cubin for the wgmma kernel; the PTX stays generic so newer GPUs can JIT it.
    assert bc.gencode_flags(archs) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90,code=compute_90",
    ]
    assert bc.define_flags(archs) == ["-DFLASH_KERNELS_SM90A=1"]
    assert [str(a) for a in bc.parse_arch_list("9.0;9.0a", "X")] == ["9.0a+PTX"]


def test_arch_specific_only_for_hopper():
    with pytest.raises(bc.BuildConfigError, match=r"only arch-specific target.*9.0a"):
        bc.parse_arch_list("8.0a", "TORCH_CUDA_ARCH_LIST")


def test_jobs_limited_by_cores():
    plan = bc.plan_jobs({}, cores=2, mem_available_bytes=22 * GiB, n_archs=2)
    assert (plan.max_jobs, plan.nvcc_threads) == (2, 1)
    assert "cores 2" in plan.reason


def test_jobs_limited_by_memory():
    plan = bc.plan_jobs({}, cores=64, mem_available_bytes=9 * GiB, n_archs=2)
    assert plan.max_jobs == 9 and plan.nvcc_threads == 1
    assert "MemAvailable" in plan.reason


def test_jobs_spare_cores_go_to_nvcc_threads():
    plan = bc.plan_jobs({"MAX_JOBS": "4"}, cores=16, mem_available_bytes=100 * GiB, n_archs=2)
    assert (plan.max_jobs, plan.nvcc_threads) == (4, 2)
    assert "from the environment" in plan.reason


def test_jobs_env_validated():
    with pytest.raises(bc.BuildConfigError, match="NVCC_THREADS"):
        bc.plan_jobs({"NVCC_THREADS": "zero"}, cores=2, mem_available_bytes=None, n_archs=1)


def test_meminfo_parse():
    text = "MemTotal:       24000000 kB\nMemAvailable:   1000 kB\n"
    assert bc.mem_available_from_meminfo(text) == 1000 * 1024
    assert bc.mem_available_from_meminfo("MemTotal: 1 kB\n") is None


def test_local_version():
    assert bc.local_version("2.11.0+cu130", "13.0", True) == "cu130torch2.11cxx11abiTRUE"
    assert bc.local_version("2.6.0", "12.4", False) == "cu124torch2.6cxx11abiFALSE"


def test_torch_abi_mode_default_and_auto():
    assert bc.torch_abi_mode({}, "2.11.0+cu130") == "stable"  # unset is auto
    assert bc.torch_abi_mode({}, "2.7.1+cu126") == "version"
    assert bc.torch_abi_mode({"FLASH_KERNELS_TORCH_ABI": "auto"}, "2.10.0+cu128") == "stable"
    assert bc.torch_abi_mode({"FLASH_KERNELS_TORCH_ABI": "auto"}, "2.9.1+cu128") == "version"
    assert bc.torch_abi_mode({"FLASH_KERNELS_TORCH_ABI": "version"}, "2.13.0+cu130") == "version"
    assert bc.torch_abi_mode({"FLASH_KERNELS_TORCH_ABI": " Stable "}, "2.11.0+cu130") == "stable"


def test_torch_abi_mode_refuses_stable_on_old_torch_and_typos():
    want = r"needs torch >= 2\.10 .*torch 2\.9\.1.*FLASH_KERNELS_TORCH_ABI=version"
    with pytest.raises(bc.BuildConfigError, match=want):
        bc.torch_abi_mode({"FLASH_KERNELS_TORCH_ABI": "stable"}, "2.9.1+cu128")
    with pytest.raises(bc.BuildConfigError, match="FLASH_KERNELS_TORCH_ABI='stabel'"):
        bc.torch_abi_mode({"FLASH_KERNELS_TORCH_ABI": "stabel"}, "2.11.0")


def test_stable_abi_flags_and_local_version():
    assert bc.stable_abi_flags() == ["-DFLASH_KERNELS_STABLE_ABI=1", "-DTORCH_TARGET_VERSION=0x020a000000000000"]
    assert bc.stable_abi_flags((2, 11))[1] == "-DTORCH_TARGET_VERSION=0x020b000000000000"
    assert bc.stable_local_version("13.0") == "cu13stable2.10"
    assert bc.stable_local_version("12.8") == "cu12stable2.10"


def test_cuda_major_mismatch_names_the_fix():
    bc.check_cuda_major("13.0", "13.2", "/usr/local/cuda")  # minor differences are allowed
    with pytest.raises(bc.BuildConfigError, match=r"CUDA_HOME.*12.x"):
        bc.check_cuda_major("13.0", "12.8", "/usr/local/cuda")


def test_nvcc_version_parse():
    out = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
    assert bc.parse_nvcc_version(out) == "13.0"
    with pytest.raises(bc.BuildConfigError):
        bc.parse_nvcc_version("garbage")


@pytest.mark.parametrize("raw,want", [("", None), ("auto", None), ("1", True), ("0", False), ("off", False)])
def test_build_cuda_setting(raw, want):
    assert bc.build_cuda_setting({"FLASH_KERNELS_BUILD_CUDA": raw}) is want


def test_build_cuda_setting_rejects_typos():
    with pytest.raises(bc.BuildConfigError, match="FLASH_KERNELS_BUILD_CUDA"):
        bc.build_cuda_setting({"FLASH_KERNELS_BUILD_CUDA": "maybe"})


def test_limited_api_tag():
    assert bc.limited_api_tag("0x03090000") == "cp39"
    assert bc.limited_api_tag("0x030A0000") == "cp310"


def test_generated_instantiations_up_to_date():
    problems = gen.check()
    assert not problems, f"{problems}; run python flash_kernels/tools/generate_instantiations.py"


def test_dispatch_table_covers_every_config():
    table = gen.expected_files()["dispatch_table.inc"]
    for dtype, hd, banded in gen.CONFIGS:
        ctype = gen.DTYPES[dtype][0]
        flag = "true" if banded else "false"
        assert f"&run_fwd<{ctype}, {hd}, {flag}>" in table
        assert f"&run_bwd<{ctype}, {hd}, {flag}>" in table


def test_host_sources_reach_torch_only_through_torch_api_h():
    """The stable-ABI build holds only if no host source includes ATen/c10/torch headers itself: torch_api.h
    picks them per mode (and with TORCH_TARGET_VERSION set, torch's non-stable headers #error anyway)."""
    import re

    csrc = Path(__file__).resolve().parents[2] / "csrc"
    torch_include = re.compile(r"^\s*#\s*include\s*[<\"](ATen|c10|torch|caffe2)/", re.MULTILINE)
    offenders = [
        p.name
        for p in sorted([*csrc.glob("*.cpp"), *csrc.glob("*.h"), *csrc.glob("*.cuh"), *csrc.glob("instantiations/*")])
        if p.name != "torch_api.h" and torch_include.search(p.read_text())
    ]
    assert not offenders, f"include torch headers through csrc/torch_api.h only: {offenders}"


ATEN_211 = """#pragma once
#if !defined(_MSC_VER) && __cplusplus < 201703L
#error C++17 or later compatible compiler is required to use ATen.
#endif
"""


def test_host_cxx_std_follows_torch_headers():
    assert bc.host_cxx_std(ATEN_211) == "c++17"
    assert bc.host_cxx_std(ATEN_211.replace("201703L", "202002L").replace("C++17", "C++20")) == "c++20"
    assert bc.host_cxx_std(None) == "c++17"
    assert bc.host_cxx_std("#pragma once\n") == "c++17"
    with pytest.raises(bc.BuildConfigError, match=r"199711L|205012L"):
        bc.host_cxx_std("#if __cplusplus < 205012L\n#error\n#endif\n")


def test_shared_libstdcxx_found_passes():
    bc.check_shared_libstdcxx("g++", "/usr/lib/gcc/x86_64-linux-gnu/13/libstdc++.so", True)


@pytest.mark.parametrize(
    ("answer", "found"),
    [
        ("libstdc++.so", False),  # GCC's answer when it has no such file: the bare name
        ("/opt/gcc/lib64/libstdc++.so", False),  # a path that does not exist
    ],
)
def test_static_only_libstdcxx_is_refused_with_the_fix(answer, found):
    with pytest.raises(bc.BuildConfigError) as err:
        bc.check_shared_libstdcxx("/opt/gcc/bin/g++", answer, found)
    text = str(err.value)
    assert "/opt/gcc/bin/g++" in text and "libstdc++.a" in text and "CXX=" in text


def test_the_real_compiler_links_libstdcxx_shared():
    # This host's own compiler, asked the same way setup.py asks (skipped where there is none).
    import os
    import shutil
    import subprocess

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on this host")
    out = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True, check=True)
    bc.check_shared_libstdcxx(cxx, out.stdout.strip(), os.path.exists(out.stdout.strip()))
