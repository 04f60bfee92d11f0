"""flashkit.binary.elf against real objects compiled during the test run (gcc, g++, nvcc).

Each artifact is built from tests/fixtures/elf/ into a pytest tmp dir; a missing
compiler skips the tests that need it and says which.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flashkit.binary import elf, fatbin, linking

FIXTURES = Path(__file__).parent / "fixtures" / "elf"
_spec = importlib.util.spec_from_file_location("elf_fixture_build", FIXTURES / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

pytest.importorskip("elftools", reason="pyelftools is needed to read ELF objects")


def built(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except build.ToolMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def setdevice(tmp_path_factory):
    return built(build.setdevice_case, tmp_path_factory.mktemp("setdevice"))


@pytest.fixture(scope="session")
def strings(tmp_path_factory):
    return built(build.strings_case, tmp_path_factory.mktemp("strings"))


@pytest.fixture(scope="session")
def versioned(tmp_path_factory):
    return built(build.versioned_case, tmp_path_factory.mktemp("versioned"))


@pytest.fixture(scope="session")
def cuda_objects(tmp_path_factory):
    base = tmp_path_factory.mktemp("cuda")
    return {
        "sm80": built(build.cuda_module, base / "sm80.so", "arch=compute_80,code=sm_80"),
        "ptx80": built(build.cuda_module, base / "ptx80.so", "arch=compute_80,code=compute_80"),
        "mixed": built(
            build.cuda_module,
            base / "mixed.so",
            "arch=compute_80,code=sm_80",
            "arch=compute_90a,code=sm_90a",
            "arch=compute_100f,code=sm_100f",
            "arch=compute_120,code=compute_120",
        ),
    }


def test_read_object_dynamic_facts(setdevice):
    obj = elf.read_object(str(setdevice["module"]))
    assert "libc10_cuda.so" in obj.needed
    undefined = {s.name for s in obj.undefined}
    assert "_ZN3c104cuda9SetDeviceEi" in undefined
    assert "flash_select_device" in obj.defined
    provider = elf.read_object(str(setdevice["v2"]))
    assert provider.soname == "libc10_cuda.so"
    assert "_ZN3c104cuda9SetDeviceEa" in provider.defined
    assert "_ZN3c104cuda9SetDeviceEi" not in provider.defined


def test_read_object_refuses_non_elf(tmp_path):
    text = tmp_path / "notes.so"
    text.write_text("not an object")
    with pytest.raises(elf.ElfReadError, match="not an ELF file"):
        elf.read_object(str(text))
    with pytest.raises(elf.ElfReadError, match=r"missing\.so"):
        elf.read_object(str(tmp_path / "missing.so"))


def test_resolve_names_the_torch_signature_change(setdevice):
    ok = linking.resolve(str(setdevice["module"]), linking.LibrarySearch(extra_dirs=(str(setdevice["v1"].parent),)))
    assert ok.ok, ok
    assert ("libc10_cuda.so", str(setdevice["v1"])) in ok.loaded

    res = linking.resolve(str(setdevice["module"]), linking.LibrarySearch(extra_dirs=(str(setdevice["v2"].parent),)))
    assert not res.ok
    assert [u.name for u in res.unresolved] == ["_ZN3c104cuda9SetDeviceEi"]
    miss = res.unresolved[0]
    if shutil.which("c++filt"):
        assert miss.demangled == "c10::cuda::SetDevice(int)"
        assert [n.demangled for n in miss.near_misses] == ["c10::cuda::SetDevice(signed char)"]
    assert miss.near_misses[0].symbol == "_ZN3c104cuda9SetDeviceEa"
    assert miss.near_misses[0].provider == str(setdevice["v2"])
    assert miss.near_misses[0].abi_only is False


def test_resolve_reports_a_missing_library(setdevice):
    res = linking.resolve(str(setdevice["module"]), linking.LibrarySearch())
    assert [m.name for m in res.missing_libraries] == ["libc10_cuda.so"]
    assert res.missing_libraries[0].needed_by == str(setdevice["module"])
    assert "/usr/lib/x86_64-linux-gnu" in res.missing_libraries[0].searched


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="c++filt (binutils) not installed")
def test_resolve_sees_a_cxx11_abi_mismatch(strings):
    module = elf.read_object(str(strings["module"]))
    assert elf.cxx_abi_of(elf.demangle(s.name for s in module.undefined).values()) == "pre-cxx11"
    res = linking.resolve(str(strings["module"]), linking.LibrarySearch(extra_dirs=(str(strings["new"].parent),)))
    assert [u.name for u in res.unresolved] == ["_ZN3kit11name_lengthERKSs"]
    near = res.unresolved[0].near_misses
    assert len(near) == 1 and near[0].abi_only
    assert "__cxx11" in near[0].symbol
    assert near[0].demangled.startswith("kit::name_length(std::__cxx11::basic_string<char")
    same = linking.resolve(str(strings["module"]), linking.LibrarySearch(extra_dirs=(str(strings["old"].parent),)))
    assert same.ok


def test_resolve_checks_symbol_versions(versioned):
    module = elf.read_object(str(versioned["module"]))
    assert module.version_needs["libversioned.so"] == ("VERSIONED_2.0", "VERSIONED_1.0") or set(
        module.version_needs["libversioned.so"]
    ) == {"VERSIONED_1.0", "VERSIONED_2.0"}
    ok = linking.resolve(str(versioned["module"]), linking.LibrarySearch(extra_dirs=(str(versioned["v2"].parent),)))
    assert ok.ok, ok
    old = linking.resolve(str(versioned["module"]), linking.LibrarySearch(extra_dirs=(str(versioned["v1"].parent),)))
    assert [(m.library, m.version) for m in old.missing_versions] == [("libversioned.so", "VERSIONED_2.0")]
    assert old.missing_versions[0].available == ("VERSIONED_1.0",)
    assert [(u.name, u.version) for u in old.unresolved] == [("versioned_mul", "VERSIONED_2.0")]


def test_resolve_inside_a_root_with_absolute_symlinks(setdevice, tmp_path):
    """An image filesystem: ld.so.conf include, absolute links that point into the root, not the host."""
    root = tmp_path / "root"
    vendor = root / "opt" / "vendor" / "lib"
    vendor.mkdir(parents=True)
    shutil.copy(setdevice["v1"], vendor / "libc10_cuda.so.1")
    os.symlink("/opt/vendor/lib/libc10_cuda.so.1", vendor / "libc10_cuda.so")
    (root / "etc" / "ld.so.conf.d").mkdir(parents=True)
    (root / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc" / "ld.so.conf.d" / "vendor.conf").write_text("# vendor libs\n/opt/vendor/lib\n")
    for lib in ("libstdc++.so.6", "libc.so.6", "libm.so.6", "libgcc_s.so.1"):
        host = Path("/usr/lib/x86_64-linux-gnu") / lib
        if not host.exists():
            host = Path("/lib/x86_64-linux-gnu") / lib
        dest = root / "usr" / "lib" / "x86_64-linux-gnu"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(host.resolve(), dest / lib)
    (root / "mod").mkdir()
    shutil.copy(setdevice["module"], root / "mod" / "m.so")

    assert "/opt/vendor/lib" in linking.system_library_dirs(str(root))
    res = linking.resolve("/mod/m.so", linking.LibrarySearch(root=str(root)))
    assert res.ok, res
    assert ("libc10_cuda.so", "/opt/vendor/lib/libc10_cuda.so") in res.loaded


def test_cuda_code_lists_cubins_and_ptx(cuda_objects):
    sm80 = fatbin.cuda_code(str(cuda_objects["sm80"]))
    assert (sm80.cubins, sm80.ptx, sm80.source) == (("sm_80",), (), "fatbin")
    ptx = fatbin.cuda_code(str(cuda_objects["ptx80"]))
    assert (ptx.cubins, ptx.ptx) == ((), ("compute_80",))
    mixed = fatbin.cuda_code(str(cuda_objects["mixed"]))
    assert mixed.cubins == ("sm_80", "sm_90a", "sm_100f")
    assert mixed.ptx == ("compute_120",)


def test_runs_on_follows_the_driver_rules(cuda_objects):
    sm80 = fatbin.cuda_code(str(cuda_objects["sm80"]))
    assert sm80.runs_on((8, 0)) == ("cubin", "sm_80")
    assert sm80.runs_on((8, 6)) == ("cubin", "sm_80")  # same major, higher minor
    assert sm80.runs_on((9, 0)) is None  # never across majors
    ptx = fatbin.cuda_code(str(cuda_objects["ptx80"]))
    assert ptx.runs_on((9, 0)) == ("ptx", "compute_80")
    assert ptx.runs_on((7, 5)) is None
    mixed = fatbin.cuda_code(str(cuda_objects["mixed"]))
    assert mixed.runs_on((9, 0)) == ("cubin", "sm_90a")
    assert mixed.runs_on((10, 3)) == ("cubin", "sm_100f")
    assert mixed.runs_on((12, 0)) == ("ptx", "compute_120")


def test_object_without_gpu_code(setdevice):
    assert fatbin.cuda_code(str(setdevice["module"])) is None


def test_cuda_code_agrees_with_cuobjdump(cuda_objects):
    exe = shutil.which("cuobjdump")
    if exe is None:
        pytest.skip("cuobjdump not on PATH (pip package nvidia-cuda-cuobjdump provides one)")
    for path in cuda_objects.values():
        listed = elf._cuobjdump_listing(exe, str(path), str(path), RuntimeError("cross-check"))
        parsed = fatbin.cuda_code(str(path))
        # cuobjdump prints family-specific cubins without their "f"
        assert {c.rstrip("f") for c in parsed.cubins} == set(listed.cubins)
        assert set(parsed.ptx) == set(listed.ptx)


def test_truncated_fatbin_is_an_error_not_a_guess():
    header = (0xBA55ED50).to_bytes(4, "little") + (1).to_bytes(2, "little") + (16).to_bytes(2, "little")
    with pytest.raises(fatbin.FatbinError, match="past the section end"):
        fatbin.parse_fatbin(header + (4096).to_bytes(8, "little") + b"\0" * 64)
    with pytest.raises(fatbin.FatbinError, match="no fat binary header"):
        fatbin.parse_fatbin(b"\x01" * 32)


@pytest.fixture(scope="session")
def pyexts(tmp_path_factory):
    base = tmp_path_factory.mktemp("pyext")
    return {
        "full": built(build.python_extension, base / "pyext.cpython-311-x86_64-linux-gnu.so"),
        "full_abi3": built(build.python_extension, base / "unclean" / "pyext.abi3.so"),
        "limited310": built(build.python_extension, base / "clean" / "pyext.abi3.so", limited_api="0x030a0000"),
    }


def test_extension_tag_from_file_names():
    assert elf.extension_tag("/x/_C.cpython-311-x86_64-linux-gnu.so") == elf.ExtensionTag(
        "cpython", (3, 11), False, "x86_64-linux-gnu"
    )
    assert elf.extension_tag("_C.cpython-313t-x86_64-linux-gnu.so").label == "cp313t"
    assert elf.extension_tag("_C.abi3.so").kind == "abi3"
    assert elf.extension_tag("_C.so").kind == "plain"


def test_limited_api_violations(pyexts):
    pytest.importorskip("abi3info", reason="abi3info provides the stable-ABI symbol list")
    unclean = elf.read_object(str(pyexts["full_abi3"]))
    issues = elf.limited_api_violations(unclean, (3, 9))
    assert [i.symbol for i in issues] == ["PyUnicode_AsUTF8"]
    assert issues[0].reason == "not in the CPython stable ABI"

    clean = elf.read_object(str(pyexts["limited310"]))
    assert elf.limited_api_violations(clean, (3, 10)) == ()
    too_new = elf.limited_api_violations(clean, (3, 9))
    assert [(i.symbol, i.added) for i in too_new] == [("PyUnicode_AsUTF8AndSize", "3.10")]


def test_glibc_versions_against_a_policy(tmp_path):
    obj = elf.read_object(str(built(build.threads_module, tmp_path / "libthreads.so")))
    host = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    if elf._version_key(host.split()[-1]) < (2, 34):
        pytest.skip(f"host glibc is older than 2.34 ({host}): pthread_create is not GLIBC_2.34 here")
    assert elf.max_version(obj, "GLIBC_") == "2.34"
    newer = elf.versions_newer_than(obj, "GLIBC_", elf.glibc_of_policy("manylinux_2_28"))
    assert {(s.name, s.version) for s in newer} >= {("pthread_create", "GLIBC_2.34")}
    assert elf.versions_newer_than(obj, "GLIBC_", "2.34") == ()


def test_glibc_of_policy():
    assert elf.glibc_of_policy("manylinux_2_28") == "2.28"
    assert elf.glibc_of_policy("manylinux_2_17_x86_64") == "2.17"
    assert elf.glibc_of_policy("manylinux2014") == "2.17"
    with pytest.raises(ValueError, match="not a manylinux tag"):
        elf.glibc_of_policy("musllinux_1_2")


def test_qualified_name():
    assert elf.qualified_name("c10::cuda::SetDevice(int)") == "c10::cuda::SetDevice"
    assert elf.qualified_name("std::vector<int, std::allocator<int> >::push_back(int const&)") == (
        "std::vector<int, std::allocator<int> >::push_back"
    )
    assert elf.qualified_name("Foo::operator()(int)") == "Foo::operator()"
    assert elf.qualified_name("some_data") == "some_data"


def test_in_namespaces():
    ns = ("c10::", "at::", "torch::", "caffe2::")
    for name in (
        "c10::cuda::SetDevice(int)",
        "c10::TensorImpl::incref_pyobject() const",
        "vtable for c10::Error",
        "typeinfo for c10::Error",
        "non-virtual thunk to at::Foo::bar()",
        "void at::native::impl<int>()",  # a function template: its return type comes first
        "unsigned long at::numel<long>(long)",
        "caffe2::TypeMeta::error_unsupported_typemeta(caffe2::TypeMeta)",
        "c10::Foo::operator bool() const",
    ):
        assert elf.in_namespaces(name, ns), name
    for name in (
        "std::vector<c10::IValue, std::allocator<c10::IValue> >::push_back(c10::IValue const&)",
        "std::shared_ptr<at::Tensor>::reset()",
        "operator new(unsigned long)",
        "foo(c10::Device)",
        "aoti_torch_get_dim",
        "torch_library_impl",
    ):
        assert not elf.in_namespaces(name, ns), name


def test_unparsable_fatbin_falls_back_or_says_why(cuda_objects, tmp_path, monkeypatch):
    from elftools.elf.elffile import ELFFile

    broken = tmp_path / "broken.so"
    shutil.copy(cuda_objects["sm80"], broken)
    with open(broken, "rb") as fh:
        offset = ELFFile(fh).get_section_by_name(".nv_fatbin")["sh_offset"]
    with open(broken, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\x01" * 8)  # no container magic any more
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:  # the fallback runs, and does not turn its own failure into "no GPU code"
        with pytest.raises(fatbin.FatbinError, match="cuobjdump --list-elf cannot list it either"):
            fatbin.cuda_code(str(broken))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cuobjdump to fall back on
    with pytest.raises(fatbin.FatbinError, match="cuobjdump is not on PATH"):
        fatbin.cuda_code(str(broken))


def test_demangles_without_cxxfilt(monkeypatch, tmp_path):
    """Slim runtime images have no binutils: libstdc++'s own __cxa_demangle gives the same names."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no c++filt on it
    monkeypatch.setattr(elf, "_demangled", {})
    if elf._cxa_demangle() is None:
        pytest.skip("libstdc++.so.6 cannot be loaded here")
    assert elf.demangler_available()
    names = ["_ZN3c104cuda9SetDeviceEab", "_ZNK3c1010TensorImpl15incref_pyobjectEv", "cudaGetLastError", "_Zbogus"]
    assert elf.demangle(names) == {
        "_ZN3c104cuda9SetDeviceEab": "c10::cuda::SetDevice(signed char, bool)",
        "_ZNK3c1010TensorImpl15incref_pyobjectEv": "c10::TensorImpl::incref_pyobject() const",
        "cudaGetLastError": "cudaGetLastError",
        "_Zbogus": "_Zbogus",
    }
