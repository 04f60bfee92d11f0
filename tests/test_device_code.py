"""Device code: its digest counts only the code, and a GPU verdict follows it to another env only
when that env's own wheel carries the identical digest, its spec accepts such evidence and its own build,
abi and cpu tiers passed. A relation that does not hold is refused with exit 34."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import struct
import zipfile
from pathlib import Path

import pytest
from kitsupport import H1, H2, artifact, digest, input_hash, verdict

from flashkit.core.errors import DeviceCodeMismatch, RecordError
from flashkit.core.names import Tier
from flashkit.evidence import device_code
from flashkit.ledger import gate, record, store
from flashkit.ledger.model import RELATION_DEVICE_CODE, content_id

SRC = "cu124-torch210"  # the stable-ABI wheel the GPU host can run
USER = "cu124-torch27"  # version-bound wheel; accepts device-code evidence (envs/cu124-torch27.yaml)
FULL = gate.parse_policy(None)
H200 = {
    "gpu": "NVIDIA H200",
    "capability": "9.0",
    "torch": "2.11.0+cu130",
    "torch_cuda": "13.0",
    "cuda_runtime": "12.8",
    "driver": "580.159.04",
}


# -- a fat binary built here, byte by byte ----------------------------------------------------------------------
def entry(kind: int, arch: int, payload: bytes, flags: int = 0, note: int = 0) -> bytes:
    """One fat binary entry (64-byte header, payload padded to 8); ``note`` fills a header field that is not code."""
    padded = payload + b"\0" * (-len(payload) % 8)
    head = struct.pack("<HHIQIIHHI", kind, 0x0101, 64, len(padded), len(payload), note, 0, 0, arch)
    head += b"\0" * (40 - len(head)) + struct.pack("<Q", flags) + b"\0" * 16
    return head + padded


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", device_code.FATBIN_MAGIC, 1, 16, len(body)) + body


def elf_with(section: bytes) -> bytes:
    """A minimal 64-bit ELF whose only named section is ``.nv_fatbin``."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_off = 64
    names_off = data_off + len(section)
    shoff = names_off + len(names)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 1)

    def sh(name: int, typ: int, off: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, 0, 0, 1, 0)

    table = sh(0, 0, 0, 0) + sh(1, 3, names_off, len(names)) + sh(11, 1, data_off, len(section))
    return header + section + names + table


CUBIN80, CUBIN90 = b"\x7fELF sm_80 code" * 5, b"\x7fELF sm_90a code" * 7
TU1 = container(entry(2, 80, CUBIN80), entry(2, 90, CUBIN90, flags=device_code.FLAG_ARCH_SPECIFIC))
TU2 = container(entry(1, 80, b".version 8.4\n.target sm_80\n"))


def wheel(path: Path, so: bytes, name: str = "flash_kernels/_C.abi3.so") -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(name, so)
        zf.writestr("flash_kernels/__init__.py", "")
    return path


def test_the_digest_counts_the_payloads_and_nothing_else(tmp_path):
    base = device_code.of_wheel(str(wheel(tmp_path / "a.whl", elf_with(TU1 + TU2))))
    assert base.summary() == "3 payloads in 1 extension(s); cubins sm_80, sm_90a; PTX compute_80"
    # Link order, padding between containers and header fields that are not code change nothing.
    reordered = device_code.of_wheel(str(wheel(tmp_path / "b.whl", elf_with(TU2 + b"\0" * 8 + TU1))))
    noted = TU1.replace(entry(2, 80, CUBIN80), entry(2, 80, CUBIN80, note=7))
    assert noted != TU1
    annotated = device_code.of_wheel(str(wheel(tmp_path / "c.whl", elf_with(noted + TU2))))
    assert base.digest == reordered.digest == annotated.digest
    # One byte of one payload: another digest.
    flipped = TU1.replace(CUBIN90, CUBIN90[:-1] + b"!")
    assert device_code.of_wheel(str(wheel(tmp_path / "d.whl", elf_with(flipped + TU2)))).digest != base.digest
    # The same code for another arch, or as PTX instead of a cubin, is other code.
    other_arch = container(entry(2, 86, CUBIN80), entry(2, 90, CUBIN90, flags=device_code.FLAG_ARCH_SPECIFIC))
    assert device_code.of_wheel(str(wheel(tmp_path / "e.whl", elf_with(other_arch + TU2)))).digest != base.digest
    # The digest is recomputable from the listing the ledger stores.
    assert device_code.digest_of(json.loads(json.dumps(base.as_json()))) == base.digest


def test_a_wheel_without_device_code_and_broken_sections_say_so(tmp_path):
    assert (
        device_code.of_wheel(str(wheel(tmp_path / "t.whl", b"\x7fELF" + bytes([2, 1]) + b"\0" * 58))).extensions == {}
    )
    with pytest.raises(device_code.DeviceCodeError, match=r"_C\.abi3\.so: .*past the section end"):
        device_code.of_wheel(str(wheel(tmp_path / "x.whl", elf_with(TU1[:-9]))))
    with pytest.raises(device_code.DeviceCodeError, match="not a readable wheel"):
        device_code.of_wheel(str(tmp_path / "missing.whl"))


def test_real_nvcc_objects_give_one_digest_per_code(tmp_path):
    """Two compiles of one source with one nvcc and one set of flags: the same device code, whatever else."""
    spec = importlib.util.spec_from_file_location("elf_fixture_build", Path(__file__).parent / "fixtures/elf/build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    try:
        one = build.cuda_module(tmp_path / "one.so", "arch=compute_80,code=sm_80")
        two = build.cuda_module(tmp_path / "two" / "two.so", "arch=compute_80,code=sm_80")
        ptx = build.cuda_module(tmp_path / "ptx.so", "arch=compute_80,code=compute_80")
    except build.ToolMissing as exc:
        pytest.skip(str(exc))
    codes = [device_code.of_files({"m.so": p.read_bytes()}) for p in (one, two, ptx)]
    assert codes[0].digest == codes[1].digest != codes[2].digest
    assert codes[0].archs() == ("sm_80",) and codes[2].archs() == ("compute_80",)


# -- the ledger ---------------------------------------------------------------------------------------------------
def listing(payload: bytes) -> device_code.DeviceCode:
    return device_code.of_files({"flash_kernels/_C.abi3.so": elf_with(container(entry(2, 90, payload)))})


CODE = listing(b"the kernels, compiled once" * 9)
OTHER = listing(b"the kernels, compiled once" * 8 + b"the kernels, compiled twice")


@pytest.fixture
def root(kit_repo):
    return kit_repo


def gpu_source(root: Path, code=CODE, result: str = "passed"):
    """SRC's stable-ABI wheel: its own tiers, its device code, and its artifact-gpu run on the H200."""
    art = artifact(SRC, H1, image=digest("src image"), wheel="aa" * 32)
    gpu = dataclasses.replace(verdict(art, "artifact-gpu", result), host=H200, source="imported")
    store.append(root, SRC, [art, *(verdict(art, t) for t in ("build", "abi", "cpu"))])
    record.record_device_code(root, art, code, {"compiler": "nvcc 12.4"})
    record.append_with_applies(root, SRC, [gpu])
    return art, gpu


def user(root: Path, code=CODE, tiers=("build", "abi", "cpu"), env: str = USER):
    art = artifact(env, H2, image=digest(f"{env} image"), wheel="bb" * 32)
    store.append(root, env, [art, *(verdict(art, t) for t in tiers)])
    record.record_device_code(root, art, code, {"compiler": "nvcc 12.4"})
    return art


def relations(root: Path, env: str = USER):
    return [a for a in store.load(root, env).applies() if a.relation == RELATION_DEVICE_CODE]


def test_a_gpu_verdict_follows_identical_device_code_to_an_env_that_accepts_it(root):
    _src, gpu = gpu_source(root)
    art = user(root)
    (rel,) = relations(root)
    assert (rel.source_env, rel.verdict_id, rel.artifact_id, rel.device_code) == (SRC, gpu.id, art.id, CODE.digest)
    assert rel.subject == gpu.subject != art.subject(Tier.ARTIFACT_GPU)  # the verdict judged the other wheel
    assert "not in this env" in rel.because and "torch binding (host code)" in rel.because
    ledger = store.load(root, USER)
    j = gate.judge(ledger, art, Tier.ARTIFACT_GPU)
    assert j.passed and j.relation == RELATION_DEVICE_CODE and j.device_code == CODE.digest
    assert f"via device code {CODE.digest[:19]}" in j.line() and f"of {SRC} under torch 2.11.0+cu130" in j.line()
    assert "CUDA runtime 12.8" in j.line() and "NVIDIA H200" in j.line()
    decision = gate.gate(ledger, H2, art.image_id, FULL)
    assert decision.ok and "artifact-gpu" in decision.passed_tiers
    assert gate.summary(ledger, H2).tiers["artifact-gpu"] == f"passed(device-code:{SRC})"
    # An env that does not accept device-code evidence (the spec's gpu_evidence) gets no relation...
    user(root, env="cu130-torch212")
    assert relations(root, "cu130-torch212") == []
    # ...and a gate told to accept only the env's own GPU verdicts does not count the relation.
    assert not gate.gate(ledger, H2, art.image_id, FULL, accepts=("own",)).ok


def test_the_relation_is_written_whichever_comes_first(root):
    """The consumer's device code recorded before the GPU run exists: the run, when it arrives, reaches it."""
    art = user(root)
    assert relations(root) == []
    _src, gpu = gpu_source(root)
    (rel,) = relations(root)
    assert rel.verdict_id == gpu.id and rel.artifact_id == art.id


def test_a_wheel_whose_device_code_differs_by_one_byte_gets_no_verdict(root):
    gpu_source(root)
    art = user(root, code=OTHER)
    assert relations(root) == []
    ledger = store.load(root, USER)
    assert not gate.judge(ledger, art, Tier.ARTIFACT_GPU).passed
    decision = gate.gate(ledger, H2, art.image_id, FULL)
    assert not decision.ok and "artifact-gpu: not verified" in decision.reasons[0]


def test_the_relation_counts_only_after_the_envs_own_build_abi_and_cpu_passed(root):
    gpu_source(root)
    art = user(root, tiers=("build", "abi"))
    assert len(relations(root)) == 1  # the relation is a fact; what it is worth is the gate's to say
    j = gate.judge(store.load(root, USER), art, Tier.ARTIFACT_GPU)
    assert not j.passed and "own build, abi and cpu passed" in j.how and "cpu: not verified" in j.how
    only_gpu = gate.gate(store.load(root, USER), H2, art.image_id, gate.parse_policy("artifact-gpu"))
    assert not only_gpu.ok and "cpu: not verified" in only_gpu.reasons[0]


def test_a_failed_gpu_run_follows_the_code_too(root):
    gpu_source(root, result="failed")
    art = user(root)
    j = gate.judge(store.load(root, USER), art, Tier.ARTIFACT_GPU)
    assert j.verdict is not None and not j.passed and j.relation == RELATION_DEVICE_CODE


def _write(root: Path, env: str, body: dict) -> None:
    body = {k: v for k, v in body.items() if k != "id"}
    with store.ledger_path(root, env).open("a") as f:
        f.write(json.dumps({**body, "id": content_id(body)}, sort_keys=True) + "\n")


def test_a_forged_relation_is_refused_with_exit_34(root):
    gpu_source(root)
    art = user(root, code=OTHER)  # really another code
    src_gpu = next(v for v in store.load(root, SRC).verdicts() if v.tier is Tier.ARTIFACT_GPU)
    forged = record._applies(src_gpu, art, "trust me", source_env=SRC)
    forged = dataclasses.replace(forged, relation=RELATION_DEVICE_CODE, device_code=CODE.digest)
    _write(root, USER, json.loads(forged.line()))
    with pytest.raises(DeviceCodeMismatch, match="is not the device code of this build's wheel") as exc:
        store.load(root, USER)
    assert exc.value.exit_code == 34
    # Naming the consumer's real code instead: the verdict's wheel has other code.
    path = store.ledger_path(root, USER)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    forged = dataclasses.replace(forged, device_code=OTHER.digest)
    _write(root, USER, json.loads(forged.line()))
    with pytest.raises(DeviceCodeMismatch, match=f"has device code {CODE.digest}, not {OTHER.digest}"):
        store.load(root, USER)


def test_a_tampered_listing_or_a_second_digest_for_one_wheel_is_refused(root):
    art = user(root)
    fact = store.load(root, USER).device_codes()[0]
    body = json.loads(fact.line())
    body["extensions"]["flash_kernels/_C.abi3.so"][0]["sha256"] = "0" * 64
    path = store.ledger_path(root, USER)
    _write(root, USER, body)  # the id is right for the edited body; the digest no longer is
    with pytest.raises(RecordError, match=r"field digest: .* is not the digest of the listed payloads"):
        store.load(root, USER)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    other = record.device_code_fact(art, OTHER, {})
    _write(root, USER, json.loads(other.line()))
    with pytest.raises(DeviceCodeMismatch, match="one wheel has one device code"):
        store.load(root, USER)


def test_the_committed_cuda12_ledgers_share_one_device_code_across_bindings():
    """What the builds of this repository recorded from its current sources: the CUDA 12 wheels (version-bound
    pre-cxx11 and cxx11, stable ABI) differ as files but carry the same device code, so one GPU run covers all
    of them. Builds of other sources (an env's earlier or later input hash) carry other code and are not
    compared."""
    repo = Path(__file__).resolve().parents[1]
    found = {}
    for env in ("cu124-torch26", "cu124-torch27", "cu124-torch28", "cu124-torch29", "cu124-torch210"):
        ledger = store.load(repo, env)
        wheels = {a.wheel_sha256 for a in ledger.artifacts(input_hash(repo, env))}
        codes = [c for c in ledger.device_codes() if c.wheel_sha256 in wheels]
        if codes:
            found[env] = codes[-1]
    if len(found) < 2:
        pytest.skip("fewer than two CUDA 12 envs have recorded device code")
    assert len({f.wheel_sha256 for f in found.values()}) == len(found)  # different files...
    assert len({f.toolchain.get("torch_binding") for f in found.values()}) >= 1
    assert len({f.digest for f in found.values()}) == 1, {e: f.digest for e, f in found.items()}  # ...one code


def test_device_code_fact_is_named_by_content():
    art = artifact(USER, H2, wheel="bb" * 32)
    fact = record.device_code_fact(art, CODE, {"compiler": "nvcc 12.4"})
    body = json.loads(fact.line())
    assert body["kind"] == "device-code" and body["digest"] == CODE.digest and body["artifact_id"] == art.id
    assert store.check_body(body) == fact
    assert record.device_code_fact(art, OTHER, {"compiler": "nvcc 12.4"}).id != fact.id


def test_merged_lines_bring_the_relation_both_ways(root, tmp_path, cli):
    """A CI job's upload of the GPU run, merged here, reaches the env whose device code matches."""
    art = user(root)
    upload = tmp_path / "upload"
    upload.mkdir()
    gpu_source(upload)  # recorded elsewhere: its own folder stands for the job's verified/
    src = store.ledger_path(upload, SRC)
    r = cli("--repo", str(root), "ledger", "merge", str(src))
    assert r.code == 0, r.err
    (rel,) = relations(root)
    assert rel.artifact_id == art.id and rel.source_env == SRC
    assert f"{USER}: 1 applies of other envs' verdicts added" in r.out


def test_an_unreadable_fat_binary_is_a_tier_error_not_a_crash(root, tmp_path):
    from flashkit.core.errors import TierError
    from flashkit.ledger.device_code import record_for_build
    from flashkit.plan.specfile import load_env

    art = artifact(USER, H2, wheel="bb" * 32)
    broken = wheel(tmp_path / "broken.whl", elf_with(TU1[:-9]))
    with pytest.raises(TierError, match=r"device code of broken\.whl cannot be read: .*past the section end") as exc:
        record_for_build(root, load_env(root, USER), art, broken)
    assert exc.value.exit_code == 15


def test_the_cuda_runtime_wheel_is_checked_before_anything_runs(tmp_path, capsys):
    """artifact_check's --cuda-runtime-wheel: the pinned file or nothing; each refusal with its exit code."""
    from flashkit.evidence import artifact_check

    fk = wheel(tmp_path / "fk.whl", elf_with(TU1))
    rt = tmp_path / "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(rt, "w") as zf:
        zf.writestr("nvidia/cuda_runtime/lib/libcudart.so.12", b"\x7fELF")
    good = hashlib.sha256(rt.read_bytes()).hexdigest()
    base = [str(fk), "--expect-sha256", "0" * 64, "--env", SRC, "--input-hash", H1, "--expect-torch", "2.10",
            "--expect-cuda", "12", "--torch-abi", "stable", "--out", str(tmp_path / "r.json")]  # fmt: skip

    def run(*extra: str) -> tuple[int, str]:
        code = artifact_check.main([*base, *extra])
        return code, capsys.readouterr().err

    assert run("--cuda-runtime-wheel", str(rt))[0] == artifact_check.EXIT_USAGE  # no pinned hash given
    code, err = run("--cuda-runtime-wheel", str(rt), "--cuda-runtime-sha256", "1" * 64)
    assert code == artifact_check.EXIT_NO_WHEEL and f"sha256 {good} is not the pinned" in err
    code, err = run("--cuda-runtime-wheel", str(tmp_path / "gone.whl"), "--cuda-runtime-sha256", good)
    assert code == artifact_check.EXIT_NO_WHEEL and "no such wheel file" in err
    code, err = run("--cuda-runtime-wheel", str(rt), "--cuda-runtime-sha256", good, "--expect-cuda", "13")
    assert code == artifact_check.EXIT_USAGE and "holds no libcudart.so.13" in err
    assert not (tmp_path / "r.json").exists()  # nothing ran, nothing was written
