"""``flashkit doctor`` against real broken artifacts made in the env images.

- torch mismatch: cu130-torch211's flash_kernels wheel installed into cu124-torch27's runtime
  image (torch 2.7, CUDA 12), with flashkit installed there from wheels fetched on the host for
  the image's Python, as a user without network would; doctor runs inside.
- wrong GPU arch: a CUDA extension module compiled by nvcc 13 in cu130-torch211's builder image for
  sm_80 only, checked against an sm_90 GPU (``--arch 9.0``, and the H200 host's recorded facts).
- Python tag: a CPython 3.13 (not abi3) extension compiled in cu124-torch27's builder image,
  inspected by doctor in an environment of the host's Python.

Each needs the images `flashkit build` made at the current input hash; a test skips, naming the
command, when they are not built here. Nothing is mocked: the compilers, loaders and images are real.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flashkit.images.buildah import WorkingContainer, find_buildah
from flashkit.images.container import BindMount, Container

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
H200_FACTS = ROOT / "benchmarks/results/doctor_h200.json"  # `flashkit doctor --json` on the GPU host

# A CUDA kernel in a Python extension module. It links the CUDA 13 runtime that torch 2.11
# brings (PyPI's nvcc has no static cudart), so it loads after `import torch` on any machine;
# only its GPU code decides where the kernel runs.
SM80_SOURCE = r"""
#include <Python.h>

__global__ void scale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

static PyObject *launch(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  float *d = nullptr;
  if (cudaMalloc(&d, 4 * sizeof(float)) != cudaSuccess) {
    PyErr_SetString(PyExc_RuntimeError, "cudaMalloc failed");
    return NULL;
  }
  scale<<<1, 4>>>(d, 2.0f, 4);
  cudaError_t err = cudaDeviceSynchronize();
  cudaFree(d);
  if (err != cudaSuccess) {
    PyErr_SetString(PyExc_RuntimeError, cudaGetErrorString(err));
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {{"launch", launch, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sm80", NULL, -1, methods};
PyMODINIT_FUNC PyInit__sm80(void) { return PyModule_Create(&module); }
"""

# Full (not limited) C API, and PyLong_AsInt, which CPython 3.13 added.
CP313_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *as_int(PyObject *self, PyObject *arg) {
  (void)self;
  int v = PyLong_AsInt(arg);
  if (v == -1 && PyErr_Occurred()) return NULL;
  return PyLong_FromLong(v);
}

static PyMethodDef methods[] = {{"as_int", as_int, METH_O, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pyver", NULL, -1, methods};
PyMODINIT_FUNC PyInit__pyver(void) { return PyModule_Create(&module); }
"""

# The image's interpreter says where its headers are and which suffix its extensions carry.
_PY_PATHS = (
    "INC=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])'); "
    "EXT=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var(\"EXT_SUFFIX\"))'); "
)


def _pip() -> list[str]:
    """A pip to fetch wheels with: this interpreter's, else the system's (nox's uv venvs have none)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for exe in ("pip3", "pip"):
        found = shutil.which(exe)
        if found:
            return [found]
    pytest.skip("no pip on this host to build flashkit's wheel and fetch its dependencies")


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    if proc.returncode != 0:
        pytest.fail(f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def _json_of(result) -> dict:
    """The JSON object an exec printed (its stdout and stderr come interleaved: skip any line before it)."""
    start = 0 if result.output.startswith("{") else result.output.find("\n{") + 1
    if not start and not result.output.startswith("{"):
        pytest.fail(f"no JSON in the output (exit {result.exit_code}):\n{result.output[-3000:]}")
    obj, _ = json.JSONDecoder().raw_decode(result.output[start:])
    return obj


def _checked(result, what: str):
    assert result.exit_code == 0, f"{what} failed in the container:\n{result.output[-4000:]}"
    return result


@pytest.fixture(scope="module")
def kit_wheels(tmp_path_factory):
    """``kit_wheels("3.13")``: flashkit's wheel and its dependencies' wheels for that CPython, on this host."""
    made: dict[str, Path] = {}
    base = tmp_path_factory.mktemp("kit-wheels")

    def get(python: str) -> Path:
        if python in made:
            return made[python]
        out = base / f"cp{python.replace('.', '')}"
        out.mkdir()
        pip = _pip()
        if "src" not in made:
            # the distribution is pyproject.toml + flashkit/: built from a copy, so no build/ lands in the checkout
            src = base / "src"
            shutil.copytree(ROOT / "flashkit", src / "flashkit", ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy2(ROOT / "pyproject.toml", src / "pyproject.toml")
            made["src"] = src
        _run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(made["src"])])
        (kit,) = out.glob("flashkit-*.whl")
        platforms = [
            a for p in ("manylinux_2_28", "manylinux_2_17", "manylinux2014") for a in ("--platform", f"{p}_x86_64")
        ]
        _run(
            [*pip, "download", "--quiet", "--only-binary=:all:", "--python-version", python,
             "--implementation", "cp", *platforms, "--dest", str(out), str(kit)]
        )  # fmt: skip
        made[python] = out
        return out

    return get


# ---------------------------------------------------------------------------
# 1. A version-bound wheel (torch 2.7 / CUDA 12) under torch 2.11 / CUDA 13, and the stable-ABI wheel
#    (torch >= 2.10 / CUDA 13) under torch 2.7 / CUDA 12: both must fail, each explained its own way.


def _swap_wheel(engine, kit_wheels, host, donor, python: str):
    """Run doctor in ``host``'s runtime image with ``donor``'s wheel installed, then with its own again."""
    wheel = Path(donor.wheel_path)
    mounts = [
        BindMount(str(kit_wheels(python)), "/kit-wheels"),
        BindMount(str(wheel.parent), "/donor"),
        BindMount(str(Path(host.wheel_path).parent), "/own"),
        BindMount(str(ROOT), "/repo"),
    ]
    with Container(engine, host.runtime_ref, mounts=mounts, network=False, name_prefix="flashkit-doctor") as c:
        # The image's venv is root's; its user runs doctor as a user would.
        pip = ["python3", "-m", "pip", "install", "--quiet", "--no-index"]
        _checked(c.exec([*pip, "--find-links", "/kit-wheels", "flashkit"], user="root"), "pip install flashkit")
        _checked(
            c.exec([*pip, "--no-deps", "--force-reinstall", f"/donor/{wheel.name}"], user="root"),
            f"pip install the {donor.env} wheel",
        )
        data_run = c.exec(["flashkit", "doctor", "--repo", "/repo", "--json"], workdir="/tmp")
        human_run = c.exec(["flashkit", "doctor", "--repo", "/repo"], workdir="/tmp")
        # the fix doctor gives: the wheel of the env that matches this torch
        _checked(
            c.exec([*pip, "--no-deps", "--force-reinstall", f"/own/{Path(host.wheel_path).name}"], user="root"),
            f"pip install the {host.env} wheel",
        )
        healed_run = c.exec(["flashkit", "doctor", "--repo", "/repo", "--json"], workdir="/tmp")
        return {"wheel": wheel, "json": data_run, "human": human_run, "healed": healed_run}


@pytest.fixture(scope="module")
def torch_mismatch(engine, built_env, kit_wheels):
    """A cu130-torch211 runtime container (torch 2.11) with cu124-torch27's version-bound wheel installed."""
    return _swap_wheel(engine, kit_wheels, built_env("cu130-torch211"), built_env("cu124-torch27"), "3.11")


@pytest.fixture(scope="module")
def stable_on_old_torch(engine, built_env, kit_wheels):
    """A cu124-torch27 runtime container (torch 2.7) with cu130-torch211's stable-ABI wheel installed."""
    return _swap_wheel(engine, kit_wheels, built_env("cu124-torch27"), built_env("cu130-torch211"), "3.13")


def _by_code(data: dict) -> dict[str, list[dict]]:
    by_code: dict[str, list[dict]] = {}
    for f in data["findings"]:
        by_code.setdefault(f["code"], []).append(f)
    return by_code


def test_torch_mismatch_names_symbol_cause_and_fix(torch_mismatch):
    run = torch_mismatch["json"]
    assert run.exit_code == 20, run.output[-3000:]
    data = _json_of(run)
    assert data["status"] == "problems" and data["exit_code"] == 20
    facts = data["facts"]
    assert facts["torch"]["version"].startswith("2.11.") and facts["torch"]["cuda"].startswith("13.")
    by_code = _by_code(data)

    # the torch 2.7 symbols torch 2.11 lacks, demangled, each blamed on the torch version
    symbols = [f for f in by_code.get("undefined-symbol", []) if f["details"]["demangled"].startswith("c10::")]
    assert symbols, [f["what"] for f in data["findings"]]
    for f in symbols:
        d = f["details"]
        assert d["symbol"].startswith("_Z") and d["demangled"] != d["symbol"] and "(" in d["demangled"]
        assert d["demangled"] in f["what"]
        assert "built against another torch version" in f["cause"] and "2.11." in f["cause"]
        assert f["severity"] == "error"

    # the CUDA 12 runtime the module links, absent beside torch's CUDA 13
    (cudart,) = [f for f in by_code["missing-library"] if f["details"]["library"] == "libcudart.so.12"]
    assert "CUDA 12 runtime" in cudart["cause"] and "torch here uses CUDA 13." in cudart["cause"]

    # the verdict on the wheel: built for what, found what, and both ways out
    (built,) = by_code["built-for-another-torch"]
    assert built["severity"] == "error" and built["subject"] == "flash_kernels"
    assert "was built for torch 2.7 with CUDA 12.6" in built["what"], built["what"]
    assert "this environment has torch 2.11." in built["what"] and "with CUDA 13." in built["what"]
    assert "libcudart.so.12" in built["cause"] and "torch C++ symbol(s)" in built["cause"]
    assert "env cu130-torch211" in built["fix"] and "env cu124-torch27" in built["fix"]
    assert built["details"]["built_for"]["torch"] == "2.7"

    rec = data["recommendation"]
    assert rec["env"] == "cu130-torch211" and rec["exact"] is True, rec


def test_torch_mismatch_human_output(torch_mismatch):
    run = torch_mismatch["human"]
    assert run.exit_code == 20, run.output[-3000:]
    text = run.output
    assert "[built-for-another-torch]" in text and "[undefined-symbol]" in text and "[missing-library]" in text
    assert "undefined symbol: _ZN3c10" in text and "(c10::" in text  # mangled for grep, demangled to read
    assert "recommended env: cu130-torch211 (fits)" in text
    assert "status: problems (exit 20)" in text


def test_torch_mismatch_fix_heals(torch_mismatch):
    """Doctor's fix applied (the env's own wheel in its own image): healthy, so the test above can fail."""
    run = torch_mismatch["healed"]
    data = _json_of(run)
    assert [f["what"] for f in data["findings"] if f["severity"] in ("error", "warning")] == []
    assert run.exit_code == 0 and data["status"] == "healthy"
    (mod,) = [m for m in data["facts"]["modules"] if m["package"] == "flash_kernels"]
    assert mod["import_tried"] and mod["import_error"] is None and mod["resolution"]["unresolved"] == []
    assert data["recommendation"]["env"] == "cu130-torch211" and data["recommendation"]["exact"] is True


def test_stable_wheel_under_an_older_torch(stable_on_old_torch):
    """The stable-ABI wheel needs torch >= 2.10: under torch 2.7 doctor says so, names the shim symbols torch 2.7
    lacks and the CUDA 13 runtime; no torch C++ symbol is blamed (the wheel has none)."""
    run = stable_on_old_torch["json"]
    assert run.exit_code == 20, run.output[-3000:]
    data = _json_of(run)
    by_code = _by_code(data)
    undefined = by_code.get("undefined-symbol", [])
    assert not [f for f in undefined if f["details"]["demangled"].startswith(("c10::", "at::", "torch::"))]
    shim = [f for f in undefined if f["details"]["symbol"].startswith(("torch_", "aoti_torch_"))]
    assert shim, [f["what"] for f in data["findings"]]
    assert all(f["cause"].startswith("this stable-ABI wheel needs torch >= 2.10") for f in shim)
    (built,) = by_code["built-for-another-torch"]
    assert "was built for the stable ABI of torch >= 2.10 with CUDA 13" in built["what"], built["what"]
    assert "this environment has torch 2.7." in built["what"]
    assert built["details"]["built_for"]["stable_abi"] is True
    assert [f for f in by_code["missing-library"] if f["details"]["library"] == "libcudart.so.13"]
    healed = _json_of(stable_on_old_torch["healed"])
    assert healed["status"] == "healthy", [f["what"] for f in healed["findings"]]


# ---------------------------------------------------------------------------
# Host-side environments for the modules compiled in the builder images


def _venv_with_flash_attn(tmp_path: Path, module: Path) -> Path:
    """A venv of this host's Python whose site-packages holds a ``flash_attn`` package with ``module``."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    pkg = Path(purelib) / "flash_attn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy2(module, pkg / module.name)
    return python


def _doctor(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLASHKIT_ROOT", None)
    return subprocess.run(
        [sys.executable, "-m", "flashkit.doctor", "--repo", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def _compile_in(builder: str, source: str, name: str, command: str, out: Path) -> Path:
    """Compile ``source`` in a working container of the builder image ``builder`` (in buildah's storage),
    with ``command`` (in /src, $INC/$EXT set), and copy the module out."""
    src = out / "src"
    src.mkdir(parents=True)
    (src / name).write_text(source)
    with WorkingContainer(find_buildah(), builder) as c:
        c.copy_into(src, "/")
        _checked(c.exec(["sh", "-c", f"set -e; cd /src; {_PY_PATHS}{command}"], user="root"), command)
        listing = _checked(c.exec(["sh", "-c", "ls /src/*.so"]), "ls").output.split()
        assert len(listing) == 1, listing
        return c.copy_out(listing[0], out / "built")


# ---------------------------------------------------------------------------
# 2. A module compiled for sm_80 only, for an sm_90 GPU


@pytest.fixture(scope="module")
def sm80_in_builder(built_env, kit_wheels, tmp_path_factory):
    """In cu130-torch211's builder (nvcc 13, torch 2.11): the sm_80-only module compiled and installed
    as part of a ``flash_attn`` package, doctor run there with ``--arch``, and the probed facts copied out."""
    res = built_env("cu130-torch211", builder=True)
    out = tmp_path_factory.mktemp("sm80")
    src = out / "src"
    src.mkdir()
    (src / "sm80.cu").write_text(SM80_SOURCE)
    mounts = [BindMount(str(kit_wheels("3.11")), "/kit-wheels"), BindMount(str(ROOT), "/repo")]
    with WorkingContainer(find_buildah(), res.builder_ref, mounts=mounts) as c:
        c.copy_into(src, "/")
        compile_and_install = (
            "set -e; cd /src; "
            + _PY_PATHS
            + "SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
            'nvcc -shared -Xcompiler -fPIC -cudart shared -L"$CUDA_HOME/lib" '
            '-gencode arch=compute_80,code=sm_80 -I"$INC" sm80.cu -o "_sm80$EXT"; '
            'mkdir -p "$SITE/flash_attn"; : > "$SITE/flash_attn/__init__.py"; cp "_sm80$EXT" "$SITE/flash_attn/"; '
            'echo "$SITE/flash_attn/_sm80$EXT"'
        )
        module = _checked(c.exec(["sh", "-c", compile_and_install]), "nvcc for sm_80").output.split()[-1]
        pip = ["python3", "-m", "pip", "install", "--quiet", "--no-index", "--find-links", "/kit-wheels"]
        _checked(c.exec([*pip, "flashkit"]), "pip install flashkit")
        # the GPU to come, stated; 8.6 is a control: sm_80 code runs there
        arch_run = c.exec(["flashkit", "doctor", "--repo", "/repo", "--json", "--arch", "9.0", "--arch", "8.6"])
        _checked(c.exec(["python3", "-m", "flashkit.doctor.probe", "-o", "/tmp/facts.json"], workdir="/tmp"), "probe")
        facts = c.copy_out("/tmp/facts.json", out)
    yield {"module": module, "arch_run": arch_run, "facts": facts, "dir": out}


def test_sm80_only_module_has_no_code_for_sm90(sm80_in_builder):
    module = sm80_in_builder["module"]
    run = sm80_in_builder["arch_run"]
    assert run.exit_code == 20, run.output[-3000:]
    data = _json_of(run)
    (mod,) = [m for m in data["facts"]["modules"] if m["path"] == module]
    assert mod["cuda"]["cubins"] == ["sm_80"] and mod["cuda"]["ptx"] == [], mod["cuda"]
    assert mod["import_tried"] and mod["import_error"] is None  # it loads: only the GPU code is wrong
    errors = [f for f in data["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["no-gpu-code"], [f["what"] for f in errors]
    (f,) = errors
    assert f["subject"] == module and f["details"]["capability"] == "9.0"  # nothing for the 8.6 control
    assert "no cubin/PTX for sm_90" in f["what"] and "sm_80" in f["what"]
    assert "no kernel image is available" in f["cause"]
    assert "-gencode arch=compute_90,code=sm_90" in f["fix"] and "TORCH_CUDA_ARCH_LIST=9.0" in f["fix"]


def test_sm80_only_module_against_the_h200_facts(sm80_in_builder):
    """The facts probed in the image, with the GPU facts the H200 host's own probe recorded; no --arch.

    Both run torch 2.11.0+cu130, so the H200's nvidia-smi and torch.cuda facts complete the image's:
    together they say what doctor would find with this module installed on that host.
    """
    facts = json.loads(sm80_in_builder["facts"].read_text())["facts"]
    h200 = json.loads(H200_FACTS.read_text())["facts"]
    assert [(g["name"], g["capability"]) for g in h200["gpus"]] == [("NVIDIA H200", "9.0")], h200["gpus"]
    assert facts["gpus"] == [] and facts["torch"]["cuda_available"] is False  # no GPU where it was built
    assert facts["torch"]["version"] == h200["torch"]["version"], (facts["torch"]["version"], h200["torch"]["version"])
    facts["gpus"] = h200["gpus"]
    for key in ("cuda_available", "devices", "arch_list"):
        facts["torch"][key] = h200["torch"][key]
    with_gpu = sm80_in_builder["dir"] / "facts-with-h200.json"
    with_gpu.write_text(json.dumps({"facts": facts}))

    proc = _doctor("--facts", str(with_gpu), "--json")
    data = json.loads(proc.stdout) if proc.stdout else pytest.fail(proc.stderr)
    assert proc.returncode == 20, proc.stderr
    errors = [f for f in data["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["no-gpu-code"], [f["what"] for f in errors]
    (f,) = errors
    assert f["subject"] == sm80_in_builder["module"]
    assert f["details"]["capability"] == "9.0" and f["details"]["cubins"] == ["sm_80"]
    assert "arch=compute_90,code=sm_90" in f["fix"]
    # torch 2.11 with CUDA 13 on an sm_90 GPU: the env that fits, and its targets cover 9.0
    rec = data["recommendation"]
    assert rec["env"] == "cu130-torch211", rec
    assert "gpu_targets cover 9.0" in rec["candidates"][0]["matches"]

    human = _doctor("--facts", str(with_gpu))
    assert "[no-gpu-code] no cubin/PTX for sm_90" in human.stdout, human.stdout + human.stderr
    assert "NVIDIA H200, sm 9.0" in human.stdout
    assert "status: problems (exit 20)" in human.stdout


# ---------------------------------------------------------------------------
# 3. A CPython 3.13 (not abi3) module under another Python


@pytest.fixture(scope="module")
def cp313_module(built_env, tmp_path_factory) -> Path:
    builder = built_env("cu124-torch27", builder=True).builder_ref
    module = _compile_in(
        builder,
        CP313_SOURCE,
        "pyver.c",
        'gcc -shared -fPIC -O2 -I"$INC" pyver.c -o "_pyver$EXT"',
        tmp_path_factory.mktemp("cp313"),
    )
    return module


def test_cpython_module_under_another_python(cp313_module, tmp_path):
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert cp313_module.name == "_pyver.cpython-313-x86_64-linux-gnu.so", cp313_module.name
    if here == "3.13":
        pytest.skip("this host's Python is 3.13, the module's own; the mismatch needs another one")
    python = _venv_with_flash_attn(tmp_path, cp313_module)
    mod_path = str(next((python.parent.parent).rglob(cp313_module.name)))

    proc = _doctor("--python", str(python), "--json")
    data = json.loads(proc.stdout) if proc.stdout else pytest.fail(proc.stderr)
    assert proc.returncode == 20
    (mod,) = [m for m in data["facts"]["modules"] if m["path"] == mod_path]
    assert mod["tag"]["kind"] == "cpython" and mod["tag"]["python"] == [3, 13]
    (f,) = [f for f in data["findings"] if f["code"] == "python-tag-mismatch"]
    assert f["severity"] == "error" and f["subject"] == mod_path
    assert "built for CPython 3.13 (cp313)" in f["what"] and f"this interpreter is Python {here}" in f["what"]
    assert "Python tag mismatch" in f["cause"]
    assert f"cp{here.replace('.', '')}" in f["fix"] and "abi3" in f["fix"]
    # the 3.13-only C API it calls is named, blamed on the Python version
    (sym,) = [
        f for f in data["findings"] if f["code"] == "undefined-symbol" and f["details"]["symbol"] == "PyLong_AsInt"
    ]
    assert "another Python version" in sym["cause"]

    human = _doctor("--python", str(python))
    assert "[python-tag-mismatch] built for CPython 3.13 (cp313)" in human.stdout, human.stdout + human.stderr
    assert "status: problems (exit 20)" in human.stdout
