"""Tier commands: `test` (build an env, then run its tiers) and `verify` (run the tiers on its build, or
import a GPU host's artifact-gpu result); each verdict is appended to the env's ledger."""

from __future__ import annotations

from pathlib import Path

from flashkit.cli.common import add_install_engine_option, plans, root
from flashkit.cli.image_cmd import add_site_options, build_options
from flashkit.core import paths
from flashkit.core.errors import NotVerified, UsageError
from flashkit.core.names import REQUIRED_ON_BUILD_HOST, Tier
from flashkit.images.build import build_plan, human_size
from flashkit.images.engine import ensure_engine
from flashkit.ledger import gpu_import, record, store, tier_runner
from flashkit.plan.specfile import load_env


def _tiers(text: str) -> tuple[Tier, ...]:
    try:
        tiers = Tier.parse_list(text)
    except ValueError as exc:
        raise UsageError(f"--tiers: {exc}") from None
    if not tiers:
        raise UsageError(f"--tiers {text!r}: name at least one tier, e.g. --tiers build,abi,cpu")
    if Tier.ARTIFACT_GPU in tiers:
        raise UsageError(
            "--tiers: artifact-gpu runs on a GPU host (python -m flashkit.evidence.artifact_check); import its result"
        )
    return tiers


def _report(root_dir: Path, env: str, outcomes, judged) -> None:
    print(tier_runner.summary(outcomes, judged))
    print(f"ledger: {paths.rel(root_dir, store.ledger_path(root_dir, env))}")


def cmd_test(args) -> int:
    r = root(args)
    tiers = _tiers(args.tiers)
    (plan,) = plans(r, args, accepted=True)
    options = build_options(args, rebuild=args.rebuild)  # site inputs are checked before any engine is started
    engine = ensure_engine(install=args.install_engine)
    res = build_plan(r, plan, engine, options)
    how = f"built in {res.seconds:.0f}s" if res.built else "image up to date"
    print(
        f"{res.env} @ {res.input_hash}: {how}; runtime {human_size(res.runtime_size)}, "
        f"builder {human_size(res.builder_size)}; wheel {res.wheel_sha256[:16]}"
    )
    _artifact, outcomes, judged = tier_runner.run_and_record(r, plan, res, tiers, engine)
    _report(r, res.env, outcomes, judged)
    tier_runner.require(outcomes, tuple(t for t in tiers if t in REQUIRED_ON_BUILD_HOST))
    return 0


def cmd_import(args) -> int:
    if len(args.extra) != 2:
        raise UsageError("usage: flashkit verify import-artifact-result ENV RESULT.json [--junit REPORT.xml]")
    r = root(args)
    spec = load_env(r, args.extra[0])
    fact = gpu_import.import_result(r, spec, Path(args.extra[1]), Path(args.junit) if args.junit else None)
    print(
        f"{spec.id}: artifact-gpu {fact.verdict} for wheel {fact.subject.digest} recorded in "
        f"{paths.rel(r, store.ledger_path(r, str(spec.id)))} (verdict {fact.id[7:19]})"
    )
    counts = ", ".join(f"{k} {v}" for k, v in sorted(fact.counts.items()))
    print(f"  counts recomputed from the JUnit report: {counts or 'none (the tier did not run)'}")
    for reason in fact.reasons[:8]:
        print(f"  {reason}")
    for applies in record.applied_elsewhere(r, fact):
        print(
            f"  applies to {applies.env} too (build {applies.artifact_id[7:19]}): its image installs this very "
            f"wheel (wheel_from); recorded in {paths.rel(r, store.ledger_path(r, applies.env))}"
        )
    return 0 if fact.passed else NotVerified.exit_code


def cmd_verify(args) -> int:
    if args.env == "import-artifact-result":
        return cmd_import(args)
    if args.extra:
        raise UsageError(f"unexpected arguments {' '.join(args.extra)}")
    r = root(args)
    tiers = _tiers(args.tiers)
    (plan,) = plans(r, args)
    res = tier_runner.cached_build(r, plan)
    _artifact, outcomes, judged = tier_runner.run_and_record(r, plan, res, tiers, ensure_engine())
    print(f"{plan.env_id} @ {res.input_hash} (image {res.runtime_id[:19]}, wheel {res.wheel_sha256[:12]})")
    _report(r, plan.env_id, outcomes, judged)
    tier_runner.require(outcomes, tuple(t for t in tiers if t in REQUIRED_ON_BUILD_HOST))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "test", help="build an env (if its inputs changed), run its tiers, append the verdicts to its ledger"
    )
    p.add_argument("env", help="env id, e.g. cu124-torch27")
    p.add_argument("--rebuild", action="store_true", help="build even when the input hash is unchanged")
    p.add_argument("--tiers", default="build,abi,cpu,gpu", help="comma-separated tiers (default: build,abi,cpu,gpu)")
    p.add_argument("--quiet", action="store_true", help="show only build step headers")
    add_site_options(p)
    add_install_engine_option(p)
    p.set_defaults(run=cmd_test)

    p = sub.add_parser(
        "verify", help="run tiers on a built env, or import a GPU result (import-artifact-result ENV RESULT.json)"
    )
    p.add_argument("env", help="env id; or `import-artifact-result ENV RESULT.json`")
    p.add_argument("extra", nargs="*", help="ENV RESULT.json after import-artifact-result")
    p.add_argument("--tiers", default="build,abi,cpu,gpu", help="comma-separated tiers (default: build,abi,cpu,gpu)")
    p.add_argument("--junit", help="the result's JUnit report, when it is not beside the result")
    p.set_defaults(run=cmd_verify)
