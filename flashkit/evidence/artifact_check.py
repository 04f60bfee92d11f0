"""The artifact-gpu tier: check an exported flash_kernels wheel on a GPU host, no docker, no network.

Runs with the standard library only, so it needs neither flashkit installed
nor its dependencies: copy this file and the wheel to the GPU host and run

    python3 artifact_check.py WHEEL --expect-sha256 HEX --env cu130-torch211 \
        --input-hash H --expect-torch 2.11 --expect-cuda 13 --out result.json

It verifies the wheel's sha256, installs it with ``pip install --no-deps
--target`` into a fresh directory (the host's own torch stays in charge),
checks that torch major.minor and its CUDA major match the env, runs the kernel
suite's GPU tier against that directory and writes a JSON result, which
``flashkit verify import-artifact-result ENV result.json`` adds to the
verification record. Exit 0 only when the verdict is "passed".
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
import xml.etree.ElementTree as ET

RESULT_SCHEMA = 1


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: int = 3600) -> tuple[int, str]:
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def gpu_facts() -> dict[str, str]:
    facts = {"hostname": platform.node(), "kernel": platform.release(), "python": platform.python_version()}
    try:
        rc, out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout=60)
        if rc == 0 and out.strip():
            name, _, driver = out.strip().splitlines()[0].partition(",")
            facts.update({"gpu": name.strip(), "driver": driver.strip()})
    except (OSError, subprocess.SubprocessError):
        facts["gpu"] = "nvidia-smi not available"
    return facts


_TORCH_PROBE = (
    "import json, torch; print(json.dumps({'torch': torch.__version__, 'torch_cuda': torch.version.cuda, "
    "'cuda_available': torch.cuda.is_available(), "
    "'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))"
)


def junit_counts(xml_text: str) -> dict[str, int]:
    root = ET.fromstring(xml_text)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tot = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    for s in suites:
        tot["tests"] += int(s.get("tests", 0))
        tot["failed"] += int(s.get("failures", 0))
        tot["errors"] += int(s.get("errors", 0))
        tot["skipped"] += int(s.get("skipped", 0))
    tot["passed"] = tot["tests"] - tot["failed"] - tot["errors"] - tot["skipped"]
    return tot


def junit_failures(xml_text: str, limit: int = 10) -> list[str]:
    """The first line of each failure or error, named by test."""
    out = []
    for case in ET.fromstring(xml_text).iter("testcase"):
        for kind in ("failure", "error"):
            el = case.find(kind)
            if el is not None:
                msg = (el.get("message") or el.text or "").strip().splitlines()
                first = msg[0][:300] if msg else ""
                out.append(f"{kind}: {case.get('classname')}.{case.get('name')}: {first}")
    return out[:limit]


def check(args: argparse.Namespace) -> dict:
    start = time.monotonic()
    reasons: list[str] = []
    counts: dict[str, int] = {}
    host = gpu_facts()
    if not os.path.isfile(args.wheel):
        raise SystemExit(f"artifact_check: {args.wheel}: no such wheel file (copy the exported wheel here first)")
    digest = sha256(args.wheel)
    result = {
        "schema": RESULT_SCHEMA,
        "tier": "artifact-gpu",
        "env": args.env,
        "input_hash": args.input_hash,
        "wheel": os.path.basename(args.wheel),
        "judged": {"wheel_sha256": digest},
        "host": host,
    }

    def finish(verdict: str) -> dict:
        result.update(
            verdict=verdict,
            counts=counts,
            reasons=reasons,
            duration_s=round(time.monotonic() - start, 1),
            date=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        )
        return result

    if args.expect_sha256 and digest != args.expect_sha256:
        reasons.append(f"wheel sha256 {digest} != expected {args.expect_sha256}: not the exported artifact")
        return finish("error")
    rc, out = _run([sys.executable, "-c", _TORCH_PROBE], timeout=600)
    if rc != 0:
        reasons.append(f"torch is not importable on this host: {out.strip()[-500:]}")
        return finish("error")
    facts = json.loads(out.strip().splitlines()[-1])
    host.update({k: str(v) for k, v in facts.items()})
    torch_mm = ".".join(facts["torch"].split("+")[0].split(".")[:2])
    if args.expect_torch and torch_mm != args.expect_torch:
        reasons.append(f"host torch {facts['torch']} is not the env's torch {args.expect_torch}.x")
        return finish("not-run")
    cuda_major = (facts.get("torch_cuda") or "").split(".")[0]
    if args.expect_cuda and cuda_major != str(args.expect_cuda):
        reasons.append(f"host torch is built for CUDA {facts.get('torch_cuda')}, the env for CUDA {args.expect_cuda}")
        return finish("not-run")
    if not facts.get("cuda_available"):
        reasons.append("torch sees no CUDA device on this host")
        return finish("not-run")
    with tempfile.TemporaryDirectory(prefix="flashkit-artifact-") as tmp:
        target = os.path.join(tmp, "site")
        rc, out = _run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", target, args.wheel],
            timeout=600,
        )
        if rc != 0:
            reasons.append(f"pip install --no-deps --target failed: {out.strip()[-800:]}")
            return finish("error")
        report = os.path.join(tmp, "junit.xml")
        env = dict(os.environ, PYTHONPATH=target + os.pathsep + os.environ.get("PYTHONPATH", ""))
        # Run from the temp dir so a flash_kernels source checkout in the cwd cannot shadow the wheel.
        suite = [
            sys.executable,
            "-m",
            "flash_kernels.selftest",
            "--tier",
            "gpu",
            "--junitxml",
            report,
            *args.selftest_args,
        ]
        p = subprocess.run(suite, cwd=tmp, env=env, capture_output=True, text=True, timeout=args.timeout)
        log = p.stdout + p.stderr
        if args.log:
            with open(args.log, "w") as f:
                f.write(log)
        if not os.path.exists(report):
            reasons.append(f"the suite wrote no JUnit report (exit {p.returncode}): {log[-800:]}")
            return finish("error")
        with open(report) as f:
            xml_text = f.read()
        counts.update(junit_counts(xml_text))
        # Prove the suite used the installed wheel, not some other copy on the path.
        where_code = "import flash_kernels, os; print(os.path.realpath(flash_kernels.__file__))"
        rc, where = _run([sys.executable, "-c", where_code], env=env)
        if rc != 0 or not where.strip().startswith(os.path.realpath(target)):
            reasons.append(f"flash_kernels was imported from {where.strip()!r}, not from the installed wheel")
            return finish("error")
        reasons.extend(junit_failures(xml_text))
        if counts["failed"] or counts["errors"] or p.returncode != 0:
            if not reasons:
                reasons.append(f"the suite exited {p.returncode}: {log[-800:]}")
            return finish("failed")
        if counts["passed"] == 0:
            reasons.append(f"no test passed ({counts['skipped']} skipped): nothing was verified")
            return finish("failed")
        reasons.append(
            f"{counts['passed']} passed, {counts['skipped']} skipped of {counts['tests']} on "
            f"{host.get('gpu', '?')} (driver {host.get('driver', '?')}, torch {facts['torch']})"
        )
        return finish("passed")


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
    p.add_argument("--out", required=True, help="where to write the JSON result")
    p.add_argument("--log", help="also keep the suite's full output here")
    p.add_argument("--timeout", type=int, default=3600)
    p.epilog = "Arguments after `--` go to `python -m flash_kernels.selftest` (e.g. -- -n 8 -q)."
    argv = list(sys.argv[1:] if argv is None else argv)
    # argparse cannot hand a positional list that follows options to a second positional, so the
    # selftest's arguments are split off at `--` before parsing.
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    args.selftest_args = argv[cut + 1 :]
    result = check(args)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, args.out)
    print(f"artifact-gpu {result['verdict']}: " + "; ".join(result["reasons"]))
    return 0 if result["verdict"] == "passed" else 1


if __name__ == "__main__":
    sys.exit(main())
