"""Dry-run installs of an env's production requirements on every Python they cover, against PyPI.

For each covered Python of each env named:

- pip: ``pip install --dry-run --require-hashes --only-binary=:all: --ignore-installed --no-cache-dir
  --target T -r lockfiles/<env>.txt`` (the file users install, dependencies resolved, every wheel
  downloaded and checked against its hash) with a real interpreter of that Python when this host has
  one (``python3.X`` on PATH: markers are evaluated by that interpreter, as on a user's machine);
  otherwise the host's pip with ``--python-version X`` on ``lockfiles/<env>/pyX.txt`` (pip evaluates
  markers against the interpreter that runs it, not --python-version, so the per-Python file, which
  has none, is the one to give it).
- uv: ``uv pip sync --dry-run --require-hashes --python-version X --python-platform x86_64-manylinux_2_28
  --target T lockfiles/<env>.txt``: uv's own marker evaluation picks exactly lockfiles/<env>/pyX.txt's
  pins (checked here). uv's dry run does not download, so it checks no hash.

pip runs isolated from this host's pip configuration (no PIP_* variables, no config file, PyPI's
index only). Every wheel is downloaded (about 3-4 GB per Python): a network benchmark, not a test.

    python3 benchmarks/requirements_dryrun.py cu124-torch27 cu130-torch211 --out benchmarks/results/requirements_dryrun

Writes <out>/<env>.md (commands, versions, outcome per Python) and <out>/<env>_<tool>_py<X.Y>.log.
Exit 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from packaging.utils import canonicalize_name  # noqa: E402

from flashkit.plan import lock, production  # noqa: E402
from flashkit.plan.specfile import load_env  # noqa: E402

INDEX = "https://pypi.org/simple"


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def cert_args() -> list[str]:
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    return ["--cert", ca] if ca else []


def run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[int, float, str]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    log.write_text(f"$ {' '.join(cmd)}\n{out}\nexit {proc.returncode} after {took:.1f} s\n", encoding="utf-8")
    return proc.returncode, took, out


def interpreter(py: str) -> str | None:
    """A working ``python3.X`` on PATH (a pyenv shim of a version not enabled does not count)."""
    found = shutil.which(f"python{py}")
    if found is None:
        return None
    probe = subprocess.run([found, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True)
    return found if probe.returncode == 0 and probe.stdout.decode().strip() == py else None


def pip_case(env_id: str, py: str, tmp: Path, out_dir: Path) -> dict:
    real = interpreter(py)
    target = tmp / f"t-pip-{py}"
    common = ["--dry-run", "--require-hashes", "--only-binary=:all:", "--ignore-installed", "--no-cache-dir"]
    common += ["--index-url", INDEX, *cert_args(), "--target", str(target)]
    if real:
        venv = tmp / f"venv{py}"
        subprocess.run([real, "-m", "venv", str(venv)], check=True, capture_output=True)
        python = str(venv / "bin" / "python")
        req, how = f"lockfiles/{env_id}.txt", f"fresh venv of {real}"
    else:
        python = sys.executable
        req, how = f"lockfiles/{env_id}/py{py}.txt", f"this host's pip with --python-version {py}"
        common += ["--python-version", py]
    version = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True).stdout.split()[1]
    cmd = [python, "-m", "pip", "install", *common, "-r", req]
    rc, took, out = run(cmd, out_dir / f"{env_id}_pip_py{py}.log", pip_env())
    would = re.findall(r"^Would install (.*)$", out, re.M)
    mb = sum(float(x) * (1024 if unit == "GB" else 1 / 1024 if unit == "kB" else 1) for x, unit in
             re.findall(r"Downloading \S+ \(([\d.]+) (kB|MB|GB)\)", out))  # fmt: skip
    n = len(would[0].split()) if would else 0
    return {"py": py, "rc": rc, "s": took, "how": how, "pip": version, "req": req, "n": n, "mb": mb,
            "cmd": " ".join(["python", *cmd[1:]]).replace(str(target), "T")}  # fmt: skip


def uv_case(env_id: str, py: str, tmp: Path, out_dir: Path, want: dict[str, str]) -> dict:
    uv = shutil.which("uv") or "uv"
    target = tmp / f"t-uv-{py}"
    cmd = [uv, "pip", "sync", "--no-config", "--dry-run", "--require-hashes", "--python-version", py,
           "--python-platform", "x86_64-manylinux_2_28", "--target", str(target),
           "--index-url", INDEX, f"lockfiles/{env_id}.txt"]  # fmt: skip
    rc, took, out = run(cmd, out_dir / f"{env_id}_uv_py{py}.log")
    got = dict(re.findall(r"^ \+ (\S+)==(\S+)$", out, re.M))
    same = {canonicalize_name(k): v for k, v in got.items()} == want
    return {"py": py, "rc": rc if same or rc else 99, "s": took, "n": len(got), "same": same,
            "cmd": " ".join(["uv", *cmd[1:]]).replace(str(target), "T")}  # fmt: skip


def report(env_id: str, pips: list[dict], uvs: list[dict], cov: production.Coverage) -> str:
    lines = [f"# {env_id}: dry-run installs of the production requirements, every covered Python", ""]
    lines += [f"Covered: {', '.join(cov.covered)}" + "".join(f"; not {p}: {w}" for p, w in cov.not_covered), ""]
    lines += ["Produced by `python3 benchmarks/requirements_dryrun.py " + env_id + "` (see its docstring).", ""]
    lines += [
        "| Python | pip | how | file | exit | packages | downloaded | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in pips:
        lines.append(f"| {r['py']} | {r['pip']} | {r['how']} | `{r['req']}` | {r['rc']} | {r['n']} | "
                     f"{r['mb'] / 1024:.2f} GB | {r['s']:.0f} |")  # fmt: skip
    lines += ["", "Command (T: a temporary folder; with `--python-version X` where no python3.X is installed):", ""]
    lines += [f"    {pips[0]['cmd']}", ""]
    lines += ["| Python | uv pip sync --dry-run | packages | same pins as pyX.txt |", "|---|---|---|---|"]
    lines += [f"| {r['py']} | exit {r['rc']} | {r['n']} | {'yes' if r['same'] else 'NO'} |" for r in uvs]
    lines += ["", f"    {uvs[0]['cmd']}", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("envs", nargs="+")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/requirements_dryrun")
    ap.add_argument("--python", action="append", help="only these Pythons (default: every covered one)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    for env_id in args.envs:
        spec = load_env(REPO, env_id)
        prod = production.read(REPO, spec)
        cov = production.coverage(spec, prod)
        pips, uvs = [], []
        with tempfile.TemporaryDirectory(prefix="fk-dryrun-") as tmp:
            for py in cov.covered:
                if args.python and py not in args.python:
                    continue
                want = {p.name: p.version for p in lock.parse(prod.sets[py])[0]}
                pips.append(pip_case(env_id, py, Path(tmp), args.out))
                uvs.append(uv_case(env_id, py, Path(tmp), args.out, want))
                print(f"{env_id} py{py}: pip exit {pips[-1]['rc']} ({pips[-1]['n']} packages, "
                      f"{pips[-1]['mb']:.0f} MB, {pips[-1]['s']:.0f} s); uv exit {uvs[-1]['rc']}", flush=True)  # fmt: skip
                shutil.rmtree(Path(tmp) / f"venv{py}", ignore_errors=True)
        (args.out / f"{env_id}.md").write_text(report(env_id, pips, uvs, cov), encoding="utf-8")
        failed |= any(r["rc"] for r in pips + uvs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
