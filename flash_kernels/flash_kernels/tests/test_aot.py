"""flash_kernels.aot: the enumeration, its usage errors, a real compile for an AMD and an NVIDIA
target this host does not have, and a reproducible report.

The CPU tier runs with TRITON_INTERPRET=1, under which @triton.jit builds interpreter functions
that cannot be compiled: compiling happens in a child process without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flash_kernels import aot, targets, triton_tiles

COMPILE_TARGETS = ("hip:gfx942", "cuda:80")


def _child_env() -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return env


def _python(code: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=_child_env(), capture_output=True, text=True,
                          timeout=timeout)


def _aot_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flash_kernels.aot", *args], env=_child_env(),
                          capture_output=True, text=True, timeout=600)


def _skip_if_unavailable(proc: subprocess.CompletedProcess) -> None:
    """Skips only for what the tool refuses by design: a triton without the backend, before 3.4 one
    without an ld.lld for HIP, or a triton version outside the range the tool drives."""
    refused = ("backend", "ld.lld", "is not supported by flash_kernels.aot")
    if proc.returncode == 2 and any(reason in proc.stderr for reason in refused):
        pytest.skip(proc.stderr.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- usage errors
def test_unknown_target_is_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert aot.main(["--target", "cuda:75", "--out", str(tmp_path / "r.json")]) == 2
    assert "unknown target 'cuda:75'" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_interpreter_is_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert aot.main(["--target", "hip:gfx942", "--out", str(tmp_path / "r.json")]) == 2
    assert "TRITON_INTERPRET" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["3.2.0", "2.3.1", "3.10.0", "4.0.0"])
def test_untried_triton_versions_are_refused(version):
    with pytest.raises(aot.UsageError, match=f"triton {version} is not supported"):
        aot.check_triton(version)


@pytest.mark.parametrize("version", ["3.3.1", "3.6.0", "3.9.0", "3.9.1+git1234"])
def test_tried_triton_versions_pass(version):
    aot.check_triton(version)


# ----------------------------------------------------------------------------- enumeration
@pytest.mark.parametrize("name", ["cuda:80", "cuda:90", "hip:gfx90a", "hip:gfx942"])
def test_enumeration_covers_kernels_roles_dtypes_and_head_dims(name):
    target = targets.parse(name)
    specs = aot.enumerate_specs(target)
    assert [s.key for s in specs] == sorted({s.key for s in specs})  # unique, stable order
    assert {s.kernel for s in specs} == set(aot.KERNELS)
    assert {s.role for s in specs} == {"forward", "backward", "decode"}
    assert {s.dtype for s in specs} == set(aot.DTYPES)
    head_dims = {s.head_dim for s in specs}
    assert set(aot.CLASSES) <= head_dims and {72, 96, 160, 192} <= head_dims
    decode = [dict(s.constexprs) for s in specs if s.kernel == "_attn_fwd" and s.role == "decode"]
    assert any(c["PACK_GQA"] and c["NUM_SPLITS"] > 1 and c["PAGE_SIZE"] == 0 for c in decode)
    assert any(c["PAGE_SIZE"] > 0 and c["HAS_LEFTPAD"] and c["SOFTCAP"] and c["ALIBI"] for c in decode)
    assert all(c["HAS_SEQLENS_K"] for c in decode)
    # Every tuner candidate and default the launchers could pick is compiled (bf16 at every class).
    keys = {s.key for s in specs if not s.pruned}
    for hdp in aot.CLASSES:
        for cfg in (*triton_tiles.fwd_candidates(hdp, "bfloat16", target),
                    triton_tiles.fwd_config(hdp, "bfloat16", target)):
            assert aot.fwd_spec("bfloat16", hdp, aot.Features(), cfg, target, "x").key in keys
        for cfg in (*triton_tiles.bwd_candidates(hdp, "bfloat16", target),
                    triton_tiles.bwd_config(hdp, "bfloat16", target)):
            assert {s.key for s in aot.bwd_specs("bfloat16", hdp, aot.Features(), cfg, target, "x")} <= keys
    dot = {dict(s.constexprs).get("DOT_PRECISION") for s in specs} - {None}
    assert dot == ({"ieee"} if target.is_hip else {"ieee", "tf32"})


def test_pruned_specialisations_carry_their_reason():
    """A target with too little shared memory for some candidates: they are reported pruned,
    with the reason, and never compiled."""
    small = targets.Target("hip", "gfx942", 64, 16 * 1024)
    specs = aot.enumerate_specs(small)
    pruned = [s for s in specs if s.pruned and s.pruned.startswith("shared memory")]
    assert pruned and all("16384" in s.pruned for s in pruned)
    entry = aot.entry(pruned[0], small, {})
    assert entry["status"] == "pruned" and entry["reason"] == pruned[0].pruned and "resources" not in entry
    # gfx942's real 64 KB: only the head-dim rules of the candidate lists prune anything.
    real = aot.enumerate_specs(targets.parse("hip:gfx942"))
    assert all(not s.pruned.startswith("shared memory") for s in real if s.pruned)


# ----------------------------------------------------------------------------- real compiles
COMPILE_ONE = """
import json, sys
from flash_kernels import aot, targets, triton_tiles
t = targets.parse(sys.argv[1])
try:
    aot.check_triton(aot.triton_version())
    aot.check_backends([t])
except aot.UsageError as e:
    print(json.dumps({"skip": str(e)}))
    raise SystemExit(0)
fwd = aot.fwd_spec("bfloat16", 64, aot.Features(right=True), triton_tiles.fwd_config(64, "bfloat16", t), t, "test")
bwd = aot.bwd_specs("bfloat16", 64, aot.Features(), triton_tiles.bwd_config(64, "bfloat16", t), t, "test")[0]
print(json.dumps({s.kernel: aot.compile_spec(s, t) for s in (fwd, bwd)}))
"""


@pytest.mark.parametrize("name", COMPILE_TARGETS)
def test_compiles_forward_and_backward_with_resources(name):
    proc = _python(COMPILE_ONE.replace("sys.argv[1]", repr(name)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in results:
        pytest.skip(results["skip"])
    for kernel in ("_attn_fwd", "_bwd_dkdv"):
        r = results[kernel]
        assert r["status"] == "compiled", r.get("error")
        res = r["resources"]
        assert res["shared_bytes"] > 0
        if name.startswith("hip"):
            assert res["vgpr_count"] > 0 and res["sgpr_count"] > 0
            assert res["lds_bytes"] <= 65536
            for field in aot.HIP_FIELDS:
                assert isinstance(res[field], int)
        else:
            assert 0 < res["registers"] <= 255
            assert res["spill_store_bytes"] >= 0 and res["spill_load_bytes"] >= 0


def test_report_is_reproducible(tmp_path):
    """Same triton, same targets, same filter: the same bytes, whatever the number of jobs."""
    args = [a for t in COMPILE_TARGETS for a in ("--target", t)] + ["--only", "_bwd_delta/bf16/d64/"]
    first = _aot_cli(*args, "--out", str(tmp_path / "a.json"))
    _skip_if_unavailable(first)
    assert first.returncode == 0, first.stderr[-3000:]
    second = _aot_cli(*args, "--jobs", "2", "--out", str(tmp_path / "b.json"))
    assert second.returncode == 0, second.stderr[-3000:]
    a, b = (tmp_path / "a.json").read_bytes(), (tmp_path / "b.json").read_bytes()
    assert a == b
    report = json.loads(a)
    assert sorted(report["targets"]) == sorted(COMPILE_TARGETS)
    for name, summary in report["targets"].items():
        assert (summary["compiled"], summary["failed"], summary["pruned"]) == (2, 0, 0), name
    entries = report["specialisations"]
    assert [e["id"] for e in entries[:2]] == sorted(e["id"] for e in entries[:2])
    assert {e["kernel"] for e in entries} == {"_bwd_delta"} and "FLASH_KERNELS_AOT" in first.stdout
