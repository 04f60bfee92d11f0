"""Bad env specs: each gives its specific message, a non-zero exit and writes nothing.

Every case starts from a real env file of the repository, changes one thing, and runs the CLI
(`flashkit render <env> -o OUT` and `flashkit lock <env>`) against a throwaway copy of the repo.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Bad:
    name: str
    base: str  # env file the case starts from
    edits: tuple[tuple[str, str], ...]  # (old, new) replacements; old must occur in the file
    expect: tuple[str, ...]  # substrings of the error message
    code: int = 3  # 3: invalid spec, 4: rejected by a rule
    file_id: str | None = None  # write under another name (default: base)
    raw: str | None = None  # replace the whole file


T27 = "cu124-torch27"
T211 = "cu130-torch211"
T215 = "cu130-torch215"
ROCM = "rocm64-torch27"
NGC = "cu131-torch210-ngc"

CASES = [
    # --- syntax and shape
    Bad(
        "yaml-syntax",
        T27,
        (('gpu_targets: ["8.0", "9.0a"]', 'gpu_targets: ["8.0", "9.0"'),),
        ("envs/cu124-torch27.yaml:", "YAML syntax error"),
    ),
    Bad("empty-file", T27, (), ("the file is empty",), raw=""),
    Bad("top-level-list", T27, (), ("expected a mapping with keys",), raw="- python\n- torch\n"),
    Bad("duplicate-key", T27, (('python: "3.13"', 'python: "3.13"\npython: "3.12"'),), ("python: field given twice",)),
    # --- YAML the safe loader refuses: each is the file, the line, the field and what is allowed (not exit 1)
    Bad(
        "yaml-unknown-tag",
        T27,
        (('torch: "2.7.1"', "torch: !foo bar"),),
        ("envs/cu124-torch27.yaml:4: torch: the YAML tag '!foo' is not allowed", "allowed: plain values"),
    ),
    Bad(
        "yaml-python-object-tag",
        T27,
        (('torch: "2.7.1"', "torch: !!python/object/apply:os.system ['touch /tmp/flashkit-pwned']"),),
        ("envs/cu124-torch27.yaml:4: torch: the YAML tag '!!python/object/apply:os.system' is not allowed",),
    ),
    Bad(
        "yaml-deep-nesting",
        T27,
        (("notes: ", "notes: " + "[" * 20000 + "]" * 20000 + " #"),),
        ("envs/cu124-torch27.yaml:", "notes[0][0][0][0][0][0][0][0]: nested deeper than 8 levels"),
    ),
    Bad(
        "yaml-complex-key",
        T27,
        (('python: "3.13"', 'python: "3.13"\n? [a, b]\n: 1'),),
        ("envs/cu124-torch27.yaml:", "a key must be a plain field name, not a list or mapping"),
    ),
    Bad(
        "yaml-merge-key",
        T27,
        (("accelerator:\n", "accelerator:\n  <<: {kind: cuda}\n"),),
        ("accelerator: the YAML merge key '<<' is not allowed",),
    ),
    Bad(
        "yaml-impossible-date",
        T27,
        (("  suite: trixie", "  suite: 2026-13-01"),),
        ("base.suite: '2026-13-01' reads as a timestamp but is not a valid one", "quote it"),
    ),
    # --- missing and unknown fields
    Bad("missing-torch", T27, (('torch: "2.7.1"', ""),), ("torch: missing required field 'torch'",)),
    Bad("missing-nested", T27, (("  kind: cuda\n", ""),), ("accelerator.kind: missing required field 'kind'",)),
    Bad(
        "unknown-field-typo",
        T27,
        (('python: "3.13"', 'pyhton: "3.13"'),),
        ("unknown field 'pyhton'", "Did you mean 'python'?"),
    ),
    Bad(
        "unknown-nested-field",
        T27,
        (("  suite: trixie", "  suit: trixie"),),
        ("unknown field 'suit'", "Did you mean 'suite'?"),
    ),
    # --- typos in choices get the closest valid value
    Bad(
        "accelerator-typo",
        T27,
        (("kind: cuda", "kind: cdua"),),
        ("accelerator.kind: 'cdua' is not allowed; allowed: cuda, rocm.", "Did you mean 'cuda'?"),
    ),
    Bad(
        "compiler-typo",
        T27,
        (("source: debian", "source: debain"),),
        ("compiler.source: 'debain' is not allowed", "Did you mean 'debian'?"),
    ),
    Bad(
        "flavor-typo",
        NGC,
        (("flavor: ngc", "flavor: ncg"),),
        ("base.flavor: 'ncg' is not allowed; allowed: ngc, cuda, rocm, debian.", "Did you mean 'ngc'?"),
    ),
    Bad(
        "backend-typo",
        T27,
        (("backends: [cuda, triton]", "backends: [cuda, trition]"),),
        ("backends[1]: 'trition' is not allowed", "Did you mean 'triton'?"),
    ),
    Bad(
        "gpu-target-typo",
        T27,
        (('gpu_targets: ["8.0", "9.0a"]', 'gpu_targets: ["8.0", "9.O"]'),),
        ("gpu_targets[1]: '9.O' is not a known CUDA compute capability", "Did you mean '9.0'?"),
    ),
    Bad(
        "suite-typo",
        T27,
        (("suite: trixie", "suite: trixy"),),
        ("base.suite: 'trixy' is not allowed; allowed: bookworm, trixie.", "Did you mean 'trixie'?"),
    ),
    # --- wrong types and formats
    Bad(
        "python-unquoted-float",
        T27,
        (('python: "3.13"', "python: 3.10"),),
        ("python: 3.1 was read as a number; quote it",),
    ),
    Bad(
        "torch-range",
        T27,
        (('torch: "2.7.1"', 'torch: ">=2.7"'),),
        ("torch: '>=2.7' is not valid: expected an exact torch version",),
    ),
    Bad(
        "abi-not-bool",
        T27,
        (("cxx11_abi: true", 'cxx11_abi: "yes"'),),
        ("cxx11_abi: 'yes' is not valid: expected true or false",),
    ),
    Bad(
        "exclude-newer-unquoted-date",
        T27,
        (('exclude_newer: "2026-11-30T00:00:00Z"', "exclude_newer: 2026-11-30"),),
        ("lock.exclude_newer", "quote it as an RFC 3339 UTC instant"),
    ),
    Bad(
        "compiler-version-for-base-image",
        NGC,
        (("  version: null", '  version: "13.1.0"'),),
        ("compiler.version: must be null when the compiler comes from the base image",),
    ),
    # --- unsafe values
    Bad(
        "tag-shell-metachar",
        T27,
        (('publish_tags: ["torch2.7-cu12.4-py3.13"]', 'publish_tags: ["torch2.7;rm -rf /"]'),),
        ("publish_tags[0]: 'torch2.7;rm -rf /' is not a valid image tag: it contains ' ', '/', ';'",),
    ),
    Bad(
        "tag-command-substitution",
        T27,
        (('publish_tags: ["torch2.7-cu12.4-py3.13"]', 'publish_tags: ["$(whoami)"]'),),
        ("is not a valid image tag: it contains '$', '(', ')'",),
    ),
    Bad(
        "tag-leading-dash",
        T27,
        (('publish_tags: ["torch2.7-cu12.4-py3.13"]', 'publish_tags: ["-latest"]'),),
        ("must not start with '.' or '-'",),
    ),
    Bad(
        "kernel-path-escapes",
        T27,
        (("schema: 1", "schema: 1\nkernel_source: ../outside"),),
        ("kernel_source: '../outside' escapes the repository",),
    ),
    Bad(
        "kernel-path-absolute",
        T27,
        (("schema: 1", "schema: 1\nkernel_source: /etc"),),
        ("kernel_source: '/etc' escapes the repository",),
    ),
    Bad(
        "digest-not-a-digest",
        NGC,
        (
            (
                'digest: "sha256:1dc787f5c6264fcc1c99809f99b84823e73ed4588d5a581b94290fc2a8fecff8"',
                'digest: "sha256:abc"',
            ),
        ),
        ("base.digest: 'sha256:abc' is not a digest",),
    ),
    Bad(
        "unpinned-without-reason",
        ROCM,
        (("  digest_note: >-\n", "  x_note: >-\n"),),
        ("base.digest_note: required when digest is null",),
    ),
    Bad(
        "ref-with-digest",
        NGC,
        (("ref: nvcr.io/nvidia/pytorch:25.12-py3", "ref: nvcr.io/nvidia/pytorch@sha256:" + "a" * 64),),
        ("base.ref", "put the digest in the digest field"),
    ),
    Bad(
        "ref-shell-metachar",
        NGC,
        (("ref: nvcr.io/nvidia/pytorch:25.12-py3", "ref: 'nvcr.io/nvidia/pytorch:25.12;ls'"),),
        ("base.ref", "tag '25.12;ls' may hold only letters, digits"),
    ),
    # --- file name and id
    Bad(
        "id-mismatch",
        T27,
        (('torch: "2.7.1"', 'torch: "2.8.0"'),),
        ("torch: '2.8.0' does not match the env id 'cu124-torch27'",),
    ),
    Bad("bad-file-name", T27, (), ("invalid env id 'cuda124-torch27'", "Rename the file"), file_id="cuda124-torch27"),
    # --- impossible combinations: rejected by a rule (exit 4)
    Bad(
        "abi-mismatch",
        T27,
        (("cxx11_abi: true", "cxx11_abi: false"),),
        (
            "rejected by rule pypi-torch-abi",
            "PyPI torch 2.7.1 uses the cxx11 ABI but the spec says cxx11_abi: false",
            "Fix: set cxx11_abi",
        ),
        code=4,
    ),
    Bad(
        "python-not-supported",
        T215,
        (('python: "3.11"', 'python: "3.10"'),),
        (
            "rejected by rule python-supported-by-torch",
            "torch 2.15 has wheels for Python 3.11, 3.12, 3.13, 3.14, 3.15, not 3.10",
        ),
        code=4,
    ),
    Bad(
        "cuda13-old-torch",
        T211,
        (('torch: "2.11.0"', 'torch: "2.8.0"'),),
        ("rejected by rule cuda13-needs-torch29", "rejected by rule torch-cuda-major"),
        code=4,
        file_id="cu130-torch28",
    ),
    Bad(
        "sm100-on-cuda124",
        T27,
        (('gpu_targets: ["8.0", "9.0a"]', 'gpu_targets: ["8.0", "10.0"]'),),
        ("rejected by rule sm-arch-min-cuda", "sm_100 needs CUDA >= 12.8"),
        code=4,
    ),
    Bad(
        "pypi-nvcc-cuda12",
        T27,
        (("source: debian", "source: pypi"), ('version: "12.4.131~12.4.1-2"', 'version: "12.4.131"')),
        ("rejected by rule compiler-source-exists", "PyPI has no nvcc driver for CUDA 12"),
        code=4,
    ),
    Bad(
        "bookworm-has-no-cuda124",
        T27,
        (("suite: trixie", "suite: bookworm"),),
        (
            "Debian bookworm's nvidia-cuda-toolkit is CUDA 11.8, not 12.4",
            "Debian bookworm provides Python 3.11, not 3.13",
        ),
        code=4,
    ),
    Bad(
        "rocm-with-cuda-backend",
        ROCM,
        (("backends: [triton]", "backends: [cuda, triton]"),),
        ("rejected by rule backends-fit-accelerator",),
        code=4,
    ),
    Bad(
        "rocm-tag-disagrees",
        ROCM,
        (('python: "3.12"', 'python: "3.13"'),),
        ("rejected by rule rocm-combination", "tag has Python 3.12, spec 3.13"),
        code=4,
    ),
    Bad(
        "ngc-unknown-release",
        NGC,
        (("pytorch:25.12-py3", "pytorch:24.01-py3"),),
        ("rejected by rule base-provides-python-and-cuda", "no release-notes data for NGC tag '24.01-py3'"),
        code=4,
    ),
]


def _write_case(repo, case: Bad) -> str:
    text = (repo / "envs" / f"{case.base}.yaml").read_text()
    for old, new in case.edits:
        assert old in text, f"{case.name}: {old!r} not in {case.base}.yaml"
        text = text.replace(old, new, 1)
    if case.raw is not None:
        text = case.raw
    env_id = case.file_id or case.base
    if case.file_id:
        (repo / "envs" / f"{case.base}.yaml").unlink()
    (repo / "envs" / f"{env_id}.yaml").write_text(text)
    return env_id


def test_at_least_twenty_cases():
    assert len(CASES) >= 20
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_render_refuses_bad_spec(case: Bad, kit_repo, cli, tree_snapshot):
    env_id = _write_case(kit_repo, case)
    before = tree_snapshot(kit_repo)
    out = kit_repo / "out" / "Dockerfile"
    res = cli("--repo", str(kit_repo), "--host-mem-gib", "24", "render", env_id, "-o", str(out))
    assert res.code == case.code, res.err
    for text in case.expect:
        assert text in res.err, f"expected {text!r} in:\n{res.err}"
    assert "Traceback" not in res.err
    assert not out.exists()
    assert tree_snapshot(kit_repo) == before


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lock_refuses_bad_spec_without_touching_lockfiles(case: Bad, kit_repo, cli, monkeypatch, tree_snapshot):
    env_id = _write_case(kit_repo, case)
    before = tree_snapshot(kit_repo)
    # Validation and rules run before uv: if they did not, this would fail loudly.
    from flashkit.locking import env_lock

    monkeypatch.setattr(env_lock, "resolve", lambda spec: pytest.fail("uv reached for a bad spec"))
    res = cli("--repo", str(kit_repo), "lock", env_id)
    assert res.code == case.code, res.err
    assert case.expect[0] in res.err
    assert tree_snapshot(kit_repo) == before


def test_errors_are_located_by_line(kit_repo, cli):
    case = next(c for c in CASES if c.name == "accelerator-typo")
    env_id = _write_case(kit_repo, case)
    res = cli("--repo", str(kit_repo), "render", env_id)
    line = next(
        i for i, t in enumerate((kit_repo / "envs" / f"{env_id}.yaml").read_text().splitlines(), 1) if "cdua" in t
    )
    assert f"envs/{env_id}.yaml:{line}: accelerator.kind" in res.err


def test_all_problems_of_a_file_are_reported_together(kit_repo, cli):
    text = (kit_repo / "envs" / "cu124-torch27.yaml").read_text()
    text = text.replace("kind: cuda", "kind: cdua").replace("source: debian", "source: debain")
    (kit_repo / "envs" / "cu124-torch27.yaml").write_text(text)
    res = cli("--repo", str(kit_repo), "render", "cu124-torch27")
    assert res.code == 3
    assert "accelerator.kind" in res.err and "compiler.source" in res.err


def test_unknown_env_suggests_the_closest(kit_repo, cli):
    res = cli("--repo", str(kit_repo), "render", "cu124-torch277")
    assert res.code == 3
    assert "unknown env 'cu124-torch277'" in res.err and "Did you mean 'cu124-torch27'?" in res.err


def test_validate_reports_a_bad_spec_among_good_ones(kit_repo, cli):
    _write_case(kit_repo, next(c for c in CASES if c.name == "unknown-field-typo"))
    res = cli("--repo", str(kit_repo), "validate")
    assert res.code == 3
    assert "unknown field 'pyhton'" in res.err


# --- commands that read every env: each broken spec is named, the others are still read, and the exit is 3
BROKEN = "cu124-torch26"


@pytest.fixture
def one_broken(kit_repo):
    spec = kit_repo / "envs" / f"{BROKEN}.yaml"
    spec.write_text(spec.read_text().replace('torch: "2.6.0"', "torch: !!python/object/apply:os.system [x]"))
    return kit_repo


NAMED = f"envs/{BROKEN}.yaml:4: torch: the YAML tag '!!python/object/apply:os.system' is not allowed"


def test_matrix_shows_a_broken_spec_as_a_row_and_the_others(one_broken, cli):
    res = cli("--repo", str(one_broken), "matrix")
    assert res.code == 3, res.err
    rows = {line.split()[0]: line for line in res.out.splitlines() if line.startswith(("cu", "rocm"))}
    assert "??????" in rows[BROKEN] and "cu130-torch211" in rows and "rocm64-torch27" in rows
    assert NAMED in res.err and "Traceback" not in res.err
    data = json.loads(cli("--repo", str(one_broken), "matrix", "--json").out)
    broken = next(r for r in data if r["env"] == BROKEN)
    assert broken["verdict"] == "invalid" and NAMED in broken["error"]
    assert sum(r["verdict"] != "invalid" for r in data) == len(data) - 1
    assert cli("--repo", str(one_broken), "matrix", "--wide").code == 3


def test_resolve_answers_from_the_other_envs_and_exits_3(one_broken, cli):
    res = cli("--repo", str(one_broken), "resolve", "--torch", "2.12.0", "--cuda", "13.0", "--python", "3.12")
    assert res.code == 3, res.err
    assert NAMED in res.err and "flashkit resolve: torch 2.12.0" in res.err
    res = cli("--repo", str(one_broken), "resolve", "--torch", "2.6.0", "--cuda", "12.4", "--json")
    assert res.code == 3 and NAMED in json.loads(res.out)["broken_specs"][BROKEN]


def test_wheelhouse_all_lists_a_broken_spec_as_skipped_and_exits_3(one_broken, cli, tmp_path):
    out = tmp_path / "wh"
    res = cli("--repo", str(one_broken), "wheelhouse", "--all", "--out", str(out))
    assert res.code == 3, res.err
    manifest = json.loads((out / "wheelhouse.json").read_text())
    assert "spec invalid" in json.dumps(manifest) and "cu130-torch211" in json.dumps(manifest)
    assert NAMED in res.err


def test_ci_workflow_names_a_broken_spec_and_exits_3(one_broken, cli, tmp_path):
    out = tmp_path / "ci.yml"
    res = cli("--repo", str(one_broken), "ci-workflow", "-o", str(out))
    assert res.code == 3 and NAMED in res.err
    assert out.is_file()  # the workflow does not depend on the specs' contents
    assert cli("--repo", str(one_broken), "ci-workflow", "cu130-torch211", "-o", str(out)).code == 0
    assert cli("--repo", str(one_broken), "ci-workflow", BROKEN, "-o", str(out)).code == 3


def test_nox_names_a_broken_spec_lists_the_other_envs_and_exits_3(one_broken):
    pytest.importorskip("nox")
    shutil.copy(REPO / "noxfile.py", one_broken / "noxfile.py")

    def nox(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "nox", "-f", "noxfile.py", *args]
        return subprocess.run(argv, capture_output=True, text=True, cwd=one_broken, timeout=120)

    listed = nox("-l")
    assert listed.returncode == 3, listed.stderr  # a listing that left a spec out does not look clean
    assert NAMED in listed.stderr
    assert "test-cu130-torch211 -> " in listed.stdout and f"build-{BROKEN} " not in listed.stdout
    assert f"test-{BROKEN} -> envs/{BROKEN}.yaml does not validate" in listed.stdout
    ran = nox("-s", f"test-{BROKEN}")  # the command a user types says what is wrong, not "session not found"
    assert ran.returncode == 1 and NAMED in ran.stderr and "does not validate" in ran.stderr


def test_doctor_reads_the_other_envs_and_keeps_the_broken_one_apart(one_broken):
    from flashkit.doctor import repo

    facts = repo.load(one_broken)
    assert facts.problem is None and NAMED in facts.broken[BROKEN]
    assert BROKEN not in {str(s.id) for s in facts.specs} and len(facts.specs) > 10
