"""The ``triton-aot`` tier: every Triton specialisation flash_kernels would launch, compiled ahead of time
for GPU targets this host does not have (AMD gfx90a/gfx942, NVIDIA sm_80), with the triton the env pins.

It needs no GPU, no image and no torch: a virtual environment holds only the env's triton (hash-pinned,
cached under ``.work/aot/``), and the kernel package's own ``flash_kernels.aot`` enumerates what the
launchers would compile (tile configs chosen by the kernels' own selection for each target, configs that
cannot fit a target pruned by it) and reports, per specialisation, whether it compiled and what it uses
(registers or VGPRs, shared memory or LDS, spills). What is compiled is the kernel package's Python package
(``flash_kernels/flash_kernels/``, its tests left out), as the plan's bytes, the ones the input hash covers,
staged alone into a temporary folder: nothing else is there to import, so the digest of those files (the
verdict's subject) names everything the compile read.

Each target is compiled in a run of its own, and a run that passed is kept under ``.work/aot-parts/``, named
by the sha256 of what decides its result (that digest, the triton version and the digest of its installed
bits, the target, the ``--only`` filter). A later run reuses it instead of compiling again: an interrupted tier
(the AMD targets take an hour or more each on two cores) resumes at the next target, and a change that leaves
the Python package alone (the CUDA sources, the package's tests, its tools, its README) records the tier at
the new input hash in seconds. On a host without those parts (a fresh checkout), a passed verdict in the
env's ledger made from the same digest, triton bits and targets serves instead: its report, kept beside the
ledger and checked against the sha256 the verdict names, is the report. The report is the same bytes either
way. Failed or interrupted targets are never kept.

What it proves: the kernels compile for those targets and fit their resources. What it does not: that
they run or are correct there. The verdict says so in plain words.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flashkit.core.atomic import write_text_atomic
from flashkit.core.errors import TierError
from flashkit.core.names import Tier, Verdict
from flashkit.plan import hosts, inputhash
from flashkit.plan.plan import Plan
from flashkit.plan.triton_pin import TritonPin
from flashkit.verify.tiers import TierOutcome, host_facts

PACKAGE_DIR = "flash_kernels"  # the kernel package's folder in the repo: its sources' paths start here
# What the compile imports: the Python package inside it, without its tests (the AOT tool never imports them).
COMPILED_PREFIX = f"{PACKAGE_DIR}/flash_kernels/"
NOT_COMPILED_PREFIX = f"{COMPILED_PREFIX}tests/"
MODULE = "flash_kernels.aot"
VENV_TIMEOUT_S = 1800
# A hang guard, not a budget: with triton 3.3.1 one AMD target took more than an hour of wall time on two
# cores shared with image builds (and was killed by the earlier one-hour limit), so a target gets four.
SECONDS_PER_TARGET = 4 * 3600
HIP_PREFIX = "gfx"
PARTS_DIR = "aot-parts"


@dataclass(frozen=True)
class AotRun:
    outcome: TierOutcome
    report: bytes  # the kernel package's JSON report, byte for byte (the verdict's evidence)
    context: dict[str, str]  # triton version and wheel, targets, the largest resources per target
    sources_digest: str  # what the verdict judges: compiled_sources' digest (inputhash.sources_digest)
    reused: tuple[str, ...] = ()  # targets whose part came from an earlier run (PARTS_DIR or a recorded report)


@dataclass(frozen=True)
class Recorded:
    """A passed triton-aot verdict in the env's ledger and the report it names (checked against its sha256)."""

    verdict_id: str
    input_hash: str
    subject: str  # "sha256:<compiled digest>"
    context: dict[str, str]
    report: bytes

    def covers(self, digest: str, pin: TritonPin, installed: dict[str, str], targets: tuple[str, ...]) -> bool:
        """Was it made from these very files, with this very triton, for exactly these targets?"""
        same_bits = all(self.context.get(k) == v for k, v in installed.items() if k != "triton_installed")
        return (
            self.subject == f"sha256:{digest}"
            and self.context.get("triton") == pin.version
            and same_bits
            and self.context.get("targets") == ",".join(targets)
        )


def targets_for(spec) -> tuple[str, ...]:
    """The env's GPU targets that no host here runs, in flash_kernels.aot's spelling (``hip:gfx942``,
    ``cuda:80``). The GPU host's own (sm_90) is left out: its kernels run there for real (artifact-gpu)."""
    out = []
    for t in spec.gpu_targets:
        if t.startswith(HIP_PREFIX):
            out.append(f"hip:{t}")
        elif t.rstrip("af") != hosts.load().gpu.sm:
            major, minor = t.rstrip("af").split(".")
            out.append(f"cuda:{major}{minor}")
    return tuple(dict.fromkeys(out))


def _run(cmd: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None):
    """``cmd`` in a process group of its own: a timeout or an interrupt stops its compile workers too (killing
    only the tool left its process pool compiling, orphaned, for as long again)."""
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True
        )
    except OSError as exc:  # not a program (ENOEXEC), gone, or not allowed
        raise TierError(f"{cmd[0]} cannot be run: {exc.strerror}", hint="check --python or the tool's venv") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise TierError(f"{' '.join(cmd[:4])} … did not finish in {timeout:.0f} s") from None
    except BaseException:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def venv_for(work: Path, pin: TritonPin) -> tuple[Path, str]:
    """A virtual environment holding only the pinned triton, made once per pin and Python (atomically: a
    half-made one is never reused); its python, and the sha256 of the triton wheel pip installed."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    key = hashlib.sha256(f"{py}\n{pin.requirements}".encode()).hexdigest()[:16]
    final = work / "aot" / f"triton-{pin.version}-py{py}-{key}"
    if not (final / "installed.json").is_file():
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".venv-", dir=final.parent))
        try:
            _make_venv(staging, pin)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    installed = json.loads((final / "installed.json").read_text())
    return final / "bin" / "python", installed["triton_wheel_sha256"]


def _make_venv(dest: Path, pin: TritonPin) -> None:
    res = _run([sys.executable, "-m", "venv", str(dest)], 300)
    if res.returncode != 0:
        raise TierError(f"could not make a virtual environment: {res.stderr.strip()[-500:]}")
    req, report = dest / "requirements.txt", dest / "pip-report.json"
    req.write_text(pin.requirements)
    # --report names the file pip took and its hash: the wheel the verdict's context records.
    res = _run(
        [str(dest / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--require-hashes", "--no-deps", "--only-binary", ":all:", "--report", str(report), "-r", str(req)],
        VENV_TIMEOUT_S,
    )  # fmt: skip
    if res.returncode != 0:
        raise TierError(
            f"installing triton {pin.version} ({pin.source}) failed: {res.stderr.strip()[-800:]}",
            hint="the tier needs PyPI (or PIP_INDEX_URL) to fetch the pinned wheel once",
        )
    items = json.loads(report.read_text()).get("install", [])
    digest = next(
        (i["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256", "")
         for i in items if i.get("metadata", {}).get("name", "").lower() == "triton"),
        "",
    )  # fmt: skip
    (dest / "installed.json").write_text(json.dumps({"triton": pin.version, "triton_wheel_sha256": digest}))


def preinstalled(python: Path, pin: TritonPin) -> str:
    """Check an interpreter that already holds the pinned triton (an air-gapped host, such as a GPU host with
    no index to install from); the sha256 of that triton's installed RECORD (the files it holds), since no
    wheel was downloaded whose hash could be named. Any other triton version is refused."""
    probe = (
        "import hashlib, importlib.metadata as m; d = m.distribution('triton'); "
        "print(d.version); print(hashlib.sha256(d.read_text('RECORD').encode()).hexdigest())"
    )
    res = _run([str(python), "-c", probe], 120)
    lines = res.stdout.split()
    if res.returncode != 0 or len(lines) != 2:
        last = ((res.stderr or res.stdout).strip().splitlines() or ["no output"])[-1]
        raise TierError(
            f"{python} has no triton to compile with: {last[-300:]}",
            hint=f"install triton {pin.version} there, or leave out --python to install the pin from the index",
        )
    version, record_sha = lines
    if version != pin.version:
        raise TierError(
            f"{python} has triton {version}; the env pins {pin.version} ({pin.source})",
            hint="the tier compiles with exactly the env's triton: use an interpreter that has it",
        )
    return record_sha


def compiled_sources(plan: Plan) -> list:
    """The plan's source files the compile can read: the kernel package's Python package, tests left out."""
    return [
        f for f in plan.sources if f.path.startswith(COMPILED_PREFIX) and not f.path.startswith(NOT_COMPILED_PREFIX)
    ]


def compiled_digest(plan: Plan) -> str:
    """The verdict's subject: the digest of compiled_sources' (path, mode, sha256) list."""
    return inputhash.sources_digest((f.path, f.mode, f.sha256) for f in compiled_sources(plan))


def stage_sources(plan: Plan, dest: Path) -> Path:
    """compiled_sources (the bytes the input hash covers) under ``dest``, and nothing else; the folder to
    import from."""
    for f in compiled_sources(plan):
        path = dest / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f.data)
    return dest / PACKAGE_DIR


def part_key(sources_digest: str, pin: TritonPin, installed: dict[str, str], target: str, only: str | None) -> str:
    """The name of a target's kept part: everything that decides its report, and nothing that does not (the
    interpreter's path, the number of jobs)."""
    bits = installed.get("triton_wheel_sha256") or installed.get("triton_record_sha256", "")
    facts = {"module": MODULE, "sources": sources_digest, "triton": pin.version, "triton_bits": bits}
    facts.update(target=target, only=only or "")
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def merge_parts(parts: list[dict]) -> dict:
    """One report from per-target reports of the same sources and triton, in the order given; the layout
    (and, for one target, the bytes) of a single run over all of them."""
    if not parts:
        raise TierError("no target to compile for")
    first = parts[0]
    for p in parts[1:]:
        for key in ("report_version", "triton", "coverage"):
            if p.get(key) != first.get(key):
                raise TierError(f"{MODULE}: the per-target reports disagree on {key!r}; delete .work/{PARTS_DIR}/")
    report = {k: v for k, v in first.items() if k not in ("toolchain", "targets", "specialisations")}
    report["toolchain"] = {k: v for p in parts for k, v in (p.get("toolchain") or {}).items()}
    report["targets"] = {k: v for p in parts for k, v in (p.get("targets") or {}).items()}
    report["specialisations"] = [e for p in parts for e in p.get("specialisations", [])]
    return report


def report_bytes(report: dict) -> bytes:
    """flash_kernels.aot's own serialisation (sorted keys, indent 1, final newline)."""
    return (json.dumps(report, sort_keys=True, indent=1) + "\n").encode()


def run(
    plan: Plan,
    pin: TritonPin,
    work: Path,
    targets: tuple[str, ...],
    jobs: int = 2,
    only: str | None = None,
    python: Path | None = None,
    recorded: tuple[Recorded, ...] = (),
) -> AotRun:
    """Compile every specialisation for ``targets`` and judge the report (``only``: a subset, for a quick look;
    ``python``: an interpreter that already has the pinned triton, instead of a venv made from the index).
    Each target runs alone; a passed target's report is kept and reused (module docstring). ``recorded``: the
    env's passed verdicts with their reports; one made from the same files, triton bits and targets is the
    report, whatever input hash it was recorded at (a fresh host has no kept parts, the ledger has the report)."""
    start = time.monotonic()
    if python is None:
        python, wheel_sha = venv_for(work, pin)
        installed = {"triton_wheel_sha256": wheel_sha}
    else:
        installed = {"triton_installed": str(python)[:200], "triton_record_sha256": preinstalled(python, pin)}
    digest = compiled_digest(plan)
    earlier = next((r for r in recorded if only is None and r.covers(digest, pin, installed, targets)), None)
    if earlier is not None:
        report = json.loads(earlier.report)
        outcome = outcome_of(report, 0, pin, targets, start)
        context = context_of(report, pin, installed, targets)
        context["parts_reused"] = ",".join(targets)
        context["report_reused"] = f"verdict {earlier.verdict_id[7:19]} at {earlier.input_hash[:20]}"
        return AotRun(outcome, report_bytes(report), context, digest, targets)
    parts, codes, reused = [], [], []
    with tempfile.TemporaryDirectory(prefix="flashkit-aot-") as tmp:
        pkg = stage_sources(plan, Path(tmp) / "src")
        for target in targets:
            kept = work / PARTS_DIR / f"{part_key(digest, pin, installed, target, only)}.json"
            if kept.is_file():
                parts.append(json.loads(kept.read_bytes()))
                codes.append(0)
                reused.append(target)
                continue
            data, code = _compile_target(python, pkg, Path(tmp) / target.replace(":", "_"), target, jobs, only, pin)
            if code == 0:
                write_text_atomic(kept, data.decode("utf-8"))
            parts.append(json.loads(data))
            codes.append(code)
    report = merge_parts(parts)
    outcome = outcome_of(report, max(codes), pin, targets, start)
    context = context_of(report, pin, installed, targets)
    if reused:
        context["parts_reused"] = ",".join(reused)
    return AotRun(outcome, report_bytes(report), context, digest, tuple(reused))


def _compile_target(
    python: Path, pkg: Path, tmp: Path, target: str, jobs: int, only: str | None, pin: TritonPin
) -> tuple[bytes, int]:
    """One target's run of the kernel package's tool, with a cold triton cache: its report and exit status."""
    tmp.mkdir(parents=True)
    out = tmp / "report.json"
    cmd = [str(python), "-m", MODULE, "--target", target, "--jobs", str(jobs), "--timings", "--out", str(out)]
    cmd += ["--only", only] if only else []
    env = {**os.environ, "PYTHONPATH": str(pkg), "PYTHONDONTWRITEBYTECODE": "1"}
    env["TRITON_CACHE_DIR"] = str(tmp / "cache")  # a cold cache: every kernel is really compiled
    res = _run(cmd, SECONDS_PER_TARGET, env=env, cwd=tmp)
    if res.returncode == 2 or not out.is_file():
        raise TierError(
            f"{MODULE} could not run with triton {pin.version} for {target} (exit {res.returncode}): "
            f"{(res.stderr or res.stdout).strip()[-1200:]}"
        )
    return out.read_bytes(), res.returncode


def _summary(report: dict) -> dict[str, dict]:
    return report.get("targets", {})


def outcome_of(report: dict, returncode: int, pin: TritonPin, targets: tuple[str, ...], start: float) -> TierOutcome:
    """The verdict a report supports: passed only when every specialisation that was not pruned compiled,
    on every target asked for, and the exit status agrees."""
    summ = _summary(report)
    compiled = sum(int(s.get("compiled", 0)) for s in summ.values())
    failed = sum(int(s.get("failed", 0)) for s in summ.values())
    pruned = sum(int(s.get("pruned", 0)) for s in summ.values())
    reasons = []
    missing = [t for t in targets if t not in summ]
    for t in missing:
        reasons.append(f"{t}: the report has no result for this target")
    for t, s in sorted(summ.items()):
        reasons.append(_target_line(t, s))
    for k in [k for k in report.get("specialisations", []) if k.get("status") == "failed"][:20]:
        reasons.append(f"failed {k.get('target')} {k.get('id', '')}: {str(k.get('error', ''))[:300]}")
    ok = returncode == 0 and failed == 0 and compiled > 0 and not missing
    if ok:
        reasons.insert(0, headline(targets, pin.version))
    elif returncode not in (0, 1):
        reasons.insert(0, f"{MODULE} exited {returncode}")
    host = {**host_facts(), "triton": pin.version, "python": sys.version.split()[0]}
    counts = {"checked": compiled, "failed": failed, "pruned": pruned}
    verdict = Verdict.PASSED if ok else Verdict.FAILED
    return TierOutcome(Tier.TRITON_AOT, verdict, counts, tuple(reasons), round(time.monotonic() - start, 1), host)


def arch_name(target: str) -> str:
    """``hip:gfx942`` -> gfx942, ``cuda:80`` -> sm_80: the names users know the GPUs by."""
    backend, arch = target.split(":", 1)
    return f"sm_{arch}" if backend == "cuda" else arch


def headline(targets: tuple[str, ...], triton: str) -> str:
    """What a pass says, and what it does not: these kernels were compiled, never run, for those GPUs."""
    names = " and ".join(arch_name(t) for t in targets)
    if all(t.startswith("hip:") for t in targets):
        return f"Triton-AMD kernels compile for {names} with triton {triton}; never run on an AMD GPU"
    return f"Triton kernels compile for {names} with triton {triton}; never run on such a GPU here"


def _target_line(target: str, s: dict) -> str:
    parts = [f"{target}: {s.get('compiled', 0)} compiled, {s.get('failed', 0)} failed, {s.get('pruned', 0)} pruned"]
    shared = "max LDS bytes" if target.startswith("hip:") else "max shared bytes"
    names = {"max_registers": "max registers", "max_vgprs": "max VGPRs", "max_shared_bytes": shared}
    names |= {"with_spills": "with spills", "seconds": "seconds"}
    parts += [f"{label} {s[key]}" for key, label in names.items() if key in s]
    return ", ".join(parts)


def context_of(report: dict, pin: TritonPin, installed: dict[str, str], targets: tuple[str, ...]) -> dict[str, str]:
    ctx = {"triton": pin.version, **installed, "triton_pin": pin.source[:200]}
    ctx["targets"] = ",".join(targets)
    for name, value in sorted((report.get("toolchain") or {}).items()):
        ctx[f"toolchain.{name}"] = str(value)[:200]
    for t, s in sorted(_summary(report).items()):
        name = t.replace(":", "_")
        for key in ("max_registers", "max_vgprs", "max_shared_bytes", "with_spills", "specialisations"):
            if key in s:
                ctx[f"{name}.{key}"] = str(s[key])
    return ctx


def table(report: dict) -> str:
    """The per-specialisation resource table of a report, one line each, for `flashkit aot --show`."""
    rows = [("target", "specialisation", "status", "regs/VGPRs", "shared/LDS B", "spills")]
    for k in report.get("specialisations", []):
        res = k.get("resources") or {}
        regs = res.get("registers", res.get("vgpr_count", ""))
        shared = res.get("lds_bytes", res.get("shared_bytes", ""))
        spills = res.get("vgpr_spill_count", (res.get("spill_store_bytes", 0) + res.get("spill_load_bytes", 0)) or "")
        status = k.get("status", "") + (f" ({k['reason']})" if k.get("reason") else "")
        rows.append((k.get("target", ""), k.get("id", ""), status, regs, shared, spills if res else ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
