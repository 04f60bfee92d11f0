"""``python -m flashkit.doctor`` end to end, as a subprocess, on this host's real environments.

- the interpreter running the tests (no torch in the kit's venv),
- an interpreter with torch (CPU is enough) named by $FLASHKIT_TORCH_PYTHON, through --python and as the runner
  itself (unset: those tests are skipped and say so; `nox -s torch-tests` makes one and runs them),
- torch packages that are broken for real (their import raises, or kills the interpreter),
- an installed flash_kernels whose compiled module was built against another libc10_cuda.so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kitsupport import torch_python

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "elf"
_spec = importlib.util.spec_from_file_location("elf_fixture_build", FIXTURES / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def doctor(*args: str, python: str = sys.executable, pythonpath: tuple[str, ...] = (), cwd: Path | None = None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, str(REPO)])
    env.pop("FLASHKIT_ROOT", None)
    return subprocess.run(
        [python, "-m", "flashkit.doctor", "--repo", str(REPO), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or REPO,
        timeout=600,
    )


def as_json(proc) -> dict:
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def _has_torch(python: str) -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def test_no_torch_human_and_json(tmp_path):
    if _has_torch(sys.executable):
        pytest.skip("this interpreter has torch; the no-torch case needs one without")
    human = doctor(cwd=tmp_path)
    assert human.returncode == 20, human.stderr
    assert "torch is not installed" in human.stdout
    assert "recommended env:" in human.stdout
    assert "status: problems (exit 20)" in human.stdout
    if importlib.util.find_spec("elftools") is not None:
        # wheel tags are printed as text, not swallowed as rich markup
        assert re.search(r"pyelftools [\d.]+ \[py3-none-any\]", human.stdout), human.stdout

    data = as_json(doctor("--json", cwd=tmp_path))
    assert data["schema_version"] == 1
    assert data["status"] == "problems" and data["exit_code"] == 20
    assert "torch-missing" in [f["code"] for f in data["findings"]]
    assert data["facts"]["torch"] is None
    assert data["facts"]["interpreter"]["executable"] == sys.executable
    assert data["recommendation"]["env"]


@pytest.mark.torch_python
def test_inspects_another_interpreter_with_torch():
    torch_py = torch_python()
    data = as_json(doctor("--json", "--python", torch_py))
    t = data["facts"]["torch"]
    assert t["imported"] is True and t["version"].startswith("2.")
    assert t["cuda"] is None and t["cxx11_abi"] is True
    assert any("libtorch_cpu.so" in p for p in t["loaded_libraries"])
    assert data["facts"]["interpreter"]["executable"] == torch_py
    assert "torch-missing" not in [f["code"] for f in data["findings"]]
    assert data["exit_code"] in (0, 2), data["findings"]


@pytest.mark.torch_python
def test_runs_inside_an_interpreter_without_its_optional_dependencies():
    """The torch interpreter may lack pyyaml/rich/pyelftools: doctor still answers and says what it skipped."""
    torch_py = torch_python()
    proc = doctor(python=torch_py)
    assert proc.returncode in (0, 1, 2), proc.stderr
    assert "Traceback" not in proc.stderr
    assert "torch    2." in proc.stdout or "2.1" in proc.stdout
    missing = {
        name
        for name in ("elftools", "yaml")
        if subprocess.run([torch_py, "-c", f"import {name}"], capture_output=True).returncode
    }
    if "yaml" in missing:
        assert "no recommendation" in proc.stdout
    else:
        assert "recommended env:" in proc.stdout


def _fake_torch(site: Path, body: str) -> None:
    pkg = site / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)


def test_torch_whose_import_raises(tmp_path):
    if _has_torch(sys.executable):
        pytest.skip("a real torch on this interpreter's path would shadow the broken one")
    site = tmp_path / "site"
    _fake_torch(
        site,
        'raise ImportError("libcudart.so.13: cannot open shared object file: No such file or directory")\n',
    )
    data = as_json(doctor("--json", pythonpath=(str(site),)))
    [f] = [f for f in data["findings"] if f["code"] == "torch-import-failed"]
    assert "libcudart.so.13" in f["what"] and "missing" in f["cause"]
    assert data["facts"]["torch"]["imported"] is False
    assert data["exit_code"] == 20


def test_torch_whose_import_kills_the_interpreter(tmp_path):
    if _has_torch(sys.executable):
        pytest.skip("a real torch on this interpreter's path would shadow the broken one")
    site = tmp_path / "site"
    _fake_torch(site, "import os\nos.abort()\n")
    proc = doctor("--json", pythonpath=(str(site),))
    data = as_json(proc)
    [f] = [f for f in data["findings"] if f["code"] == "torch-import-failed"]
    assert "signal" in f["what"]
    assert f["cause"] == "import torch hung or crashed the interpreter"


def test_installed_module_built_against_another_torch(tmp_path):
    site = tmp_path / "site"
    try:
        built = build.flash_package(site)
    except build.ToolMissing as exc:
        pytest.skip(str(exc))
    data = as_json(doctor("--json", "--arch", "9.0", pythonpath=(str(site),)))
    paths = [m["path"] for m in data["facts"]["modules"]]
    assert str(built["module"]) in paths
    sym = [f for f in data["findings"] if f["code"] == "undefined-symbol"]
    assert [f["details"]["symbol"] for f in sym] == ["_ZN3c104cuda9SetDeviceEi"]
    assert sym[0]["subject"] == str(built["module"])
    if sym[0]["details"]["demangled"] != sym[0]["details"]["symbol"]:
        assert "c10::cuda::SetDevice(int)" in sym[0]["what"]
        assert "c10::cuda::SetDevice(signed char)" in sym[0]["cause"]
    assert "built against another torch version" in sym[0]["cause"]
    assert data["exit_code"] == 20


@pytest.mark.torch_python
def test_import_error_of_the_module_is_reported_with_its_cause(tmp_path):
    torch_py = torch_python()
    site = tmp_path / "site"
    try:
        built = build.flash_package(site, ext_suffix=_ext_suffix(torch_py))
    except build.ToolMissing as exc:
        pytest.skip(str(exc))
    data = as_json(doctor("--json", "--python", torch_py, pythonpath=(str(site),)))
    mod = next(m for m in data["facts"]["modules"] if m["path"] == str(built["module"]))
    assert mod["import_tried"] and "undefined symbol: _ZN3c104cuda9SetDeviceEi" in mod["import_error"]
    codes = [(f["code"], f["subject"]) for f in data["findings"]]
    assert ("import-failed", str(built["module"])) in codes
    assert ("undefined-symbol", str(built["module"])) in codes
    # the bundled library is not an extension module: no import attempted, no import finding
    lib = next(m for m in data["facts"]["modules"] if m["path"].endswith("lib/libc10_cuda.so"))
    assert lib["extension"] is False and not lib["import_tried"]


def _ext_suffix(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_unusable_interpreter_means_could_not_inspect(tmp_path):
    proc = doctor("--json", "--python", str(tmp_path / "no-such-python"))
    data = as_json(proc)
    assert proc.returncode == 21 and data["exit_code"] == 21 and data["status"] == "uninspected"
    [f] = [f for f in data["findings"] if f["code"] == "interpreter-unavailable"]
    assert "not found" in f["what"]


def test_bad_arch_is_refused():
    proc = doctor("--arch", "sm90")
    assert proc.returncode == 2
    assert "--arch 'sm90' is not a compute capability" in proc.stderr


def test_facts_probed_elsewhere_are_diagnosed_here(tmp_path):
    """`python -m flashkit.doctor.probe -o FILE` on one host, `flashkit doctor --facts FILE` on another."""
    site = tmp_path / "site"
    try:
        build.flash_package(site)
    except build.ToolMissing as exc:
        pytest.skip(str(exc))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    out = tmp_path / "facts.json"
    proc = subprocess.run(
        [sys.executable, "-m", "flashkit.doctor.probe", "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    direct = as_json(doctor("--json", pythonpath=(str(site),)))
    later = as_json(doctor("--json", "--facts", str(out)))
    assert [(f["code"], f["subject"]) for f in later["findings"]] == [
        (f["code"], f["subject"]) for f in direct["findings"]
    ]
    assert later["recommendation"] == direct["recommendation"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"something": 1}')
    refused = doctor("--facts", str(bad))
    assert refused.returncode == 21 and "no 'facts' object" in refused.stderr


def test_torch_whose_import_hangs(tmp_path):
    if _has_torch(sys.executable):
        pytest.skip("a real torch on this interpreter's path would shadow the broken one")
    site = tmp_path / "site"
    _fake_torch(site, "import time\ntime.sleep(600)\n")
    data = as_json(doctor("--json", "--timeout", "3", pythonpath=(str(site),)))
    [f] = [f for f in data["findings"] if f["code"] == "torch-import-failed"]
    assert "did not answer within 3 s" in f["what"]
    assert f["cause"] == "import torch hung or crashed the interpreter"


@pytest.mark.torch_python
def test_doctor_never_imports_torch_in_its_own_process():
    torch_py = torch_python()
    code = (
        "import sys\n"
        "from flashkit.doctor import diagnose, probe\n"
        "facts = probe.probe()\n"
        "assert facts.torch.imported, facts.torch\n"
        "diagnose.diagnose(facts)\n"
        "sys.exit(1 if 'torch' in sys.modules else 0)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([torch_py, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_facts_from_inside_an_image_read_against_its_mounted_root(tmp_path):
    """An image without pyelftools: probe there with --no-elf, read its modules here through --root."""
    site = tmp_path / "site"
    try:
        built = build.flash_package(site)
    except build.ToolMissing as exc:
        pytest.skip(str(exc))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    facts_file = tmp_path / "facts.json"
    proc = subprocess.run(
        [sys.executable, "-m", "flashkit.doctor.probe", "--no-elf", "-o", str(facts_file)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    unread = as_json(doctor("--json", "--facts", str(facts_file)))
    assert ("module-uninspected", str(built["module"])) in [(f["code"], f["subject"]) for f in unread["findings"]]

    # the "image": the package and the interpreter at their paths inside a root
    root = tmp_path / "image"
    shutil.copytree(site, root / str(site).lstrip("/"))
    interp = json.loads(facts_file.read_text())["facts"]["interpreter"]
    for path in filter(None, (interp["realpath"], interp["libpython"])):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / path.lstrip("/"))
    shutil.rmtree(site)  # from now on the module exists only inside the root

    data = as_json(doctor("--json", "--facts", str(facts_file), "--root", str(root)))
    mod = next(m for m in data["facts"]["modules"] if m["path"] == str(built["module"]))
    assert mod["elf_read"] is True
    bundled = str(site / "flash_kernels" / "lib" / "libc10_cuda.so")
    assert [tuple(x) for x in mod["resolution"]["loaded"]] == [("libc10_cuda.so", bundled)]
    assert mod["resolution"]["unreadable"] == []
    sym = [f for f in data["findings"] if f["code"] == "undefined-symbol"]
    assert [f["details"]["symbol"] for f in sym] == ["_ZN3c104cuda9SetDeviceEi"]
    assert "module-uninspected" not in [f["code"] for f in data["findings"]]

    refused = doctor("--root", str(root))
    assert refused.returncode == 2 and "--root applies to --facts" in refused.stderr


def test_a_fifo_where_a_compiled_module_should_be_is_skipped_not_waited_on(tmp_path):
    """Opening a FIFO for reading blocks until a writer comes; doctor must name it and go on."""
    pkg = tmp_path / "site" / "flash_kernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    os.mkfifo(pkg / "_C.abi3.so")
    proc = doctor("--json", "--no-import", pythonpath=(str(tmp_path / "site"),), cwd=tmp_path)
    data = as_json(proc)
    fifo = str(pkg / "_C.abi3.so")
    found = [f for f in data["findings"] if f["subject"] == fifo or fifo in json.dumps(f["details"])]
    assert found, data["findings"]
    assert any("not a regular file" in json.dumps(f) for f in found), found
    assert proc.returncode in (20, 21) and "Traceback" not in proc.stderr
