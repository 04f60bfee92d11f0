"""`flashkit verify`: run verification tiers on a built env, or import an artifact-gpu result.

The tiers judge the artifact named by the build result for the env's current
input hash; their verdicts go into ``verified/<env>.json`` under that hash.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flashkit.core import paths
from flashkit.ledger import record
from flashkit.images.build import BuildResult, load_result
from flashkit.images.engine import Engine, ensure_engine
from flashkit.core.errors import NotVerified, RecordError, TierError
from flashkit.ledger.record import TierResult

# What `flashkit test` requires to exit 0 on a host without a GPU; the record
# still shows gpu as not-run, and publishing applies its own (stricter) policy.
REQUIRED_HERE = ("build", "abi", "cpu")


def artifact_of(res: BuildResult) -> dict[str, object]:
    """The identity a record entry judges: no host paths, only ids and digests."""
    return {
        "image_ref": res.runtime_ref,
        "image_id": res.runtime_id,
        "builder_id": res.builder_id,
        "wheel": Path(res.wheel_path).name,
        "wheel_sha256": res.wheel_sha256,
        "lock_sha256": res.lock_sha256,
        "base_image_id": res.base_image_id,
        "runtime_size": res.runtime_size,
        "builder_size": res.builder_size,
        "build_context": {k: v for k, v in res.context.items() if k != "ca_secret"}
        | {"ca_secret_used": bool(res.context.get("ca_secret"))},
    }


def current_build(root: Path, env_id: str) -> tuple[object, str, BuildResult]:
    from flashkit.plan.inputhash import input_hash
    from flashkit.plan.spec import load_env

    spec = load_env(root, env_id)
    h = input_hash(root, spec)
    res = load_result(root, str(spec.id), h)
    if res is None:
        raise TierError(f"{spec.id} has no build for input hash {h}", hint=f"run `flashkit build {spec.id}`")
    return spec, h, res


def verify(
    root: Path, spec, res: BuildResult, tiers: tuple[str, ...], engine: Engine, stream: bool = False
) -> list[TierResult]:
    from flashkit.images.tiers import run_tiers

    results = run_tiers(engine, spec, res, tiers, on_output=sys.stderr.write if stream else None)
    record.upsert_entry(record.record_path(str(spec.id), root), res.input_hash, artifact_of(res), results)
    return results


def summary(results: list[TierResult]) -> str:
    lines = []
    for t in results:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(t.counts.items()))
        lines.append(f"  {t.tier:<13} {t.verdict:<8} {t.duration_s:6.1f}s  {counts}")
        for r in t.reasons[:8]:
            lines.append(f"      {r}")
    return "\n".join(lines)


def exit_for(results: list[TierResult], required: tuple[str, ...]) -> int:
    bad = [t for t in results if t.tier in required and t.verdict != "passed"]
    if bad:
        raise NotVerified(
            "not verified: " + "; ".join(f"{t.tier} {t.verdict}" for t in bad),
            hint="see the reasons above and the record under verified/",
        )
    return 0


def import_artifact_result(root: Path, env_id: str, result_file: Path) -> TierResult:
    try:
        data = json.loads(result_file.read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(f"cannot read {result_file}: {exc}") from exc
    if data.get("tier") != "artifact-gpu" or data.get("env") != env_id:
        raise RecordError(
            f"{result_file} is a {data.get('tier')} result for env {data.get('env')!r}, not artifact-gpu for {env_id}"
        )
    result = TierResult(
        tier="artifact-gpu",
        verdict=data["verdict"],
        counts=data.get("counts", {}),
        reasons=tuple(data.get("reasons", ())),
        duration_s=data.get("duration_s", 0.0),
        judged=data["judged"],
        host=data.get("host", {}),
        date=data.get("date", ""),
    )
    record.add_tier_result(record.record_path(env_id, root), data["input_hash"], result)
    return result


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("verify", help="run verification tiers on a built env, or import a GPU result")
    p.add_argument("env", help="env id; or `import-artifact-result ENV RESULT.json`")
    p.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--tiers", default="build,abi,cpu,gpu", help="comma-separated tiers (default: all four)")
    p.add_argument("--stream", action="store_true", help="show the kernel suite's output live")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    root = paths.root_of(args)
    if args.env == "import-artifact-result":
        if len(args.extra) != 2:
            raise TierError("usage: flashkit verify import-artifact-result ENV RESULT.json")
        t = import_artifact_result(root, args.extra[0], Path(args.extra[1]))
        where = record.record_path(args.extra[0], root)
        print(f"{args.extra[0]}: artifact-gpu {t.verdict} recorded in {where}")
        print(summary([t]))
        return 0 if t.verdict == "passed" else NotVerified.exit_code
    spec, _h, res = current_build(root, args.env)
    tiers = tuple(t.strip() for t in args.tiers.split(",") if t.strip())
    results = verify(root, spec, res, tiers, ensure_engine(), stream=args.stream)
    print(f"{spec.id} @ {res.input_hash} (image {res.runtime_id[:19]}, wheel {res.wheel_sha256[:12]})")
    print(summary(results))
    return exit_for(results, tuple(t for t in tiers if t in REQUIRED_HERE))
