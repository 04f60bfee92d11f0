"""Production requirements for every Python an env's torch supports (offline: what CI runs).

The committed files are checked structurally: every Python the torch series has wheels for is either
covered (a ``py<X.Y>.txt``) or named as not covered with a reason; what pip or uv select from the merged
``lockfiles/<env>.txt`` on each covered Python is exactly that Python's file, pin for pin and hash for
hash; only the image's own file is an input of the image. The network half (PyPI): test_production_network.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from flashkit.core.errors import PythonNotCovered
from flashkit.plan import compat, lock, production
from flashkit.plan.plan import load_plan
from flashkit.plan.specfile import load_all, load_env

REPO = Path(__file__).resolve().parents[1]
SPECS = load_all(REPO)
PYPI = [s for s in SPECS if s.torch_source == "pypi"]


def _read(spec, root=REPO):
    return production.read(root, spec)


@pytest.mark.parametrize("spec", SPECS, ids=[str(s.id) for s in SPECS])
def test_committed_production_files_are_consistent(spec):
    prod = _read(spec)
    assert production.check(spec, prod) == []
    assert spec.python in prod.sets
    # The image's own set is the file the plan reads, byte for byte.
    assert prod.sets[spec.python] == load_plan(REPO, str(spec.id)).locks.runtime


@pytest.mark.parametrize("spec", PYPI, ids=[str(s.id) for s in PYPI])
def test_every_python_of_the_torch_is_covered_or_named_with_a_reason(spec):
    prod = _read(spec)
    claimed = set(compat.TORCH_PYTHONS[spec.torch_series])
    assert set(prod.sets) | set(prod.not_covered) == claimed
    assert not set(prod.sets) & set(prod.not_covered)
    assert all(why.strip() for why in prod.not_covered.values())


@pytest.mark.parametrize("spec", PYPI, ids=[str(s.id) for s in PYPI])
def test_the_merged_file_gives_each_python_exactly_its_own_set(spec):
    prod = _read(spec)
    pins, not_covered, problems = production.parse_merged(prod.merged)
    assert problems == [] and not_covered == prod.not_covered
    for py, text in prod.sets.items():
        chosen, dupes = production.pins_for(pins, py)
        assert dupes == []
        own = {p.name: p for p in lock.parse(text)[0]}
        assert chosen == own, f"Python {py}"
        assert chosen["torch"].version == spec.torch
    # Every line is meant for at least one covered Python.
    assert all(p.marker is None or any(production.pins_for([p], py)[0] for py in prod.sets) for p in pins)


def test_the_known_gaps_are_recorded():
    """torch 2.15 has cp315 wheels but numpy<2.4 (the CPU tier's pin) has none: 3.15 is not covered."""
    prod = _read(load_env(REPO, "cu130-torch215"))
    assert set(prod.not_covered) == {"3.15"} and "numpy<2.4" in prod.not_covered["3.15"]
    for env, pythons in (("cu124-torch27", "3.9 3.10 3.11 3.12 3.13"), ("cu130-torch211", "3.10 3.11 3.12 3.13 3.14")):
        cov = production.coverage(load_env(REPO, env), _read(load_env(REPO, env)))
        assert cov.covered == tuple(pythons.split()) and cov.not_covered == ()


def test_networkx_is_the_version_each_python_allows():
    """A bug once shipped: cu124-torch27 pinned networkx 3.7 (Python >= 3.12) for everyone."""
    pins = production.parse_merged(_read(load_env(REPO, "cu124-torch27")).merged)[0]
    got = {py: production.pins_for(pins, py)[0]["networkx"].version for py in ("3.9", "3.10", "3.11", "3.12", "3.13")}
    assert got == {"3.9": "3.2.1", "3.10": "3.4.2", "3.11": "3.6.1", "3.12": "3.7", "3.13": "3.7"}


@pytest.mark.parametrize("spec", PYPI, ids=[str(s.id) for s in PYPI])
def test_other_pythons_prefer_the_image_versions(spec):
    """Another Python's set differs from the image's only where that Python needs another version:
    every pin it shares by name with the image's set but not by version has no image version for it
    (seen as: the same pin is used by every Python where it could be)."""
    prod = _read(spec)
    image = {p.name: p.version for p in lock.parse(prod.sets[spec.python])[0]}
    newer = [py for py in prod.sets if production.vkey(py) > production.vkey(spec.python)]
    for py in newer:  # a newer Python can always take the image's pins of pure-Python and abi3/cpXY wheels
        other = {p.name: p.version for p in lock.parse(prod.sets[py])[0]}
        assert {n: v for n, v in other.items() if n in image and image[n] != v} == {}, py


def test_merge_marks_only_what_differs():
    spec = load_env(REPO, "cu124-torch27")
    h = "sha256:" + "a" * 64
    sets = {
        "3.10": f"a==1 \\\n    --hash={h}\nb==1 \\\n    --hash={h}\n",
        "3.11": f"a==1 \\\n    --hash={h}\nb==2 \\\n    --hash={h}\n",
        "3.12": f"a==1 \\\n    --hash={h}\nb==2 \\\n    --hash={h}\nc==1 \\\n    --hash={h}\n",
    }
    text = production.merge(spec, sets, {"3.9": "test"})
    assert f"a==1 \\\n    --hash={h}\n" in text  # the same on every Python: no marker
    assert 'b==1 ; python_version == "3.10" \\' in text
    assert 'b==2 ; python_version == "3.11" or python_version == "3.12" \\' in text
    assert 'c==1 ; python_version == "3.12" \\' in text
    assert "# python 3.9: not covered: test\n" in text
    pins = production.parse_merged(text)[0]
    assert {n: p.version for n, p in production.pins_for(pins, "3.10")[0].items()} == {"a": "1", "b": "1"}
    assert production.pins_for(pins, "3.13")[0].keys() == {"a"}  # an uncovered Python still gets the shared pins
    assert production.merge(spec, sets, {"3.9": "test"}) == text  # deterministic


def _tamper(spec, **changes):
    prod = _read(spec)
    return production.check(spec, dataclasses.replace(prod, **changes))


def test_checker_catches_an_edited_merged_file():
    spec = load_env(REPO, "cu124-torch27")
    merged = _read(spec).merged
    problems = _tamper(spec, merged=merged.replace('networkx==3.2.1 ; python_version == "3.9"', "networkx==3.2.1"))
    assert any("is not the merge of" in p for p in problems)
    assert any("is missing" in p for p in _tamper(spec, merged=None))


def test_checker_catches_a_missing_python_and_one_torch_does_not_support():
    spec = load_env(REPO, "cu124-torch27")
    sets = _read(spec).sets
    less = {py: t for py, t in sets.items() if py != "3.10"}
    assert any("Python 3.10: torch 2.7 supports it" in p for p in _tamper(spec, sets=less))
    more = {**sets, "3.14": sets["3.13"]}
    assert any("py3.14.txt: torch 2.7 has no wheels for Python 3.14" in p for p in _tamper(spec, sets=more))
    no_image = {py: t for py, t in sets.items() if py != "3.13"}
    assert any("no lockfile for the image's Python 3.13" in p for p in _tamper(spec, sets=no_image))


def test_checker_catches_drift_in_another_pythons_file():
    spec = load_env(REPO, "cu130-torch211")
    sets = _read(spec).sets
    bad = {**sets, "3.12": sets["3.12"].replace("torch==2.11.0", "torch==2.11.1")}
    assert any("py3.12 lock: torch==2.11.1 but the spec says 2.11.0" in p for p in _tamper(spec, sets=bad))
    stale = production.check(dataclasses.replace(spec, torch="2.11.1"), _read(spec))
    assert any("py3.12 lock is stale" in p for p in stale)
    nohash = {**sets, "3.13": sets["3.13"].replace("pytest==9.2.0 \\\n", "pytest==9.2.0\n    # ", 1)}
    assert any("py3.13 lock" in p for p in _tamper(spec, sets=nohash))


def test_only_the_images_own_set_is_an_input_of_the_image(kit_repo):
    before = load_plan(kit_repo, "cu124-torch27").input_hash
    for rel in (
        "lockfiles/cu124-torch27/py3.12.txt",
        "lockfiles/cu124-torch27/py3.9.txt",
        "lockfiles/cu124-torch27.txt",
    ):
        p = kit_repo / rel
        p.write_text(p.read_text() + "# edited\n")
    assert load_plan(kit_repo, "cu124-torch27").input_hash == before
    own = kit_repo / "lockfiles/cu124-torch27/py3.13.txt"
    own.write_text(own.read_text() + "# edited\n")
    assert load_plan(kit_repo, "cu124-torch27").input_hash != before


def test_install_commands_name_the_exact_file_or_say_why_not():
    spec = load_env(REPO, "cu130-torch215")
    cov = production.coverage(spec, _read(spec))
    assert production.install_commands(cov, "3.12") == (
        "pip install --require-hashes -r lockfiles/cu130-torch215/py3.12.txt",
        "uv pip install --require-hashes -r lockfiles/cu130-torch215/py3.12.txt",
    )
    with pytest.raises(PythonNotCovered, match=r"do not cover Python 3\.15: no version of numpy<2\.4") as e:
        production.install_commands(cov, "3.15")
    assert e.value.exit_code == 26 and "3.11, 3.12, 3.13, 3.14" in str(e.value)
    with pytest.raises(PythonNotCovered, match=r"torch 2\.15\.0 has no wheels for Python 3\.10"):
        production.install_commands(cov, "3.10")
    ngc = load_env(REPO, "cu131-torch210-ngc")
    with pytest.raises(PythonNotCovered, match="torch comes from the base image"):
        production.install_commands(production.coverage(ngc, _read(ngc)), "3.12")


def test_requirements_command(cli):
    # The committed set pins torch, not the kernel wheel: with nothing published there is no command to give.
    r = cli("--repo", str(REPO), "requirements", "cu124-torch27", "--python", "3.9")
    assert r.code == 35 and r.out == "", r.err
    assert "lockfiles/cu124-torch27/py3.9.txt" in r.err and "not the kernel wheel" in r.err
    r = cli("--repo", str(REPO), "requirements", "cu124-torch27", "--python", "3.14")
    assert r.code == 26 and "do not cover Python 3.14: torch 2.7.1 has no wheels" in r.err and r.out == ""
    assert cli("--repo", str(REPO), "requirements", "cu124-torch27", "--python", "three").code == 2


def test_requirements_command_refuses_inconsistent_files(kit_repo, cli):
    p = kit_repo / "lockfiles" / "cu124-torch27.txt"
    p.write_text(p.read_text().replace("torch==2.7.1", "torch==2.7.0"))
    r = cli("--repo", str(kit_repo), "requirements", "cu124-torch27", "--python", "3.12")
    assert r.code == 5 and "is not the merge of" in r.err and r.out == ""
    assert cli("--repo", str(kit_repo), "validate").code == 5
    assert cli("--repo", str(kit_repo), "lock", "cu124-torch27", "--check").code == 5


def test_matrix_lists_the_pythons_each_env_covers(cli):
    r = cli("--repo", str(REPO), "matrix", "--json")
    assert r.code == 0, r.err
    rows = {row["env"]: row for row in json.loads(r.out)}
    assert rows["cu124-torch27"]["requirements"]["covered"] == ["3.9", "3.10", "3.11", "3.12", "3.13"]
    assert rows["cu124-torch27"]["pythons"] == "3.9-3.13"
    assert rows["cu130-torch215"]["pythons"] == "3.11-3.14; not 3.15"
    assert "numpy<2.4" in rows["cu130-torch215"]["requirements"]["not_covered"]["3.15"]
    assert rows["rocm64-torch27"]["pythons"] == "image only"
    assert rows["cu130-torch211"]["requirements"]["per_python"]["3.12"] == "lockfiles/cu130-torch211/py3.12.txt"
    text = cli("--repo", str(REPO), "matrix", "--wide").out
    assert "Python 3.15 not covered" in text and "lockfiles/cu124-torch27.txt covers Python 3.9, 3.10" in text


def test_wheelhouse_serves_the_pythons_the_wheel_tag_allows():
    from flashkit.publish.wheelhouse import served

    pys = ["3.9", "3.10", "3.11", "3.12", "3.13"]
    ok, out = served("flash_kernels-0.1.0+cu130torch2.11cxx11abitrue-cp310-abi3-linux_x86_64.whl", pys)
    assert ok == pys[1:] and out == {"3.9": "the verified wheel is cp310-abi3"}
    assert served("flash_kernels-0.1.0-cp39-abi3-linux_x86_64.whl", pys)[0] == pys
    assert served("flash_kernels-0.1.0-py3-none-any.whl", pys)[0] == pys
    assert served("x-1-cp312-cp312-manylinux_2_28_x86_64.whl", pys)[0] == ["3.12"]
