"""The artifact-gpu tier: check an exported flash_kernels wheel on a GPU host, no docker, no network.

Runs with the standard library only, so it needs neither flashkit installed nor its dependencies:
copy the repository (or just ``flashkit/``) and the wheel to the GPU host and run, from its root,

    PYTHONPATH=. python3 -m flashkit.evidence.artifact_check WHEEL --expect-sha256 HEX \
        --env cu130-torch211 --input-hash H --expect-torch 2.11 --expect-cuda 13 --out result.json

It verifies the wheel's sha256, installs it with ``pip install --no-deps --target`` into a fresh
directory (the host's own torch stays in charge), checks that torch major.minor and its CUDA major
match the env, runs the kernel suite's GPU tier against that directory and writes two files: the JSON
result, and beside it the suite's JUnit report (``<result stem>.junit.xml``), whose sha256 the result
names. ``flashkit verify import-artifact-result ENV result.json`` imports them together: it recounts
the report and refuses a result that disagrees with it.

Exit codes: 0 passed; 16 the tier ran and did not pass, or could not run here (the result says why);
2 usage error (a --cuda-runtime-wheel without its sha256, or without libcudart.so.<CUDA major>; an --out or
--log whose folder does not exist or cannot be written, or that names a place no output of flashkit's may go
(:mod:`flashkit.core.outputs`: /proc, /dev, a git directory, a folder), checked before anything runs; a
--timeout outside 1 s to a week); 3 the wheel file is
missing, or the CUDA runtime wheel is missing, not the pinned file, or not a wheel that can be unpacked
safely (:mod:`flashkit.evidence.wheelzip`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flashkit.core import outputs
from flashkit.core.atomic import write_text_atomic
from flashkit.core.errors import FlashkitError
from flashkit.evidence import device_code, wheelzip
from flashkit.evidence.junit import JunitError, junit_counts, junit_failures, suite_verdict

RESULT_SCHEMA = 2
EXIT_PASSED, EXIT_USAGE, EXIT_NO_WHEEL, EXIT_NOT_VERIFIED = 0, 2, 3, 16
MAX_TIMEOUT_S = 7 * 24 * 3600  # past a week, subprocess cannot even represent some limits

_TORCH_PROBE = (
    "import json, torch; ok = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
    "'torch_cuda': torch.version.cuda, 'cuda_available': ok, "
    "'device': torch.cuda.get_device_name(0) if ok else None, "
    "'capability': '%d.%d' % torch.cuda.get_device_capability(0) if ok else None}))"
)


# Which CUDA runtime the extension loaded, and whether it registered its ops (a wheel whose extension does not
# load would otherwise pass on the Triton fallback and judge nothing of its compiled code).
_EXTENSION_PROBE = (
    "import json, torch, flash_kernels._cuda as c; "
    "maps = open('/proc/self/maps').read().split(chr(10)); "
    "libs = sorted({l.split()[-1] for l in maps if 'libcudart.so' in l}); "
    "print(json.dumps({'built': c.is_built(), 'error': c.import_error(), 'cudart': libs}))"
)
_CUDART_PROBE = (
    "import ctypes, json, sys; lib = ctypes.CDLL('libcudart.so.' + sys.argv[1]); v = ctypes.c_int(0); "
    "rc = lib.cudaRuntimeGetVersion(ctypes.byref(v)); "
    "print(json.dumps({'rc': rc, 'version': '%d.%d' % (v.value // 1000, v.value % 1000 // 10)}))"
)


def sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _run_split(argv: list[str], env: dict[str, str] | None = None, timeout: int = 3600) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``argv``; 127 and the reason when it cannot be run or does not finish."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return p.returncode, p.stdout, p.stderr


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: int = 3600) -> tuple[int, str]:
    rc, out, err = _run_split(argv, env, timeout)
    return rc, out + err


def _probe(code: str, *args: str, env: dict[str, str] | None = None, timeout: int = 600) -> tuple[dict | None, str]:
    """Run ``python -c code args`` and read the JSON object it prints last on stdout; (None, why) when it fails or
    prints none. Only stdout is parsed: torch warns on stderr as it imports (no numpy, an old driver)."""
    rc, out, err = _run_split([sys.executable, "-c", code, *args], env, timeout)
    lines = out.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if rc == 0 and lines else None
    except ValueError:
        value = None
    return (value, "") if isinstance(value, dict) else (None, (out + err).strip()[-500:])


def gpu_facts() -> dict[str, str]:
    facts = {"hostname": platform.node(), "kernel": platform.release(), "python": platform.python_version()}
    rc, out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout=60)
    if rc == 0 and out.strip():
        name, _, driver = out.strip().splitlines()[0].partition(",")
        facts.update({"gpu": name.strip(), "driver": driver.strip()})
    else:
        facts["gpu"] = "nvidia-smi not available"
    return facts


class Check:
    """One run of the tier; ``finish`` turns what it found into the result document."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.monotonic()
        self.reasons: list[str] = []
        self.counts: dict[str, int] = {}
        self.evidence: dict[str, str] = {}
        self.host = gpu_facts()
        self.digest = sha256(args.wheel)
        self.device_code: str | None = None
        self.env = dict(os.environ)
        if args.cuda_runtime:
            # The wheel's extension links libcudart.so.<its CUDA major>; the host's torch carries another
            # major's. The runtime the env pins (a PyPI wheel, unpacked here) is put on the loader's path.
            self.env["LD_LIBRARY_PATH"] = os.pathsep.join(
                p for p in (os.path.abspath(args.cuda_runtime), os.environ.get("LD_LIBRARY_PATH")) if p
            )

    def finish(self, verdict: str) -> dict:
        return {
            "schema": RESULT_SCHEMA,
            "tier": "artifact-gpu",
            "env": self.args.env,
            "input_hash": self.args.input_hash,
            "wheel": os.path.basename(self.args.wheel),
            "judged": {"wheel_sha256": self.digest, **({"device_code": self.device_code} if self.device_code else {})},
            "host": self.host,
            "verdict": verdict,
            "counts": self.counts,
            "reasons": self.reasons,
            "evidence": self.evidence,
            "duration_s": round(time.monotonic() - self.start, 1),
            "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        }

    def host_mismatch(self) -> tuple[str, str] | None:
        """(verdict, why) when this host cannot judge the wheel for the env; None when it can. A host
        whose torch does not import is an error; one with another torch, CUDA or no GPU is not-run."""
        facts, out = _probe(_TORCH_PROBE)
        if facts is None:
            return "error", f"torch is not importable on this host: {out}"
        why = self._other_torch(facts) or self._other_cuda()
        return ("not-run", why) if why else None

    def _other_torch(self, facts: dict) -> str | None:
        self.host.update({k: str(v) for k, v in facts.items()})
        torch_mm = ".".join(facts["torch"].split("+")[0].split(".")[:2])
        if self.args.torch_abi == "stable":
            # A stable-ABI wheel binds only to torch's C shim: any torch at or after its target serves.
            if _version(torch_mm) < _version(self.args.expect_torch):
                return (
                    f"host torch {facts['torch']} is older than the stable-ABI wheel's target {self.args.expect_torch}"
                )
            self.host["torch_abi"] = f"stable (wheel targets torch >= {self.args.expect_torch})"
        elif torch_mm != self.args.expect_torch:
            return f"host torch {facts['torch']} is not the env's torch {self.args.expect_torch}.x"
        if not facts.get("cuda_available"):
            return "torch sees no CUDA device on this host"
        return None

    def _other_cuda(self) -> str | None:
        """The CUDA runtime the extension will use must be the env's major: torch's own, or --cuda-runtime's."""
        want = str(self.args.expect_cuda)
        if not self.args.cuda_runtime:
            if (self.host.get("torch_cuda") or "").split(".")[0] != want:
                return f"host torch is built for CUDA {self.host.get('torch_cuda')}, the env for CUDA {want}"
            return None
        probe, out = _probe(_CUDART_PROBE, want, env=self.env, timeout=120)
        if probe is None:
            return f"no libcudart.so.{want} loads from --cuda-runtime {self.args.cuda_runtime}: {out[-300:]}"
        if probe["rc"] != 0 or probe["version"].split(".")[0] != want:
            return f"libcudart.so.{want} from {self.args.cuda_runtime} reports version {probe['version']} (rc {probe['rc']})"
        self.host["cuda_runtime"] = probe["version"]
        self.host["cuda_runtime_source"] = self.args.cuda_runtime_source or os.path.basename(
            os.path.abspath(self.args.cuda_runtime)
        )
        return None

    def extension_loaded(self, env: dict[str, str]) -> str | None:
        """Why the installed extension did not load as the env's (None when it did, on the expected runtime)."""
        probe, out = _probe(_EXTENSION_PROBE, env=env)
        if probe is None:
            return f"importing flash_kernels failed: {out}"
        if not probe["built"]:
            return f"the CUDA extension did not load ({probe['error']}): the suite would judge only Triton"
        want = f"libcudart.so.{self.args.expect_cuda}"
        loaded = [p for p in probe["cudart"] if os.path.basename(p).startswith(want)]
        if not loaded:
            return f"the extension loaded but no {want} is mapped (mapped: {probe['cudart']})"
        self.host["cuda_runtime_loaded"] = ", ".join(loaded)[:200]
        return None

    def run_suite(self, tmp: str) -> str:
        target = os.path.join(tmp, "site")
        pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", target, self.args.wheel]
        rc, out = _run(pip, timeout=600)
        if rc != 0:
            self.reasons.append(f"pip install --no-deps --target failed: {out.strip()[-800:]}")
            return "error"
        report = os.path.join(tmp, "junit.xml")
        env = dict(self.env, PYTHONPATH=target + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            self.device_code = device_code.of_installed(target, "flash_kernels").digest
        except (OSError, device_code.DeviceCodeError) as exc:
            self.reasons.append(f"the installed wheel's device code could not be read: {exc}")
            return "error"
        why = self.extension_loaded(env) if self.args.require_extension else None
        if why:
            self.reasons.append(why)
            return "error"
        # Run from the temp dir so a flash_kernels source checkout in the cwd cannot shadow the wheel.
        suite = [sys.executable, "-m", "flash_kernels.selftest", "--tier", "gpu", "--junitxml", report]
        try:
            p = subprocess.run(
                [*suite, *self.args.selftest_args],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.args.timeout,
            )
        except subprocess.TimeoutExpired:
            self.reasons.append(f"the suite did not finish in {self.args.timeout} s")
            return "error"
        if self.args.log:
            with outputs.writing(Path(self.args.log), flag="--log"):
                write_text_atomic(Path(self.args.log), p.stdout + p.stderr)
        where_code = "import flash_kernels, os; print(os.path.realpath(flash_kernels.__file__))"
        rc, where = _run([sys.executable, "-c", where_code], env=env)
        if rc != 0 or not where.strip().startswith(os.path.realpath(target)):
            self.reasons.append(f"flash_kernels was imported from {where.strip()!r}, not from the installed wheel")
            return "error"
        return self.judge_report(report, p.returncode, (p.stdout + p.stderr)[-800:])

    def judge_report(self, report: str, exit_code: int, tail: str) -> str:
        if not os.path.exists(report):
            self.reasons.append(f"the suite wrote no JUnit report (exit {exit_code}): {tail}")
            return "error"
        with open(report, encoding="utf-8", errors="replace") as f:
            xml_text = f.read()
        try:
            self.counts.update(junit_counts(xml_text))
            failures = junit_failures(xml_text)
        except JunitError as exc:
            self.reasons.append(f"the suite's JUnit report is unusable: {exc}")
            return "error"
        kept = junit_path(self.args.out)
        with outputs.writing(Path(kept), flag="--out"):
            write_text_atomic(Path(kept), xml_text)
        self.evidence = {"junit": os.path.basename(kept), "junit_sha256": sha256(kept)}
        verdict, why = suite_verdict(self.counts, exit_code)
        if verdict != "passed":
            self.reasons.extend(failures or [why or "", tail])
            return verdict
        c, h = self.counts, self.host
        self.reasons.append(
            f"{c['passed']} passed, {c['skipped']} skipped of {c['tests']} on {h.get('gpu', '?')} "
            f"(driver {h.get('driver', '?')}, torch {h.get('torch', '?')})"
        )
        return "passed"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".") if x.isdigit())


def check(args: argparse.Namespace) -> dict:
    c = Check(args)
    if c.digest != args.expect_sha256:
        c.reasons.append(f"wheel sha256 {c.digest} != expected {args.expect_sha256}: not the exported artifact")
        return c.finish("error")
    mismatch = c.host_mismatch()
    if mismatch:
        c.reasons.append(mismatch[1])
        return c.finish(mismatch[0])
    with tempfile.TemporaryDirectory(prefix="flashkit-artifact-") as tmp:
        return c.finish(c.run_suite(tmp))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("wheel")
    p.add_argument("--expect-sha256", required=True, help="sha256 the export recorded (hex)")
    p.add_argument("--env", required=True)
    p.add_argument("--input-hash", required=True)
    p.add_argument("--expect-torch", required=True, help="torch major.minor of the env, e.g. 2.11")
    p.add_argument("--expect-cuda", required=True, help="CUDA major of the env, e.g. 13")
    p.add_argument("--out", required=True, help="where to write the JSON result (the JUnit report goes beside it)")
    p.add_argument(
        "--torch-abi",
        choices=("version", "stable"),
        default="version",
        help="stable: the wheel binds to torch's stable C ABI, so any torch >= --expect-torch judges it",
    )
    p.add_argument(
        "--cuda-runtime",
        help="a folder holding libcudart.so.<--expect-cuda> for an extension whose CUDA major is not the host "
        "torch's (e.g. nvidia/cuda_runtime/lib of the env's pinned nvidia-cuda-runtime-cu12 wheel)",
    )
    p.add_argument("--cuda-runtime-source", help="what that folder came from, as the verdict should name it")
    p.add_argument(
        "--cuda-runtime-wheel",
        help="instead of --cuda-runtime: the env's pinned CUDA runtime wheel (nvidia-cuda-runtime-cu12), checked "
        "against --cuda-runtime-sha256 and unpacked here",
    )
    p.add_argument("--cuda-runtime-sha256", help="the sha256 the env's lockfile pins for --cuda-runtime-wheel")
    p.add_argument(
        "--require-extension",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="refuse to judge a wheel whose CUDA extension does not load (default: on)",
    )
    p.add_argument("--log", help="also keep the suite's full output here")
    p.add_argument("--timeout", type=int, default=3600)
    p.epilog = "Arguments after `--` go to `python -m flash_kernels.selftest` (e.g. -- -n 8 -q)."
    argv = list(sys.argv[1:] if argv is None else argv)
    # argparse cannot hand a positional list that follows options to a second positional, so the
    # selftest's arguments are split off at `--` before parsing.
    cut = argv.index("--") if "--" in argv else len(argv)
    try:
        args = p.parse_args(argv[:cut])
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_PASSED
    args.selftest_args = argv[cut + 1 :]
    if not 1 <= args.timeout <= MAX_TIMEOUT_S:
        print(
            f"artifact_check: --timeout {args.timeout}: give the suite's limit in seconds (1-{MAX_TIMEOUT_S})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    problem = _output_problem(args)
    if problem:  # before an hour of tests, not when the result is written
        print(f"artifact_check: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if not os.path.isfile(args.wheel):
        print(f"artifact_check: {args.wheel}: no such wheel file (copy the exported wheel here first)", file=sys.stderr)
        return EXIT_NO_WHEEL
    try:
        with tempfile.TemporaryDirectory(prefix="flashkit-cudart-") as unpacked:
            problem = runtime_from_wheel(args, unpacked) if args.cuda_runtime_wheel else None
            if problem:
                code, why = problem
                print(f"artifact_check: {why}", file=sys.stderr)
                return code
            result = check(args)
        return write_result(args, result)
    except FlashkitError as exc:  # an output that could not be written after all (no space, read-only)
        print(f"artifact_check: {exc}", file=sys.stderr)
        return EXIT_USAGE


def junit_path(out: str) -> str:
    """Where the suite's JUnit report is kept: beside the result, named after it."""
    return os.path.splitext(out)[0] + ".junit.xml"


def _output_problem(args: argparse.Namespace) -> str | None:
    """Why --out (the result and the report beside it) or --log cannot be written, or None: each is a path any
    output of flashkit's may take (:mod:`flashkit.core.outputs`: not in /proc, /dev or a git directory, ...),
    in a folder that exists and takes files."""
    for flag, path in (("--out", args.out), ("--out", junit_path(args.out)), ("--log", args.log)):
        if path is None:
            continue
        try:
            outputs.check_file(path, flag=flag)
        except FlashkitError as exc:
            return str(exc)
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            return f"{flag} {path}: is a folder; name the file to write"
        if not os.path.isdir(folder):
            return f"{flag} {path}: the folder {folder} does not exist; make it first"
        if not os.access(folder, os.W_OK):
            return f"{flag} {path}: the folder {folder} cannot be written"
    return None


def runtime_from_wheel(args: argparse.Namespace, dest: str) -> tuple[int, str] | None:
    """Unpack the pinned CUDA runtime wheel after checking its sha256; point --cuda-runtime at its library.
    (exit code, why) when it cannot: a usage error, or a wheel that is missing or not the pinned file."""
    if not args.cuda_runtime_sha256:
        return EXIT_USAGE, "--cuda-runtime-wheel needs --cuda-runtime-sha256 (the hash the env's lockfile pins)"
    if not os.path.isfile(args.cuda_runtime_wheel):
        return EXIT_NO_WHEEL, f"{args.cuda_runtime_wheel}: no such wheel file"
    got = sha256(args.cuda_runtime_wheel)
    if got != args.cuda_runtime_sha256:
        return EXIT_NO_WHEEL, f"{args.cuda_runtime_wheel}: sha256 {got} is not the pinned {args.cuda_runtime_sha256}"
    try:
        wheelzip.extract(args.cuda_runtime_wheel, args.cuda_runtime_wheel, dest)
    except wheelzip.WheelError as exc:
        return EXIT_NO_WHEEL, f"the pinned CUDA runtime wheel cannot be unpacked: {exc}"
    libs = [
        os.path.join(d, f)
        for d, _dirs, files in os.walk(dest)
        for f in files
        if f.startswith(f"libcudart.so.{args.expect_cuda}")
    ]
    if not libs:
        return EXIT_USAGE, f"{args.cuda_runtime_wheel} holds no libcudart.so.{args.expect_cuda}"
    args.cuda_runtime = os.path.dirname(sorted(libs)[0])
    name = os.path.basename(args.cuda_runtime_wheel).removesuffix(".whl").split("-")
    what = f"{name[0]}=={name[1]}" if len(name) > 1 else os.path.basename(args.cuda_runtime_wheel)
    args.cuda_runtime_source = f"{what} wheel, sha256 {got}"
    return None


def write_result(args: argparse.Namespace, result: dict) -> int:
    with outputs.writing(Path(args.out), flag="--out"):
        write_text_atomic(Path(args.out), json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"artifact-gpu {result['verdict']}: " + "; ".join(result["reasons"]))
    return EXIT_PASSED if result["verdict"] == "passed" else EXIT_NOT_VERIFIED


if __name__ == "__main__":
    sys.exit(main())
