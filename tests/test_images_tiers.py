"""The build and abi tiers on real objects made here with gcc/nvcc: no docker needed.

A tiny filesystem root stands in for an image: host libc/libstdc++, a copy of
the host interpreter, a fake torch whose libc10.so defines (or not) what the
extension calls, and an extension compiled against a declaration of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import types
import zipfile
from pathlib import Path

import pytest

from flashkit.binary import fatbin, torch_abi
from flashkit.images.build import BuildResult
from flashkit.verify import tiers

# A Debian-built interpreter exports the C API from the executable itself (no libpython.so).
PYTHON = "/usr/bin/python3"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
NVCC = os.environ.get("NVCC", "/usr/local/cuda-13.0/bin/nvcc")
needs_nvcc = pytest.mark.skipif(not Path(NVCC).exists(), reason=f"no nvcc at {NVCC} (set NVCC)")


def cuda_extension(tmp_path: Path, *gencode: str) -> Path:
    """A tiny CUDA shared object built by nvcc for the given -gencode values (its fatbin is the point)."""
    cu = tmp_path / "k.cu"
    cu.write_text(
        "__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n"
        'extern "C" void launch(float* x) { k<<<1, 32>>>(x); }\n'
    )
    so = tmp_path / "_C.abi3.so"
    flags = [f for g in gencode for f in ("-gencode", g)]
    subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", *flags, str(cu), "-o", str(so)], check=True)
    return so


def spec(backends=("cuda", "triton"), targets=("8.0", "9.0"), suite="bookworm"):
    return types.SimpleNamespace(
        backends=backends,
        gpu_targets=targets,
        accelerator=types.SimpleNamespace(kind="cuda"),
        base=types.SimpleNamespace(suite=suite),
    )


def result(wheel: Path) -> BuildResult:
    return BuildResult(
        env="cu130-torch211",
        input_hash="h",
        runtime_ref="r",
        runtime_id="sha256:r",
        builder_ref="b",
        builder_id="sha256:b",
        runtime_size=0,
        builder_size=0,
        wheel_path=str(wheel),
        wheel_sha256="0" * 64,
        lock_sha256="",
        base_image_id=None,
        built=True,
        seconds=0,
        log_path="",
        context={},
        date="",
    )


def test_expected_cuda_code_from_gpu_targets():
    assert fatbin.target_code(("8.0", "9.0a+PTX")) == ({"sm_80", "sm_90a"}, {"compute_90a"})
    with pytest.raises(ValueError, match="not like"):
        fatbin.target_code(("sm_80",))


def test_junit_counts_come_from_the_test_cases_not_the_summary_attributes():
    from flashkit.evidence import junit

    xml = (
        '<testsuites><testsuite tests="99" failures="0" errors="0" skipped="0">'
        '<testcase classname="t" name="a"><failure message="max err 0.5 &gt; 0.01"/></testcase>'
        '<testcase classname="t" name="b"><skipped/></testcase><testcase classname="t" name="c"/>'
        '</testsuite><testsuite><testcase classname="u" name="d"><error message="boom"/></testcase>'
        '<testcase classname="u" name="e"/></testsuite></testsuites>'
    )
    assert junit.junit_counts(xml) == {"tests": 5, "failed": 1, "errors": 1, "skipped": 1, "passed": 2}
    assert junit.junit_failures(xml) == ["failure: t.a: max err 0.5 > 0.01", "error: u.d: boom"]
    assert junit.suite_verdict(junit.junit_counts(xml))[0] == "failed"


def test_abi3_minimum_from_wheel_name():
    assert tiers._abi3_minimum("flash_kernels-0.1.0+cu130-cp39-abi3-linux_x86_64.whl") == (3, 9)
    assert tiers._abi3_minimum("flash_kernels-0.1.0-py3-none-any.whl") is None


def _wheel(tmp: Path, members: dict[str, Path]) -> Path:
    w = tmp / "flash_kernels-0.1.0-cp39-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(w, "w") as zf:
        zf.writestr("flash_kernels/__init__.py", "")
        for name, src in members.items():
            zf.write(src, name)
    return w


@needs_nvcc
def test_build_tier_reads_the_real_fatbin(tmp_path):
    so = cuda_extension(tmp_path, "arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90")
    wheel = _wheel(tmp_path, {"flash_kernels/_C.abi3.so": so})
    ok = tiers.tier_build(spec(), result(wheel))
    assert ok.verdict == "passed", ok.reasons
    assert "['sm_80', 'sm_90']" in ok.reasons[0]
    bad = tiers.tier_build(spec(targets=("8.0", "9.0", "10.0")), result(wheel))
    assert bad.verdict == "failed"
    assert "missing cubins ['sm_100']" in bad.reasons[0]


@needs_nvcc
def test_build_tier_accepts_ptx_of_a_listed_arch_only(tmp_path):
    so = cuda_extension(tmp_path, "arch=compute_80,code=sm_80", "arch=compute_90,code=[sm_90,compute_90]")
    wheel = _wheel(tmp_path, {"flash_kernels/_C.abi3.so": so})
    ok = tiers.tier_build(spec(), result(wheel))
    assert ok.verdict == "passed", ok.reasons
    assert "PTX ['compute_90'] for forward compatibility" in ok.reasons[0]
    # Only 8.0 listed: compute_90 PTX (and the sm_90 cubin) are code for an arch the spec does not name.
    bad = tiers.tier_build(spec(targets=("8.0",)), result(wheel))
    assert bad.verdict == "failed"
    assert "unexpected cubins ['sm_90']" in bad.reasons[0] and "unexpected PTX ['compute_90']" in bad.reasons[0]


@needs_nvcc
def test_build_tier_arch_specific_target_with_generic_ptx(tmp_path):
    # What flash_kernels builds for "9.0a": an sm_90a cubin (wgmma) and generic compute_90 PTX, which
    # newer GPUs can JIT (arch-specific PTX would run nowhere else).
    so = cuda_extension(
        tmp_path, "arch=compute_80,code=sm_80", "arch=compute_90a,code=sm_90a", "arch=compute_90,code=compute_90"
    )
    wheel = _wheel(tmp_path, {"flash_kernels/_C.abi3.so": so})
    ok = tiers.tier_build(spec(targets=("8.0", "9.0a")), result(wheel))
    assert ok.verdict == "passed", ok.reasons
    assert "PTX ['compute_90'] for forward compatibility" in ok.reasons[0]
    # A spec that asks for plain 9.0 gets no sm_90 cubin from this wheel.
    bad = tiers.tier_build(spec(targets=("8.0", "9.0")), result(wheel))
    assert bad.verdict == "failed"
    assert "missing cubins ['sm_90']" in bad.reasons[0] and "unexpected cubins ['sm_90a']" in bad.reasons[0]


def test_build_tier_fails_a_triton_only_wheel_for_a_cuda_env(tmp_path):
    wheel = _wheel(tmp_path, {})
    r = tiers.tier_build(spec(), result(wheel))
    assert r.verdict == "failed" and "no compiled extension" in r.reasons[0]
    r = tiers.tier_build(spec(backends=("triton",)), result(wheel))
    assert r.verdict == "passed" and "no CUDA binary expected" in r.reasons[0]


def _gxx(out: Path, src: str, *extra: str) -> None:
    c = out.with_suffix(".cpp")
    c.write_text(src)
    subprocess.run(["g++", "-shared", "-fPIC", "-O0", str(c), "-o", str(out), *extra], check=True)


def _fake_image(
    tmp: Path,
    provider_signature: str,
    ext_extra: str = "",
    *,
    shim: tuple[str, ...] = (),
    ext_src: str | None = None,
    ext_link: tuple[str, ...] = (),
) -> tuple[str, dict]:
    """A root with libc, an interpreter, torch/lib/libc10.so and an installed extension.

    ``shim``: C functions a torch/lib/libtorch_cpu.so exports, which torch._C and the extension then
    link (as torch's own libtorch.so does); ``ext_src``: the extension's source instead of one that
    calls c10::cuda::SetDevice(int).
    """
    root = tmp / "root"
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    for name in ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1"):
        src = Path("/usr/lib/x86_64-linux-gnu") / name
        shutil.copy2(os.path.realpath(src), libdir / name)
    (root / "usr/bin").mkdir(parents=True)
    shutil.copy2(os.path.realpath(PYTHON), root / "usr/bin/python3")
    site = root / "usr/lib/python3/site-packages"
    torch_lib = site / "torch/lib"
    torch_lib.mkdir(parents=True)
    _gxx(
        torch_lib / "libc10.so",
        f"namespace c10 {{ namespace cuda {{ void SetDevice({provider_signature}) {{}} }} }}\n",
        "-Wl,-soname,libc10.so",
    )
    link = [f"-L{torch_lib}", "-lc10"]
    if shim:
        exports = "".join(f'extern "C" int {name}() {{ return 0; }}\n' for name in shim)
        _gxx(torch_lib / "libtorch_cpu.so", exports, "-Wl,-soname,libtorch_cpu.so")
        link += ["-Wl,--push-state,--no-as-needed", "-ltorch_cpu", "-Wl,--pop-state"]
    # torch._C really uses c10 (else --as-needed drops the DT_NEEDED entry).
    sig_arg = "(signed char)0" if "char" in provider_signature else "0"
    _gxx(
        site / "torch/_C.cpython-311-x86_64-linux-gnu.so",
        f"namespace c10 {{ namespace cuda {{ void SetDevice({provider_signature}); }} }}\n"
        f"void torch_init() {{ c10::cuda::SetDevice({sig_arg}); }}\n",
        *link,
        "-Wl,-rpath,$ORIGIN/lib",
    )
    pkg = site / "flash_kernels"
    pkg.mkdir()
    _gxx(
        pkg / "_C.abi3.so",
        ext_src
        or "#include <cstddef>\nnamespace c10 { namespace cuda { void SetDevice(int); } }\n"
        'extern "C" void* PyLong_FromLong(long);\n'
        + ext_extra
        + 'extern "C" void* go() { c10::cuda::SetDevice(0); return PyLong_FromLong(1); }\n',
        *link,
        *ext_link,
    )
    probe = {
        "python": "/usr/bin/python3",
        "version": [3, 11],
        "libpython": None,
        "libdir": None,
        "flash_kernels": "/usr/lib/python3/site-packages/flash_kernels",
        "torch": "/usr/lib/python3/site-packages/torch",
    }
    return str(root), probe


WHEEL_NAME = "flash_kernels-0.1.0-cp39-abi3-linux_x86_64.whl"


@needs_gxx
def test_abi_passes_when_every_symbol_resolves_in_the_image(tmp_path):
    root, probe = _fake_image(tmp_path, "int")
    verdict, counts, reasons = tiers.check_abi_in_root(root, probe, WHEEL_NAME, spec())
    assert verdict == "passed", reasons
    assert counts["checked"] == 1 and counts["passed"] == 1
    assert "limited API of CPython 3.9" in reasons[0]


@needs_gxx
def test_abi_fails_with_the_demangled_missing_symbol_and_near_miss(tmp_path):
    root, probe = _fake_image(tmp_path, "signed char")
    verdict, _, reasons = tiers.check_abi_in_root(root, probe, WHEEL_NAME, spec())
    assert verdict == "failed"
    text = "\n".join(reasons)
    assert "undefined symbol `c10::cuda::SetDevice(int)`" in text
    assert "_ZN3c104cuda9SetDeviceEi" in text
    assert "c10::cuda::SetDevice(signed char)" in text  # what the image has instead


@needs_gxx
def test_abi_flags_non_limited_api_in_an_abi3_wheel(tmp_path):
    root, probe = _fake_image(
        tmp_path,
        "int",
        'extern "C" void* _PyObject_GetDictPtr(void*);\n'
        'extern "C" void* use() { return _PyObject_GetDictPtr(nullptr); }\n',
    )
    verdict, _, reasons = tiers.check_abi_in_root(root, probe, WHEEL_NAME, spec())
    assert verdict == "failed"
    assert "_PyObject_GetDictPtr: not in the CPython stable ABI" in "\n".join(reasons)


@needs_gxx
def test_abi_fails_an_extension_linked_with_libstdcxx_a(tmp_path):
    # The doctor tests' module (an error message built as the kernels build theirs) pulls in stream and locale code.
    fmt = (Path(__file__).parent / "fixtures" / "elf" / "formats_number.cpp").read_text()
    root, probe = _fake_image(tmp_path, "int", fmt, ext_link=("-static-libstdc++",))
    verdict, _, reasons = tiers.check_abi_in_root(root, probe, WHEEL_NAME, spec())
    assert verdict == "failed"
    assert "carries its own C++ runtime (defines std::locale::id::_M_id() const" in "\n".join(reasons)


@needs_gxx
def test_abi_flags_a_missing_library(tmp_path):
    root, probe = _fake_image(tmp_path, "int")
    os.remove(os.path.join(root, "usr/lib/python3/site-packages/torch/lib/libc10.so"))
    verdict, _, reasons = tiers.check_abi_in_root(root, probe, WHEEL_NAME, spec())
    assert verdict == "failed"
    assert "needs libc10.so, not found in the image" in "\n".join(reasons)


# ---------------------------------------------------------------------------
# stable-ABI wheels (+cu13stable2.10): torch's C shim only, from a torch at least as new as the target

STABLE_WHEEL = "flash_kernels-0.1.0+cu13stable2.10-cp39-abi3-linux_x86_64.whl"
# An extension on torch's stable ABI: it calls the C shim only (what csrc/torch_api.h's stable mode compiles to).
SHIM_EXT = (
    'extern "C" int aoti_torch_get_dim(void*, long*);\n'
    'extern "C" int torch_library_impl(const char*, void*, unsigned long);\n'
    'extern "C" void* PyLong_FromLong(long);\n'
    'extern "C" void* go() { long d = 0; aoti_torch_get_dim(nullptr, &d); return PyLong_FromLong(d); }\n'
    'extern "C" int reg() { return torch_library_impl("fwd", nullptr, 0); }\n'
)


def test_stable_abi_target_from_wheel_name():
    assert torch_abi.stable_abi_target(STABLE_WHEEL) == (2, 10)
    assert torch_abi.stable_abi_target("flash_kernels-0.1.0+cu12stable2.12-cp310-abi3-linux_x86_64.whl") == (2, 12)
    # version-bound labels, either case, and no label at all
    for name in (
        "flash_kernels-0.1.0+cu130torch2.11cxx11abiTRUE-cp39-abi3-linux_x86_64.whl",
        "flash_kernels-0.1.0+cu130torch2.11cxx11abitrue-cp39-abi3-linux_x86_64.whl",
        WHEEL_NAME,
        "not-a-wheel",
    ):
        assert torch_abi.stable_abi_target(name) is None, name


@needs_gxx
def test_stable_wheel_must_not_take_torch_cxx_symbols(tmp_path):
    # The extension calls c10::cuda::SetDevice(int), which the image defines: fine for a version-bound
    # wheel, a broken promise for a stable one.
    root, probe = _fake_image(tmp_path, "int", shim=("aoti_torch_get_dim",))
    probe = {**probe, "torch_version": "2.11.0+cu130"}
    verdict, counts, reasons = tiers.check_abi_in_root(root, probe, WHEEL_NAME, spec())
    assert verdict == "passed", reasons
    assert "shim_symbols" not in counts  # the version-bound rule is unchanged
    verdict, counts, reasons = tiers.check_abi_in_root(root, probe, STABLE_WHEEL, spec())
    assert verdict == "failed"
    assert counts["failed"] == 1 and counts["torch_cxx_symbols"] == 1 and counts["shim_symbols"] == 0
    text = "\n".join(reasons)
    assert "1 undefined symbol(s) of torch's C++ API (c10::, at::, torch::, caffe2::) in a stable-ABI wheel" in text
    assert "`c10::cuda::SetDevice(int)`" in text


@needs_gxx
def test_stable_wheel_taking_only_the_c_shim_passes(tmp_path):
    root, probe = _fake_image(tmp_path, "int", shim=("aoti_torch_get_dim", "torch_library_impl"), ext_src=SHIM_EXT)
    probe = {**probe, "torch_version": "2.13.0+cu130"}
    verdict, counts, reasons = tiers.check_abi_in_root(root, probe, STABLE_WHEEL, spec())
    assert verdict == "passed", reasons
    assert counts["checked"] == 1 and counts["shim_symbols"] == 2 and counts["torch_cxx_symbols"] == 0
    assert "stable ABI of torch >= 2.10: no torch C++ symbols, 2 C shim symbols exported by torch 2.13.0" in reasons[0]
    assert "(libtorch_cpu.so)" in reasons[0]


@needs_gxx
def test_stable_wheel_on_a_torch_older_than_its_target(tmp_path):
    # torch 2.9 has aoti_torch_get_dim but not torch_library_impl (new in 2.10).
    root, probe = _fake_image(tmp_path, "int", shim=("aoti_torch_get_dim",), ext_src=SHIM_EXT)
    old = {**probe, "torch_version": "2.9.1+cu128"}
    verdict, counts, reasons = tiers.check_abi_in_root(root, old, STABLE_WHEEL, spec())
    assert verdict == "failed" and counts["shim_symbols"] == 2
    text = "\n".join(reasons)
    assert "the image has torch 2.9.1+cu128, older than 2.10: the wheel targets the stable ABI of torch >= 2.10" in text
    assert (
        "torch_library_impl is not exported by this torch's libraries (libtorch_cpu.so): "
        "the wheel targets the stable ABI of torch >= 2.10"
    ) in text
    assert "undefined symbol `torch_library_impl`" not in text  # said once, with its cause
    assert "aoti_torch_get_dim" not in text
    # A torch new enough that still lacks it: the wheel's label understates what it uses.
    verdict, _, reasons = tiers.check_abi_in_root(root, {**probe, "torch_version": "2.11.0"}, STABLE_WHEEL, spec())
    assert verdict == "failed"
    assert "older than" not in reasons[0]
    assert "uses a newer stable ABI than its label says" in reasons[0]


@needs_gxx
def test_stable_wheel_without_torch_libraries_in_the_image(tmp_path):
    root, probe = _fake_image(tmp_path, "int", shim=("aoti_torch_get_dim", "torch_library_impl"), ext_src=SHIM_EXT)
    os.remove(os.path.join(root, "usr/lib/python3/site-packages/torch/lib/libtorch_cpu.so"))
    verdict, _, reasons = tiers.check_abi_in_root(root, probe, STABLE_WHEEL, spec())
    assert verdict == "failed"
    assert (
        "none of libtorch_cpu.so, libtorch_cuda.so, libtorch.so in /usr/lib/python3/site-packages/torch/lib"
        in (reasons[0])
    )
    assert "needs libtorch_cpu.so, not found in the image" in reasons[0]
