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
2 usage error; 3 the wheel file is missing.
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

from flashkit.evidence.junit import JunitError, junit_counts, junit_failures, suite_verdict

RESULT_SCHEMA = 2
EXIT_PASSED, EXIT_USAGE, EXIT_NO_WHEEL, EXIT_NOT_VERIFIED = 0, 2, 3, 16

_TORCH_PROBE = (
    "import json, torch; ok = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
    "'torch_cuda': torch.version.cuda, 'cuda_available': ok, "
    "'device': torch.cuda.get_device_name(0) if ok else None, "
    "'capability': '%d.%d' % torch.cuda.get_device_capability(0) if ok else None}))"
)


def sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: int = 3600) -> tuple[int, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return p.returncode, p.stdout + p.stderr


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

    def finish(self, verdict: str) -> dict:
        return {
            "schema": RESULT_SCHEMA,
            "tier": "artifact-gpu",
            "env": self.args.env,
            "input_hash": self.args.input_hash,
            "wheel": os.path.basename(self.args.wheel),
            "judged": {"wheel_sha256": self.digest},
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
        rc, out = _run([sys.executable, "-c", _TORCH_PROBE], timeout=600)
        if rc != 0:
            return "error", f"torch is not importable on this host: {out.strip()[-500:]}"
        why = self._other_torch(json.loads(out.strip().splitlines()[-1]))
        return ("not-run", why) if why else None

    def _other_torch(self, facts: dict) -> str | None:
        self.host.update({k: str(v) for k, v in facts.items()})
        torch_mm = ".".join(facts["torch"].split("+")[0].split(".")[:2])
        if torch_mm != self.args.expect_torch:
            return f"host torch {facts['torch']} is not the env's torch {self.args.expect_torch}.x"
        if (facts.get("torch_cuda") or "").split(".")[0] != str(self.args.expect_cuda):
            return f"host torch is built for CUDA {facts.get('torch_cuda')}, the env for CUDA {self.args.expect_cuda}"
        if not facts.get("cuda_available"):
            return "torch sees no CUDA device on this host"
        return None

    def run_suite(self, tmp: str) -> str:
        target = os.path.join(tmp, "site")
        pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", target, self.args.wheel]
        rc, out = _run(pip, timeout=600)
        if rc != 0:
            self.reasons.append(f"pip install --no-deps --target failed: {out.strip()[-800:]}")
            return "error"
        report = os.path.join(tmp, "junit.xml")
        env = dict(os.environ, PYTHONPATH=target + os.pathsep + os.environ.get("PYTHONPATH", ""))
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
            with open(self.args.log, "w") as f:
                f.write(p.stdout + p.stderr)
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
        kept = os.path.splitext(self.args.out)[0] + ".junit.xml"
        with open(kept + ".tmp", "w", encoding="utf-8") as f:
            f.write(xml_text)
        os.replace(kept + ".tmp", kept)
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
    if not os.path.isfile(args.wheel):
        print(f"artifact_check: {args.wheel}: no such wheel file (copy the exported wheel here first)", file=sys.stderr)
        return EXIT_NO_WHEEL
    result = check(args)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, args.out)
    print(f"artifact-gpu {result['verdict']}: " + "; ".join(result["reasons"]))
    return EXIT_PASSED if result["verdict"] == "passed" else EXIT_NOT_VERIFIED


if __name__ == "__main__":
    sys.exit(main())
