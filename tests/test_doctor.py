"""flashkit doctor's diagnosis of real broken artifacts (compiled during the run) and its recommendation.

The modules are real ELF objects read by flashkit.doctor.probe.inspect_module; the
environment around them (Python version, torch, GPU) is stated as the plain
values diagnose() takes, which is its whole interface.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest

from flashkit.binary import elf, linking
from flashkit.doctor import diagnose as _diagnose
from flashkit.doctor import environment, model, modules, probe, repo

# The doctor's pure pieces under one name, as the tests use them.
doctor = SimpleNamespace(
    module_findings=modules.module_findings,
    Target=model.Target,
    Finding=model.Finding,
    diagnose=_diagnose.diagnose,
    to_json=_diagnose.to_json,
    build_label=environment.build_label,
    BuildLabel=environment.BuildLabel,
    SCHEMA_VERSION=model.SCHEMA_VERSION,
    EXIT_PROBLEMS=model.EXIT_PROBLEMS,
    EXIT_UNINSPECTED=model.EXIT_UNINSPECTED,
)

pytest.importorskip("elftools", reason="pyelftools is needed to read ELF objects")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "elf"
_spec = importlib.util.spec_from_file_location("elf_fixture_build", FIXTURES / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

needs_cxxfilt = pytest.mark.skipif(shutil.which("c++filt") is None, reason="c++filt (binutils) not installed")


def built(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except build.ToolMissing as exc:
        pytest.skip(str(exc))


def interpreter(version: str = "3.11.7", glibc: str = "2.36") -> probe.InterpreterFacts:
    major, minor = version.split(".")[:2]
    return probe.InterpreterFacts(
        executable="/usr/bin/python3",
        realpath="/usr/bin/python3",
        version=version,
        implementation="cpython",
        tag=f"cp{major}{minor}",
        machine="x86_64",
        glibc=glibc,
        ext_suffix=f".cpython-{major}{minor}-x86_64-linux-gnu.so",
        libpython=None,
        site_packages=("/usr/lib/python3/dist-packages",),
    )


def torch_facts(version="2.7.1+cu126", cuda="12.6", cxx11=True, devices=(), hip=None) -> probe.TorchFacts:
    return probe.TorchFacts(
        location="/site/torch",
        imported=True,
        import_error=None,
        version=version,
        cuda=cuda,
        hip=hip,
        cxx11_abi=cxx11,
        cuda_available=bool(devices),
        devices=tuple(devices),
        arch_list=("sm_80", "sm_90", "sm_100", "sm_120") if devices else (),
    )


def facts(*, modules=(), python="3.11.7", glibc="2.36", torch=None, gpus=(), tools=None, distributions=()):
    return probe.Facts(
        interpreter=interpreter(python, glibc),
        torch=torch,
        nvcc=None,
        gpus=tuple(gpus),
        distributions=tuple(distributions),
        modules=tuple(modules),
        tools=tools or probe.Tools(pyelftools=True, abi3info=True, cxxfilt=True),
        errors=(),
    )


def _this_interpreter() -> tuple[str, ...]:
    """The running interpreter's binary and shared libpython: where Py* symbols come from."""
    objs = [os.path.realpath(sys.executable)]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        lib = Path(sysconfig.get_config_var("LIBDIR")) / sysconfig.get_config_var("LDLIBRARY")
        if lib.exists():
            objs.append(str(lib.resolve()))
    return tuple(objs)


def inspect(path: Path, *, dirs=(), abi3_minimum=None) -> probe.ModuleFacts:
    search = linking.LibrarySearch(extra_dirs=tuple(str(d) for d in dirs), preloaded=_this_interpreter())
    return probe.inspect_module(
        str(path), "flash_kernels", "flash_kernels", search, linking.ObjectCache(), abi3_minimum
    )


@pytest.fixture(scope="module")
def sm80_module(tmp_path_factory):
    """kernel.cu compiled by nvcc for sm_80 only (shared: each nvcc run takes seconds)."""
    return built(build.cuda_module, tmp_path_factory.mktemp("cuda") / "sm80.so", "arch=compute_80,code=sm_80")


def codes(findings) -> list[str]:
    return [f.code for f in findings]


# ---------------------------------------------------------------------------
# (1) built against another torch version


@needs_cxxfilt
def test_undefined_symbol_from_a_torch_signature_change(tmp_path):
    case = built(build.setdevice_case, tmp_path)
    module = inspect(case["module"], dirs=[case["v2"].parent])
    diag = doctor.diagnose(facts(modules=[module], torch=torch_facts()))
    [f] = [f for f in diag.findings if f.code == "undefined-symbol"]
    assert f.severity == "error"
    assert "_ZN3c104cuda9SetDeviceEi" in f.what
    assert "c10::cuda::SetDevice(int)" in f.what
    assert "built against another torch version" in f.cause
    assert "c10::cuda::SetDevice(signed char)" in f.cause
    assert "torch 2.7.1+cu126" in f.fix and "rebuild flash_kernels" in f.fix
    assert f.details["symbol"] == "_ZN3c104cuda9SetDeviceEi"
    assert diag.exit_code == doctor.EXIT_PROBLEMS

    healthy = inspect(case["module"], dirs=[case["v1"].parent])
    assert "undefined-symbol" not in codes(doctor.module_findings(healthy, doctor.Target()))


# ---------------------------------------------------------------------------
# (2) cxx11 against pre-cxx11 std::string ABI


@needs_cxxfilt
def test_cxx11_abi_mismatch(tmp_path):
    case = built(build.strings_case, tmp_path)
    module = inspect(case["module"], dirs=[case["new"].parent])
    assert module.cxx_abi == "pre-cxx11"
    found = doctor.module_findings(module, doctor.Target(torch_cxx11_abi=True))
    [f] = [f for f in found if f.code == "cxx-abi-mismatch"]
    assert f.severity == "error"
    assert "_ZN3kit11name_lengthERKSs" in f.what
    assert "C++ ABI mismatch" in f.cause
    assert "_GLIBCXX_USE_CXX11_ABI=0" in f.cause and "libkitstrings.so" in f.cause
    assert "std::__cxx11" in f.cause
    assert "-D_GLIBCXX_USE_CXX11_ABI=1" in f.fix
    assert "undefined-symbol" not in codes(found)  # one finding, with the specific cause

    # resolving against the provider of its own ABI: no error, but the ABI still differs from torch's
    ok = inspect(case["module"], dirs=[case["old"].parent])
    [w] = doctor.module_findings(ok, doctor.Target(torch_cxx11_abi=True))
    assert (w.severity, w.code) == ("warning", "cxx-abi-mismatch")


# ---------------------------------------------------------------------------
# (3) GPU arch


def test_no_cubin_or_ptx_for_the_gpu(tmp_path, sm80_module):
    sm80 = inspect(sm80_module)
    assert sm80.cuda.cubins == ("sm_80",)
    [f] = [f for f in doctor.module_findings(sm80, doctor.Target(capabilities=("9.0",))) if f.code == "no-gpu-code"]
    assert f.severity == "error"
    assert f.what.startswith("no cubin/PTX for sm_90")
    assert "TORCH_CUDA_ARCH_LIST=9.0" in f.fix
    assert doctor.module_findings(sm80, doctor.Target(capabilities=("8.6",))) == []

    ptx = inspect(built(build.cuda_module, tmp_path / "ptx80.so", "arch=compute_80,code=compute_80"))
    [j] = doctor.module_findings(ptx, doctor.Target(capabilities=("9.0",)))
    assert (j.severity, j.code) == ("info", "ptx-jit")
    assert "compute_80" in j.what and "JIT" in j.what


def test_flash_kernels_without_hopper_code_on_a_hopper_gpu(tmp_path):
    # flash_kernels built for plain 9.0 runs, but without its Hopper kernels: an info finding with the fix.
    plain = inspect(
        built(
            build.cuda_module,
            tmp_path / "plain" / "flash_kernels" / "_C.abi3.so",
            "arch=compute_80,code=sm_80",
            "arch=compute_90,code=sm_90",
        )
    )
    [f] = [
        f for f in doctor.module_findings(plain, doctor.Target(capabilities=("9.0",))) if f.code == "no-hopper-kernels"
    ]
    assert f.severity == "info" and "sm_90 code" in f.what and "9.0a" in f.fix
    # The sm_90a build has them; another module's plain sm_90 cubin is not flagged; nor is an A100.
    hopper = inspect(
        built(
            build.cuda_module,
            tmp_path / "a" / "flash_kernels" / "_C.abi3.so",
            "arch=compute_80,code=sm_80",
            "arch=compute_90a,code=sm_90a",
        )
    )
    assert "no-hopper-kernels" not in codes(doctor.module_findings(hopper, doctor.Target(capabilities=("9.0",))))
    other = inspect(built(build.cuda_module, tmp_path / "other" / "_ext.so", "arch=compute_90,code=sm_90"))
    assert "no-hopper-kernels" not in codes(doctor.module_findings(other, doctor.Target(capabilities=("9.0",))))
    assert "no-hopper-kernels" not in codes(doctor.module_findings(plain, doctor.Target(capabilities=("8.0",))))


def test_gpu_of_the_machine_is_checked_without_asking(sm80_module):
    sm80 = inspect(sm80_module)
    h200 = probe.Gpu("NVIDIA H200", "9.0", "580.159", 143771)
    diag = doctor.diagnose(facts(modules=[sm80], gpus=[h200], torch=torch_facts("2.11.0+cu130", "13.0")))
    assert "no-gpu-code" in codes(diag.findings)


# ---------------------------------------------------------------------------
# (4) Python tag and abi3


def test_python_tag_mismatch(tmp_path):
    ext = built(build.python_extension, tmp_path / "pyext.cpython-311-x86_64-linux-gnu.so")
    module = inspect(ext)
    assert module.tag.label == "cp311"
    found = doctor.module_findings(module, doctor.Target(python=(3, 12)))
    [f] = [f for f in found if f.code == "python-tag-mismatch"]
    assert "built for CPython 3.11" in f.what and "Python 3.12" in f.what
    assert "Python tag mismatch" in f.cause
    assert "python-tag-mismatch" not in codes(doctor.module_findings(module, doctor.Target(python=(3, 11))))


def test_abi3_module_using_a_non_limited_symbol(tmp_path):
    pytest.importorskip("abi3info", reason="abi3info provides the stable-ABI symbol list")
    ext = built(build.python_extension, tmp_path / "pyext.abi3.so")
    module = inspect(ext, abi3_minimum=(3, 9))
    [f] = [f for f in doctor.module_findings(module, doctor.Target(python=(3, 12))) if f.code == "abi3-unclean"]
    assert "PyUnicode_AsUTF8" in f.what and "not abi3-clean" in f.cause
    assert f.details["symbols"] == ["PyUnicode_AsUTF8"]

    clean = inspect(
        built(build.python_extension, tmp_path / "clean" / "pyext.abi3.so", limited_api="0x030a0000"),
        abi3_minimum=(3, 10),
    )
    assert doctor.module_findings(clean, doctor.Target(python=(3, 12))) == []


# ---------------------------------------------------------------------------
# (5) glibc and other versioned libraries


def test_glibc_too_old_for_a_manylinux_policy(tmp_path):
    module = inspect(built(build.threads_module, tmp_path / "libthreads.so"))
    if module.glibc_required != "2.34":
        pytest.skip(f"host glibc links pthread_create at GLIBC_{module.glibc_required}, not 2.34")
    [f] = doctor.module_findings(module, doctor.Target(glibc="2.36", glibc_policy="manylinux_2_28"))
    assert (f.severity, f.code) == ("error", "glibc-too-old")
    assert "requires glibc 2.34" in f.what and "manylinux_2_28" in f.what and "2.28" in f.what
    assert f.cause.startswith("glibc too old")
    # the same module on a machine whose glibc is 2.28
    [g] = doctor.module_findings(module, doctor.Target(glibc="2.28"))
    assert "this system's glibc 2.28" in g.what
    assert doctor.module_findings(module, doctor.Target(glibc="2.36", glibc_policy="manylinux_2_34")) == []


def test_library_version_missing(tmp_path):
    case = built(build.versioned_case, tmp_path)
    module = inspect(case["module"], dirs=[case["v1"].parent])
    found = doctor.module_findings(module, doctor.Target())
    assert codes(found) == ["library-too-old", "undefined-symbol"]
    assert "VERSIONED_2.0" in found[0].what and "VERSIONED_1.0" in found[0].what


def test_missing_library(tmp_path):
    case = built(build.setdevice_case, tmp_path)
    module = inspect(case["module"])
    [f] = doctor.module_findings(module, doctor.Target())
    assert f.code == "missing-library" and "libc10_cuda.so" in f.what
    assert "torch" in f.cause
    assert "_ZN3c104cuda9SetDeviceEi" in f.details["unresolved"]


# ---------------------------------------------------------------------------
# What cannot be inspected is said, not guessed


def test_unreadable_module_is_uninspected(tmp_path):
    junk = tmp_path / "_C.abi3.so"
    junk.write_bytes(b"\x7fELF" + b"\0" * 8)
    module = inspect(junk)
    diag = doctor.diagnose(facts(modules=[module], torch=torch_facts()))
    assert [f.code for f in diag.findings if f.severity == "uninspected"] == ["module-uninspected"]
    assert diag.exit_code == doctor.EXIT_UNINSPECTED
    assert diag.status == "uninspected"


def test_pyelftools_missing_is_a_finding():
    module = probe.ModuleFacts(
        "/site/flash_kernels/_C.abi3.so",
        "flash_kernels",
        None,
        elf.extension_tag("_C.abi3.so"),
        errors=(probe.StepError("read ELF", str(elf.ElfToolsMissing())),),
    )
    diag = doctor.diagnose(
        facts(
            modules=[module],
            torch=torch_facts(),
            tools=probe.Tools(pyelftools=False, abi3info=False, cxxfilt=True),
        )
    )
    f = next(f for f in diag.findings if f.code == "pyelftools-missing")
    assert f.what == "pyelftools not installed: symbol checks skipped"
    assert diag.exit_code == doctor.EXIT_UNINSPECTED
    none = doctor.diagnose(facts(torch=torch_facts(), tools=probe.Tools(False, False, True)))
    assert next(f for f in none.findings if f.code == "pyelftools-missing").severity == "info"


def test_environment_findings():
    missing = doctor.diagnose(facts())
    assert "torch-missing" in codes(missing.findings) and missing.exit_code == 20
    broken = doctor.diagnose(
        facts(
            torch=probe.TorchFacts("/site/torch", False, "ImportError: libcudart.so.13: cannot open shared object file")
        )
    )
    [f] = [f for f in broken.findings if f.code == "torch-import-failed"]
    assert "libcudart.so.13" in f.what and "libcudart.so.13" in f.cause
    old_driver = doctor.diagnose(
        facts(torch=torch_facts("2.11.0+cu130", "13.0"), gpus=[probe.Gpu("NVIDIA A100", "8.0", "550.54", 40960)])
    )
    assert "driver-too-old" in codes(old_driver.findings)


# ---------------------------------------------------------------------------
# Recommendation against the repository's real env specs


@pytest.fixture(scope="module")
def specs():
    spec = pytest.importorskip("flashkit.plan.specfile")
    found = spec.load_all(REPO)
    if not found:
        pytest.skip("no env specs under envs/")
    return found


def _env(specs, env_id):
    return next((s for s in specs if str(s.id) == env_id), None)


def test_gpu_host_gets_cu130_torch211(specs):
    if _env(specs, "cu130-torch211") is None:
        pytest.skip("envs/cu130-torch211.yaml not present")
    h200 = probe.Gpu("NVIDIA H200", "9.0", "580.159", 143771)
    gpu_host = facts(
        python="3.12.3",
        glibc="2.39",
        torch=torch_facts("2.11.0+cu130", "13.0", devices=[probe.Device("NVIDIA H200", "9.0")]),
        gpus=[h200],
    )
    diag = doctor.diagnose(gpu_host, specs=specs, verification={}, lockfiles={})
    rec = diag.recommendation
    assert rec.env == "cu130-torch211"
    assert rec.mismatched == ("python",)
    assert rec.add_spec is None  # only the image's Python differs
    assert rec.verification.startswith("not verified")
    assert diag.exit_code == 0, diag.findings


def test_recommendation_names_the_spec_to_add(specs):
    odd = facts(python="3.12.3", torch=torch_facts("2.9.1+cu129", "12.9"))
    rec = doctor.diagnose(odd, specs=specs).recommendation
    assert not rec.exact
    assert rec.add_spec.startswith("add envs/cu129-torch29.yaml")
    assert 'torch: "2.9.1"' in rec.add_spec


def test_recommendation_shows_the_ledger_status(specs):
    env = str(specs[0].id)
    status = model.Verification("build:passed abi:passed cpu:passed gpu:not-run artifact-gpu:passed(applies)", True)
    spec = specs[0]
    t = torch_facts(
        f"{spec.torch}+cu",
        spec.accelerator.version if spec.accelerator.kind == "cuda" else None,
        cxx11=spec.cxx11_abi,
        hip=spec.accelerator.version if spec.accelerator.kind == "rocm" else None,
    )
    rec = doctor.diagnose(
        facts(python=f"{spec.python}.1", torch=t),
        specs=specs,
        verification={env: status},
        lockfiles={env: f"lockfiles/{env}.txt"},
    ).recommendation
    assert rec.env == env
    assert rec.verification == status.status
    assert rec.lockfile == f"lockfiles/{env}.txt"


def test_json_is_stable_and_serialisable(tmp_path):
    case = built(build.setdevice_case, tmp_path)
    module = inspect(case["module"], dirs=[case["v2"].parent])
    f = facts(modules=[module], torch=torch_facts())
    diag = doctor.diagnose(f)
    data = json.loads(json.dumps(doctor.to_json(diag, f)))
    assert data["schema_version"] == doctor.SCHEMA_VERSION == 1
    assert data["status"] == "problems" and data["exit_code"] == 20
    assert set(data["findings"][0]) == {"severity", "code", "subject", "what", "cause", "fix", "details"}
    assert data["facts"]["modules"][0]["tag"]["kind"] == "plain"


def test_finding_refuses_an_unknown_severity():
    with pytest.raises(ValueError, match="severity"):
        doctor.Finding("fatal", "x", "y", "z")
    assert dataclasses.is_dataclass(doctor.Finding("info", "x", "y", "z"))


def test_facts_survive_json(tmp_path, sm80_module):
    """Facts probed on one host (a GPU box, an image) are diagnosed on another: to_json/from_json round trip."""
    case = built(build.setdevice_case, tmp_path / "sd")
    cuda = inspect(sm80_module)
    module = inspect(case["module"], dirs=[case["v2"].parent])
    f = facts(
        modules=[module, cuda],
        torch=torch_facts(devices=[probe.Device("NVIDIA H200", "9.0")]),
        gpus=[probe.Gpu("NVIDIA H200", "9.0", "580.159", 143771)],
    )
    again = probe.Facts.from_json(json.loads(json.dumps(f.to_json())))
    assert again == f
    assert doctor.diagnose(again) == doctor.diagnose(f)
    with pytest.raises(ValueError, match="not the facts of a flashkit probe"):
        probe.Facts.from_json({"interpreter": None})


def test_loader_message_names_the_symbol_without_pyelftools():
    """No ELF reading possible: the import error's own 'undefined symbol' still gets a cause."""
    module = probe.ModuleFacts(
        "/site/flash_kernels/_C.abi3.so",
        "flash_kernels",
        "flash_kernels",
        elf.extension_tag("_C.abi3.so"),
        extension=None,
        import_error="ImportError: /site/flash_kernels/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
        import_tried=True,
        loader_symbol=("_ZN3c104cuda9SetDeviceEi", "c10::cuda::SetDevice(int)"),
        errors=(probe.StepError("read ELF", str(elf.ElfToolsMissing())),),
    )
    found = doctor.module_findings(module, doctor.Target(torch_version="2.11.0+cu130"))
    [f] = [f for f in found if f.code == "undefined-symbol"]
    assert "c10::cuda::SetDevice(int)" in f.what
    assert f.cause.startswith("built against another torch version")
    assert f.details["source"] == "loader message"


def test_recommendation_asks_for_a_missing_gpu_target(specs):
    if _env(specs, "cu130-torch211") is None:
        pytest.skip("envs/cu130-torch211.yaml not present")
    blackwell = facts(
        python="3.11.7",
        torch=torch_facts("2.11.0+cu130", "13.0", devices=[probe.Device("NVIDIA RTX PRO 6000", "12.0")]),
        gpus=[probe.Gpu("NVIDIA RTX PRO 6000", "12.0", "580.159", 97887)],
    )
    rec = doctor.diagnose(blackwell, specs=specs).recommendation
    assert rec.env == "cu130-torch211" and rec.mismatched == ("gpu_targets",)
    assert rec.add_spec == "add '12.0' to gpu_targets in envs/cu130-torch211.yaml"


# ---------------------------------------------------------------------------
# A wheel built for another torch and CUDA (the integration test makes the real one in images)


def _cu13_module_under_torch27() -> probe.ModuleFacts:
    """What inspect_module read from cu130-torch211's _C.abi3.so inside cu124-torch27's image."""
    path = "/opt/venv/lib/python3.13/site-packages/flash_kernels/_C.abi3.so"
    near = linking.NearMiss(
        "_ZN3c104cuda9SetDeviceEa", "c10::cuda::SetDevice(signed char)", None, "/site/torch/lib/libc10_cuda.so", False
    )
    unresolved = (
        linking.UnresolvedSymbol(
            "_ZN3c104cuda9SetDeviceEab", "c10::cuda::SetDevice(signed char, bool)", None, None, "FUNC", (near,)
        ),
        linking.UnresolvedSymbol("cudaGetLastError", "cudaGetLastError", None, None, "FUNC", ()),
    )
    res = linking.Resolution(
        module=path,
        loaded=(),
        missing_libraries=(linking.MissingLibrary("libcudart.so.13", path, ("/site/torch/lib",)),),
        missing_versions=(),
        unresolved=unresolved,
        unreadable=(),
        demangler=True,
    )
    return probe.ModuleFacts(
        path,
        "flash_kernels",
        "flash_kernels",
        elf.extension_tag(path),
        extension=True,
        elf_read=True,
        needed=("libc10.so", "libcudart.so.13", "libc10_cuda.so"),
        resolution=res,
    )


def _dist(version: str) -> probe.Distribution:
    return probe.Distribution("flash_kernels", version, "/site", ("cp310-abi3-linux_x86_64",), "pip")


def test_torch_symbols_are_named_beside_a_missing_cuda_runtime():
    m = _cu13_module_under_torch27()
    found = doctor.module_findings(m, doctor.Target(torch_version="2.7.1+cu126", torch_cuda="12.6"))
    # cudaGetLastError is libcudart.so.13's to define; SetDevice is torch's, missing or not
    assert codes(found) == ["missing-library", "undefined-symbol"]
    sym = next(f for f in found if f.code == "undefined-symbol")
    assert sym.details["demangled"] == "c10::cuda::SetDevice(signed char, bool)"
    assert "another torch version" in sym.cause and "SetDevice(signed char)`" in sym.cause
    lib = next(f for f in found if f.code == "missing-library")
    assert "CUDA 13 runtime" in lib.cause and "torch here uses CUDA 12.6" in lib.cause
    assert "does not help" in lib.fix


def test_build_label():
    assert doctor.build_label("0.1.0+cu130torch2.11cxx11abitrue") == doctor.BuildLabel("2.11", "13.0", None, True)
    # flash-attn's release wheels name only the CUDA major
    assert doctor.build_label("2.7.4.post1+cu12torch2.6cxx11abiFALSE") == doctor.BuildLabel("2.6", "12", None, False)
    assert doctor.build_label("0.1.0+rocm6.4torch2.7") == doctor.BuildLabel("2.7", None, "6.4", None)
    assert doctor.build_label("0.1.0") is None
    assert doctor.build_label("0.1.0+local") is None


def test_build_label_of_a_stable_abi_wheel():
    # CUDA major, the oldest torch it fits, no cxx11 flag (only C symbols cross into libtorch)
    label = doctor.build_label("0.1.0+cu13stable2.10")
    assert label == doctor.BuildLabel("2.10", "13", None, None, stable=True)
    assert [label.fits_torch(v) for v in ("2.9.1+cu130", "2.10.0", "2.13.0+cu130", "3.0.0")] == [
        False,
        True,
        True,
        True,
    ]
    # a version-bound label fits its own torch minor only
    bound = doctor.build_label("0.1.0+cu130torch2.11cxx11abiTRUE")
    assert not bound.stable and bound.fits_torch("2.11.0") and not bound.fits_torch("2.13.0")


STABLE = "0.1.0+cu13stable2.10"


@pytest.fixture(scope="module")
def stable(tmp_path_factory):
    return built(build.stable_case, tmp_path_factory.mktemp("stable"))


def test_stable_wheel_on_a_torch_older_than_its_target(stable):
    """torch_library_impl (new in torch 2.10) is missing from a torch 2.9: the stable wheel needs torch >= 2.10."""
    module = inspect(stable["module"], dirs=[stable["v2_9"].parent])
    old = facts(modules=[module], torch=torch_facts("2.9.1+cu130", "13.0"), distributions=[_dist(STABLE)])
    diag = doctor.diagnose(old)
    [sym] = [f for f in diag.findings if f.code == "undefined-symbol"]
    assert sym.details["symbol"] == "torch_library_impl"
    assert sym.cause.startswith("this stable-ABI wheel needs torch >= 2.10: `torch_library_impl` is a function")
    assert "torch 2.9.1+cu130 does not export" in sym.cause
    assert "every later torch built with CUDA 13" in sym.cause
    assert sym.fix.startswith("install torch >= 2.10 built with CUDA 13 (this one wheel fits them all)")
    [f] = [f for f in diag.findings if f.code == "built-for-another-torch"]
    assert f.severity == "error"
    assert f.what == (
        f"flash_kernels {STABLE} was built for the stable ABI of torch >= 2.10 with CUDA 13; "
        "this environment has torch 2.9.1+cu130 with CUDA 13.0"
    )
    assert f.cause.startswith(
        "this stable-ABI wheel needs torch >= 2.10 (it fits torch 2.10 and every later torch with CUDA 13): "
    )
    assert "its version label +cu13stable2.10" in f.cause and "`torch_library_impl`" in f.cause
    assert "or keep this wheel: install any torch >= 2.10 built with CUDA 13" in f.fix
    assert f.details["symbols"] == ["torch_library_impl"] and f.details["built_for"]["stable_abi"] is True
    # The same module from a version-bound wheel keeps the old explanation.
    bound = dataclasses.replace(old, distributions=(_dist("0.1.0+cu130torch2.9cxx11abitrue"),))
    [sym] = [f for f in doctor.diagnose(bound).findings if f.code == "undefined-symbol"]
    assert "stable-ABI" not in sym.cause
    # The loader's message alone (no ELF reading) gets the same cause.
    loader = probe.ModuleFacts(
        "/site/flash_kernels/_C.abi3.so",
        "flash_kernels",
        "flash_kernels",
        elf.extension_tag("_C.abi3.so"),
        import_error="ImportError: /site/flash_kernels/_C.abi3.so: undefined symbol: torch_library_impl",
        import_tried=True,
        loader_symbol=("torch_library_impl", "torch_library_impl"),
    )
    found = doctor.module_findings(loader, doctor.Target(torch_version="2.9.1"), doctor.build_label(STABLE))
    [f] = [f for f in found if f.code == "undefined-symbol"]
    assert f.cause.startswith("this stable-ABI wheel needs torch >= 2.10")


def test_stable_wheel_fits_every_later_torch_of_its_cuda_major(stable, specs):
    module = inspect(stable["module"], dirs=[stable["v2_10"].parent])
    new = facts(modules=[module], torch=torch_facts("2.13.0+cu130", "13.0"), distributions=[_dist(STABLE)])
    diag = doctor.diagnose(new)
    assert "built-for-another-torch" not in codes(diag.findings) and diag.exit_code == 0
    [f] = [f for f in diag.findings if f.code == "stable-abi-wheel"]
    assert f.severity == "info"
    assert f.what == (
        f"flash_kernels {STABLE} is a stable-ABI wheel: it fits torch 2.10 and every later torch with CUDA 13, "
        "so this environment's torch 2.13.0+cu130 with CUDA 13.0 too"
    )
    # the same torch minor, another CUDA major: it does not fit
    cu12 = dataclasses.replace(new, modules=(), torch=torch_facts("2.13.0+cu128", "12.8"))
    [w] = [f for f in doctor.diagnose(cu12, specs=specs).findings if f.code == "built-for-another-torch"]
    assert w.severity == "warning"
    assert "but only those built with CUDA 13 (this one has CUDA 12.8)" in w.cause
    if _env(specs, "cu130-torch211") is not None:
        assert "install any torch >= 2.10 built with CUDA 13, e.g. env cu130-torch2" in w.fix


def test_built_for_another_torch_names_both_ways_out(specs):
    if _env(specs, "cu124-torch27") is None or _env(specs, "cu130-torch211") is None:
        pytest.skip("needs envs/cu124-torch27.yaml and envs/cu130-torch211.yaml")
    lockfiles = {"cu124-torch27": "lockfiles/cu124-torch27.txt", "cu130-torch211": "lockfiles/cu130-torch211.txt"}
    broken = facts(
        modules=[_cu13_module_under_torch27()],
        python="3.13.5",
        torch=torch_facts(),
        distributions=[_dist("0.1.0+cu130torch2.11cxx11abitrue")],
    )
    diag = doctor.diagnose(broken, specs=specs, lockfiles=lockfiles, lock_cuda={"cu124-torch27": "12.6"})
    [f] = [f for f in diag.findings if f.code == "built-for-another-torch"]
    assert f.severity == "error" and f.subject == "flash_kernels"
    assert f.what == (
        "flash_kernels 0.1.0+cu130torch2.11cxx11abitrue was built for torch 2.11 with CUDA 13.0; "
        "this environment has torch 2.7.1+cu126 with CUDA 12.6"
    )
    assert "libcudart.so.13" in f.cause and "`c10::cuda::SetDevice(signed char, bool)`" in f.cause
    assert "keep torch 2.7.1+cu126" in f.fix and "env cu124-torch27" in f.fix and "lockfiles/cu124-torch27.txt" in f.fix
    assert "env cu130-torch211" in f.fix
    assert "(the recommended env cu124-torch27)" in next(x.fix for x in diag.findings if x.code == "missing-library")

    # the same package built for this torch: no such finding
    fine = dataclasses.replace(broken, modules=(), distributions=(_dist("0.1.0+cu126torch2.7cxx11abitrue"),))
    assert "built-for-another-torch" not in codes(doctor.diagnose(fine, specs=specs).findings)
    # a label that differs but no module error: a warning
    quiet = dataclasses.replace(broken, modules=(), distributions=(_dist("0.1.0+cu126torch2.6cxx11abitrue"),))
    [w] = [f for f in doctor.diagnose(quiet, specs=specs).findings if f.code == "built-for-another-torch"]
    assert w.severity == "warning"


def test_env_image_fits_through_its_lockfile_cuda(specs):
    """torch 2.7.1 from PyPI is cu126 beside the env's nvcc 12.4: the env's own image fits it."""
    if _env(specs, "cu124-torch27") is None:
        pytest.skip("envs/cu124-torch27.yaml not present")
    lock = REPO / "lockfiles" / "cu124-torch27" / "py3.13.txt"
    if not lock.is_file():
        pytest.skip("lockfiles/cu124-torch27/py3.13.txt not present")
    assert repo.lock_cuda_runtime(lock.read_text()) == "12.6"
    own = facts(python="3.13.5", torch=torch_facts())
    rec = doctor.diagnose(own, specs=specs, lock_cuda={"cu124-torch27": "12.6"}).recommendation
    assert rec.env == "cu124-torch27" and rec.exact and rec.add_spec is None
    without = doctor.diagnose(own, specs=specs).recommendation
    assert without.env == "cu124-torch27" and not without.exact


def test_recommendation_gives_the_install_command_for_the_inspected_python():
    """torch 2.7.1+cu126 on Python 3.10: cu124-torch27, with the file resolved for 3.10."""
    found = repo.load(REPO)
    kw = {"specs": found.specs, "lockfiles": found.lockfiles, "requirements": found.requirements}
    diag = doctor.diagnose(facts(python="3.10.4", torch=torch_facts()), lock_cuda={"cu124-torch27": "12.6"}, **kw)
    rec = diag.recommendation
    assert rec.env == "cu124-torch27" and rec.lockfile == "lockfiles/cu124-torch27/py3.10.txt"
    # The checkout records no publication: no command (the committed set would install torch, no kernel).
    assert rec.install == () and rec.python_note is None
    assert "nothing of cu124-torch27 is published for Python 3.10" in rec.publication_note
    assert "python-not-covered" not in {f.code for f in diag.findings}
    published = {
        "cu124-torch27": dataclasses.replace(
            found.requirements["cu124-torch27"],
            published={"3.10": ("https://f.example/r/py3.10.txt", "https://f.example/r/py3.10-test.txt")},
        )
    }
    rec = doctor.diagnose(
        facts(python="3.10.4", torch=torch_facts()),
        lock_cuda={"cu124-torch27": "12.6"},
        **{**kw, "requirements": published},
    ).recommendation
    assert rec.install == (
        "pip install --require-hashes -r https://f.example/r/py3.10.txt",
        "uv pip install --require-hashes -r https://f.example/r/py3.10.txt",
    )
    assert rec.lockfile == "https://f.example/r/py3.10.txt" and rec.publication_note is None
    # torch 2.11 on Python 3.9: no torch 2.11 wheel exists for it; doctor says so and gives no command.
    diag = doctor.diagnose(facts(python="3.9.18", torch=torch_facts("2.11.0+cu130", "13.0")), **kw)
    rec = diag.recommendation
    assert rec.env == "cu130-torch211" and rec.install == () and rec.lockfile == "lockfiles/cu130-torch211.txt"
    assert (
        rec.python_note
        == "Python 3.9 is not covered: torch 2.11.0 has no wheels for Python 3.9 (covered: 3.10, 3.11, 3.12, 3.13, 3.14)"
    )
    (w,) = [f for f in diag.findings if f.code == "python-not-covered"]
    assert w.severity == "warning" and "torch 2.11.0 has no wheels" in w.cause


def test_without_torch_the_env_covering_this_python_is_preferred():
    found = repo.load(REPO)
    rec = doctor.diagnose(
        facts(python="3.9.18"), specs=found.specs, lockfiles=found.lockfiles, requirements=found.requirements
    ).recommendation
    assert "3.9" in found.requirements[rec.env].covered
    assert rec.python_note is None and rec.publication_note  # covered; nothing published in this checkout
