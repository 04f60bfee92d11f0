"""The triton-aot tier's kit side: which triton it compiles with, which targets, how a report becomes a
verdict, and how that verdict is kept (content-addressed report, judged at the input hash, shown by matrix).

The compile itself runs in tests/integration/test_triton_aot_compile.py (it installs triton from PyPI)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time

import pytest
from kitsupport import REPO, input_hash, triton_site

from flashkit.core.errors import LockError, RecordError, TierError
from flashkit.core.names import Tier, Verdict
from flashkit.ledger import gate, record, store
from flashkit.plan import triton_pin
from flashkit.plan.plan import load_plan
from flashkit.plan.specfile import load_env
from flashkit.verify import triton_aot
from flashkit.verify.tiers import TierOutcome

ROCM = "rocm64-torch27"
CUDA = "cu130-torch211"


def _pin(root, env):
    plan = load_plan(root, env)
    aot = root / "lockfiles" / env / triton_pin.AOT_LOCK
    return triton_pin.pin_for(plan.spec, plan.locks.runtime, aot.read_text() if aot.is_file() else None)


def test_a_pypi_torch_env_compiles_with_the_triton_of_its_own_runtime_lock():
    pin = _pin(REPO, CUDA)
    assert pin.version == "3.6.0"
    assert pin.source == "lockfiles/cu130-torch211/py3.11.txt"
    lines = [x for x in pin.requirements.splitlines() if not x.strip().startswith("--hash")]
    assert lines == ["triton==3.6.0 \\"]  # nothing but the compiler: not torch, not the CUDA wheels
    assert pin.requirements.count("--hash=sha256:") >= 10  # every wheel of the release, each by hash


def test_the_rocm_env_compiles_with_the_triton_release_its_torch_pins():
    pin = _pin(REPO, ROCM)
    assert pin.version == "3.3.1"
    assert "pytorch-triton-rocm 3.3.1" in pin.source
    assert "triton==3.3.1" in pin.requirements and "--hash=sha256:" in pin.requirements


def test_a_missing_or_foreign_aot_lock_says_what_to_run(kit_repo):
    path = kit_repo / "lockfiles" / ROCM / triton_pin.AOT_LOCK
    text = path.read_text()
    path.unlink()
    with pytest.raises(LockError) as e:
        _pin(kit_repo, ROCM)
    assert "triton-aot.txt is missing" in str(e.value) and "flashkit aot rocm64-torch27 --lock" in e.value.hint
    path.write_text(text.replace("triton==3.3.1", "triton==3.4.0"))
    with pytest.raises(LockError) as e:
        _pin(kit_repo, ROCM)
    assert "was not resolved from triton==3.3.1" in str(e.value)


def test_a_base_image_env_whose_triton_is_unknown_is_refused_with_the_table_to_extend():
    spec = load_env(REPO, "cu131-torch210-ngc")
    with pytest.raises(LockError) as e:
        triton_pin.pin_for(spec, "", None)
    assert "knows no triton release" in str(e.value) and "BASE_IMAGE_TRITON" in e.value.hint


def test_targets_are_the_envs_own_in_the_compilers_spelling():
    assert triton_aot.targets_for(load_env(REPO, ROCM)) == ("hip:gfx90a", "hip:gfx942")
    # sm_90 runs for real on the GPU host (artifact-gpu); the compile-only tier covers what no host here has
    assert triton_aot.targets_for(load_env(REPO, CUDA)) == ("cuda:80",)
    assert triton_aot.targets_for(load_env(REPO, "cu128-torch28")) == ("cuda:80", "cuda:100", "cuda:120")


def _report(**per_target) -> dict:
    """A report in flash_kernels.aot's format (its own tests pin the format from the producing side)."""
    specs = []
    for target, (compiled, failed) in per_target.items():
        specs += [
            {
                "target": target,
                "id": f"_attn_fwd fp16 d64 #{i}",
                "kernel": "_attn_fwd",
                "status": "compiled",
                "resources": {"vgpr_count": 128, "lds_bytes": 32768, "vgpr_spill_count": 0},
            }
            for i in range(compiled)
        ]
        specs += [
            {
                "target": target,
                "id": "_bwd_dq fp32 d256",
                "kernel": "_bwd_dq",
                "status": "failed",
                "error": "out of LDS",
            }
            for _ in range(failed)
        ]
        specs.append({"target": target, "id": "_attn_fwd bf16 d256 bm128", "status": "pruned", "reason": "64 KB LDS"})
    summary = {
        t: {"compiled": c, "failed": f, "pruned": 1, "max_vgprs": 128, "max_shared_bytes": 32768}
        for t, (c, f) in per_target.items()
    }
    return {"report_version": 1, "triton": "3.3.1", "specialisations": specs, "targets": summary}  # fmt: skip


PIN = triton_pin.TritonPin("3.3.1", "triton==3.3.1\n", "lockfiles/x/triton-aot.txt")
AMD = ("hip:gfx90a", "hip:gfx942")


def test_every_target_compiled_is_a_pass_that_says_it_never_ran_on_the_gpu():
    o = triton_aot.outcome_of(_report(**{t: (3, 0) for t in AMD}), 0, PIN, AMD, 0.0)
    assert o.verdict is Verdict.PASSED
    assert o.counts == {"checked": 6, "failed": 0, "pruned": 2}
    assert o.reasons[0] == (
        "Triton-AMD kernels compile for gfx90a and gfx942 with triton 3.3.1; never run on an AMD GPU"
    )
    assert any(r.startswith("hip:gfx942: 3 compiled, 0 failed, 1 pruned, max VGPRs 128, max LDS bytes 32768")
               for r in o.reasons)  # fmt: skip


def test_a_failed_specialisation_a_missing_target_or_a_bad_exit_is_no_pass():
    failed = triton_aot.outcome_of(_report(**{"hip:gfx90a": (3, 1), "hip:gfx942": (3, 0)}), 1, PIN, AMD, 0.0)
    assert failed.verdict is Verdict.FAILED
    assert any(r.startswith("failed hip:gfx90a _bwd_dq fp32 d256: out of LDS") for r in failed.reasons)
    missing = triton_aot.outcome_of(_report(**{"hip:gfx942": (3, 0)}), 0, PIN, AMD, 0.0)
    assert missing.verdict is Verdict.FAILED
    assert "hip:gfx90a: the report has no result for this target" in missing.reasons
    lying = triton_aot.outcome_of(_report(**{t: (3, 0) for t in AMD}), 1, PIN, AMD, 0.0)
    assert lying.verdict is Verdict.FAILED  # the exit status must agree with the counts


def test_a_kept_part_is_named_by_what_decides_its_result_and_nothing_else():
    wheel = {"triton_wheel_sha256": "a" * 64}
    key = triton_aot.part_key("s" * 64, PIN, wheel, "hip:gfx90a", None)
    here = {"triton_installed": "/usr/bin/python3", "triton_record_sha256": "a" * 64}
    there = {"triton_installed": "/opt/py/bin/python3", "triton_record_sha256": "a" * 64}
    # the interpreter's path does not decide the result; the installed bits' digest does
    assert triton_aot.part_key("s" * 64, PIN, here, "hip:gfx90a", None) == triton_aot.part_key(
        "s" * 64, PIN, there, "hip:gfx90a", None
    )
    others = [
        triton_aot.part_key("t" * 64, PIN, wheel, "hip:gfx90a", None),
        triton_aot.part_key("s" * 64, triton_pin.TritonPin("3.6.0", "", ""), wheel, "hip:gfx90a", None),
        triton_aot.part_key("s" * 64, PIN, {"triton_wheel_sha256": "b" * 64}, "hip:gfx90a", None),
        triton_aot.part_key("s" * 64, PIN, wheel, "hip:gfx942", None),
        triton_aot.part_key("s" * 64, PIN, wheel, "hip:gfx90a", "_bwd"),
    ]
    assert len({key, *others}) == 6


def test_what_is_compiled_is_the_python_package_and_only_it_decides_the_kept_parts(kit_repo, tmp_path):
    """A CUDA-only change (or one to the package's tests) gives a new input hash but the same compiled digest,
    so every kept part is reused; a change to a Triton source gives a new digest."""
    tests_file = kit_repo / "flash_kernels" / "flash_kernels" / "tests" / "test_x.py"
    tests_file.parent.mkdir(parents=True)
    tests_file.write_text("def test_x(): pass\n")
    plan = load_plan(kit_repo, ROCM)
    assert [f.path for f in triton_aot.compiled_sources(plan)] == ["flash_kernels/flash_kernels/__init__.py"]
    pkg = triton_aot.stage_sources(plan, tmp_path / "src")
    staged = sorted(p.relative_to(tmp_path / "src").as_posix() for p in (tmp_path / "src").rglob("*") if p.is_file())
    assert pkg == tmp_path / "src" / "flash_kernels" and staged == ["flash_kernels/flash_kernels/__init__.py"]
    digest, hash_before = triton_aot.compiled_digest(plan), plan.input_hash

    (kit_repo / "flash_kernels" / "csrc" / "kernel.cu").write_text("// stand-in, changed\n__global__ void k() {}\n")
    tests_file.write_text("def test_x(): assert True\n")
    cuda_only = load_plan(kit_repo, ROCM)
    assert cuda_only.input_hash != hash_before and triton_aot.compiled_digest(cuda_only) == digest

    (kit_repo / "flash_kernels" / "flash_kernels" / "triton_forward.py").write_text("# a Triton source\n")
    assert triton_aot.compiled_digest(load_plan(kit_repo, ROCM)) != digest


def test_the_repos_compiled_sources_hold_every_kernel_and_no_cuda_source():
    paths = {f.path for f in triton_aot.compiled_sources(load_plan(REPO, ROCM))}
    pkg = "flash_kernels/flash_kernels/"
    assert {pkg + m for m in ("triton_forward.py", "triton_backward.py", "triton_tiles.py", "aot/__init__.py")} <= paths
    assert not any(p.startswith((pkg + "tests/", "flash_kernels/csrc/", "flash_kernels/tools/")) for p in paths)


def _part(target, compiled):
    r = _report(**{target: (compiled, 0)})
    r.update(coverage={"dtypes": ["bf16"], "only": None}, toolchain={"hip_linker": "/usr/bin/ld.lld"})
    return r


def test_per_target_parts_merge_into_the_layout_of_one_run():
    a, b = _part("hip:gfx90a", 3), _part("hip:gfx942", 2)
    merged = triton_aot.merge_parts([a, b])
    assert list(merged["targets"]) == ["hip:gfx90a", "hip:gfx942"]
    assert [e["target"] for e in merged["specialisations"]] == [
        e["target"] for e in a["specialisations"] + b["specialisations"]
    ]
    assert triton_aot.outcome_of(merged, 0, PIN, AMD, 0.0).counts == {"checked": 5, "failed": 0, "pruned": 2}
    # one part: the very bytes the kernel package's tool writes (sorted keys, indent 1, final newline)
    single = (json.dumps(a, sort_keys=True, indent=1) + "\n").encode()
    assert triton_aot.report_bytes(triton_aot.merge_parts([json.loads(single)])) == single
    b["triton"] = "3.6.0"
    with pytest.raises(TierError, match="disagree on 'triton'"):
        triton_aot.merge_parts([a, b])


def _record(root, env=ROCM, verdict=Verdict.PASSED, report=None):
    plan = load_plan(root, env)
    rep = json.dumps(report or _report(**{t: (3, 0) for t in AMD}), sort_keys=True).encode()
    counts = {"checked": 6, "failed": 0, "pruned": 2}
    o = TierOutcome(Tier.TRITON_AOT, verdict, counts, ("compiled",), 1.0, {"hostname": "h", "triton": "3.3.1"})
    digest = triton_aot.compiled_digest(plan)
    return record.record_source_verdict(root, env, plan.input_hash, digest, o, rep, {"triton": "3.3.1"}), rep


def test_the_verdict_names_the_sources_and_its_report_by_sha256_and_matrix_shows_it_without_a_build(kit_repo, cli):
    (_ledger, fact, path), rep = _record(kit_repo)
    assert fact.subject.kind.value == "source" and fact.evidence["report_sha256"] in path.name
    assert path.read_bytes() == rep
    again = store.load(kit_repo, ROCM)  # read back: schema, ids and the source subject all check
    assert again.verdicts()[0] == fact
    s = gate.summary(again, input_hash(kit_repo, ROCM))
    assert s.tiers == {"triton-aot": "passed"} and s.status.startswith("triton-aot:passed (no build")
    r = cli("--repo", str(kit_repo), "matrix")
    assert any(x.startswith(ROCM + " ") and ".....P" in x for x in r.out.splitlines())
    shown = cli("--repo", str(kit_repo), "aot", ROCM, "--show")
    assert shown.code == 0 and "_attn_fwd fp16 d64 #2" in shown.out and "pruned (64 KB LDS)" in shown.out


def test_a_report_that_is_not_the_one_the_verdict_names_is_refused(kit_repo, cli):
    (_ledger, _fact, path), _rep = _record(kit_repo)
    path.write_text(path.read_text().replace("_attn_fwd", "_attn_xyz"))
    shown = cli("--repo", str(kit_repo), "aot", ROCM, "--show")
    assert shown.code == RecordError.exit_code and "sha256 differs" in shown.err


def test_a_verdict_at_an_older_input_hash_does_not_count(kit_repo):
    _record(kit_repo)
    spec = kit_repo / "flash_kernels" / "flash_kernels" / "triton_attention.py"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(spec.read_text() + "\n# changed\n" if spec.exists() else "# new\n")
    j = gate.source_judgement(store.load(kit_repo, ROCM), input_hash(kit_repo, ROCM), Tier.TRITON_AOT)
    assert j.verdict is None and "no triton-aot verdict" in j.how


def test_a_pass_with_nothing_compiled_cannot_be_written_or_read(kit_repo):
    with pytest.raises(RecordError):
        store.append(kit_repo, ROCM, [_forged_empty_pass(kit_repo)])


def _forged_empty_pass(root):
    from flashkit.ledger.model import VerdictFact, source_subject

    return VerdictFact(
        env=ROCM, input_hash=input_hash(root, ROCM), date="2026-12-02T00:00:00+00:00", tier=Tier.TRITON_AOT,
        verdict=Verdict.PASSED, subject=source_subject("0" * 64), counts={"checked": 0, "failed": 0},
        reasons=(), duration_s=0.0, host={}, source="build-host",
    )  # fmt: skip


def _interpreter_with_triton(tmp_path, version: str):
    """A real interpreter whose import path holds an installed distribution named triton at ``version``
    (metadata and RECORD only: the check reads what is installed, it compiles nothing)."""
    site = triton_site(tmp_path, version)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_a_preinstalled_triton_is_used_only_at_the_pinned_version(tmp_path):
    pin = _pin(REPO, CUDA)
    record_sha = triton_aot.preinstalled(_interpreter_with_triton(tmp_path / "ok", "3.6.0"), pin)
    assert record_sha == hashlib.sha256(b"triton-3.6.0.dist-info/METADATA,,\n").hexdigest()
    with pytest.raises(TierError) as e:
        triton_aot.preinstalled(_interpreter_with_triton(tmp_path / "old", "3.5.1"), pin)
    assert "has triton 3.5.1; the env pins 3.6.0 (lockfiles/cu130-torch211/py3.11.txt)" in str(e.value)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "python").write_text('#!/bin/sh\nexec python3 -I -S "$@"\n')
    (bare / "python").chmod(0o755)
    with pytest.raises(TierError) as e:
        triton_aot.preinstalled(bare / "python", pin)
    assert "has no triton to compile with" in str(e.value) and "leave out --python" in e.value.hint


def test_a_timeout_stops_the_tools_workers_too(tmp_path):
    pidfile = tmp_path / "worker.pid"
    tool = (
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(w.pid))\n"
        "time.sleep(120)\n"
    )
    with pytest.raises(TierError, match="did not finish in 3 s"):
        triton_aot._run([sys.executable, "-c", tool], 3)
    worker = int(pidfile.read_text())
    for _ in range(50):  # the orphan is reaped by init shortly after the kill
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"worker {worker} of the timed-out tool is still running")


def test_a_recorded_report_of_the_same_files_triton_and_targets_is_reused_at_a_new_input_hash(kit_repo, cli, tmp_path):
    """A fresh host has no kept parts; the ledger has the report. An edit that leaves the compiled package
    alone (here a CUDA source) moves the input hash, and `flashkit aot` records the tier there from the
    report of the earlier verdict without compiling (the stand-in triton here could compile nothing)."""
    py = _interpreter_with_triton(tmp_path / "py", "3.3.1")
    bits = triton_aot.preinstalled(py, _pin(kit_repo, ROCM))
    plan = load_plan(kit_repo, ROCM)
    report = _report(**{t: (3, 0) for t in AMD})
    o = triton_aot.outcome_of(report, 0, PIN, AMD, 0.0)
    context = {"triton": "3.3.1", "triton_installed": str(py), "triton_record_sha256": bits, "targets": ",".join(AMD)}
    _l, first, _p = record.record_source_verdict(
        kit_repo, ROCM, plan.input_hash, triton_aot.compiled_digest(plan), o, triton_aot.report_bytes(report), context
    )
    (kit_repo / "flash_kernels" / "csrc").mkdir(parents=True, exist_ok=True)
    (kit_repo / "flash_kernels" / "csrc" / "kernel.cu").write_text("// a CUDA-only change\n")
    moved = load_plan(kit_repo, ROCM)
    assert moved.input_hash != plan.input_hash
    r = cli("--repo", str(kit_repo), "aot", ROCM, "--python", str(py))
    assert r.code == 0 and f"the report of verdict {first.id[7:19]}" in r.err + r.out, r.err
    j = gate.source_judgement(store.load(kit_repo, ROCM), moved.input_hash, Tier.TRITON_AOT)
    assert j.passed and j.verdict.evidence == first.evidence and j.verdict.subject == first.subject
    assert j.verdict.context["report_reused"] == f"verdict {first.id[7:19]} at {plan.input_hash[:20]}"


@pytest.mark.parametrize("differs", ["digest", "triton bits", "targets"])
def test_a_recorded_report_of_anything_else_is_not_reused(differs, tmp_path):
    py = _interpreter_with_triton(tmp_path / "py", "3.3.1")
    plan = load_plan(REPO, ROCM)
    pin = _pin(REPO, ROCM)
    bits = triton_aot.preinstalled(py, pin)
    installed = {"triton_installed": str(py), "triton_record_sha256": bits}
    digest = triton_aot.compiled_digest(plan)
    ctx = {"triton": "3.3.1", "triton_record_sha256": bits, "targets": ",".join(AMD)}
    rec = triton_aot.Recorded("sha256:" + "1" * 64, "fk2-" + "0" * 64, f"sha256:{digest}", ctx, b"{}")
    assert rec.covers(digest, pin, installed, AMD)
    if differs == "digest":
        rec = dataclasses.replace(rec, subject="sha256:" + "2" * 64)
    elif differs == "triton bits":
        rec = dataclasses.replace(rec, context={**ctx, "triton_record_sha256": "3" * 64})
    else:
        rec = dataclasses.replace(rec, context={**ctx, "targets": "hip:gfx942"})
    assert not rec.covers(digest, pin, installed, AMD)
    # nothing to reuse: run() compiles, and the stand-in triton cannot
    with pytest.raises(TierError):
        triton_aot.run(plan, pin, tmp_path / "work", AMD, python=py, recorded=(rec,))


def test_only_a_passed_verdict_whose_report_is_intact_is_offered(kit_repo):
    from flashkit.cli import aot_cmd

    (_l, passed, path), _rep = _record(kit_repo)
    _record(kit_repo, verdict=Verdict.FAILED, report=_report(**{t: (2, 1) for t in AMD}))
    plan = load_plan(kit_repo, ROCM)
    assert [r.verdict_id for r in aot_cmd._recorded(kit_repo, plan)] == [passed.id]
    path.write_text(path.read_text().replace("_attn_fwd", "_attn_xyz"))
    assert aot_cmd._recorded(kit_repo, plan) == ()
