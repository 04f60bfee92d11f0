"""Production requirements against PyPI, per covered Python, without downloading torch (marked network).

pip's dry run downloads every wheel it would install, hash checking or not (torch alone is 0.8-1 GB a
Python), so each (env, Python) is checked in two halves:

- every pin: PyPI's JSON simple index (PEP 691) must list, for that version, a wheel that installs on
  that CPython on manylinux_2_28 x86_64, is not yanked, allows that Python (Requires-Python), and whose
  published sha256 is one the lockfile pins. This is the choice pip makes before it downloads: it keeps
  only the files whose index hash is allowed;
- the pins whose wheel is under 50 MB (all but torch, triton, the nvidia-* libraries and
  cuda-bindings): ``pip install --dry-run --require-hashes --no-deps --only-binary=:all: --python-version X``
  downloads them and checks their bytes against the hashes.

The full dry run, torch included, on every covered Python of cu124-torch27 and cu130-torch211 is
benchmarks/requirements_dryrun.py, with its results in benchmarks/results/requirements_dryrun/.
"""

from __future__ import annotations

import functools
import json
import os
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from flashkit.plan import lock, production
from flashkit.plan.specfile import load_all

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[1]
SMALL = 50 * 1024 * 1024
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
CASES = [
    (spec, py)
    for spec in load_all(REPO)
    if spec.torch_source == "pypi"
    for py in sorted(production.read(REPO, spec).sets, key=production.vkey)
]


@functools.cache
def index_files(name: str) -> tuple[dict, ...]:
    req = urllib.request.Request(
        f"https://pypi.org/simple/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    ctx = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or None)
    with urllib.request.urlopen(req, context=ctx, timeout=120) as resp:
        return tuple(json.load(resp)["files"])


def installable(pin: lock.Pin, python: str) -> tuple[dict | None, str]:
    """The pinned wheel pip would take for ``python`` on manylinux_2_28 x86_64, or why there is none."""
    v = production.vkey(python)
    supported = set(cpython_tags(v, platforms=PLATFORMS)) | set(compatible_tags(v, platforms=PLATFORMS))
    seen = []
    for f in index_files(pin.name):
        try:
            _n, version, _b, tags = parse_wheel_filename(f["filename"])
        except InvalidWheelFilename:
            continue  # an sdist: --only-binary=:all: never takes it
        if version != Version(pin.version) or not tags & supported:
            continue
        seen.append(f["filename"])
        rp = f.get("requires-python")
        if f"sha256:{f['hashes'].get('sha256')}" in pin.hashes and not f.get("yanked"):
            if rp and not SpecifierSet(rp).contains(f"{python}.0", prereleases=True):
                return None, f"{f['filename']} requires Python {rp}"
            return f, ""
    return None, f"no wheel with a pinned hash among {seen or 'no compatible wheels'}"


def pip_env() -> dict[str, str]:
    # Isolated from this host's pip configuration (its local indexes and find-links).
    return {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}


@pytest.mark.parametrize(("spec", "python"), CASES, ids=[f"{s.id}-py{py}" for s, py in CASES])
def test_every_pin_installs_on_the_python_by_hash(spec, python, tmp_path):
    text = production.read(REPO, spec).sets[python]
    pins, problems = lock.parse(text)
    assert not problems
    chosen, missing = {}, {}
    for pin in pins:
        f, why = installable(pin, python)
        if f is None:
            missing[pin.name] = why
        else:
            chosen[pin.name] = f
    assert missing == {}, f"{spec.id} on Python {python}"
    assert "torch" in chosen and chosen["torch"]["filename"].startswith(
        f"torch-{spec.torch}-cp{python.replace('.', '')}"
    )

    small = [p for p in pins if chosen[p.name].get("size", 0) < SMALL]
    req = tmp_path / "small.txt"
    req.write_text("".join(f"{p.name}=={p.version} " + " ".join(f"--hash={h}" for h in p.hashes) + "\n" for p in small))
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    # pip (23.2 here) checks a downloaded wheel's Requires-Python against the interpreter running it, not
    # --python-version (networkx 3.7 for 3.12 failed "3.11.7 not in >=3.12"): the index half above checked
    # Requires-Python for the Python under test, so pip is told not to.
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--require-hashes", "--no-deps",
           "--only-binary=:all:", "--ignore-installed", "--ignore-requires-python", "--python-version", python, "--target", str(tmp_path / "t"),
           "--index-url", "https://pypi.org/simple", *(["--cert", ca] if ca else []), "-r", str(req)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=pip_env(), timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    would = next(line for line in res.stdout.splitlines() if line.startswith("Would install"))
    assert len(would.split()) - 2 == len(small), would


def test_a_wrong_hash_is_caught_without_a_download():
    """The index half can fail: torch with a hash of another file of the same release is refused."""
    spec = next(s for s, _ in CASES if str(s.id) == "cu130-torch211")
    pin = next(p for p in lock.parse(production.read(REPO, spec).sets["3.12"])[0] if p.name == "torch")
    own, _ = installable(pin, "3.12")
    wrong = lock.Pin(pin.name, pin.version, tuple(h for h in pin.hashes if h != f"sha256:{own['hashes']['sha256']}"))
    f, why = installable(wrong, "3.12")
    assert f is None and "no wheel with a pinned hash" in why and "cp312" in why
