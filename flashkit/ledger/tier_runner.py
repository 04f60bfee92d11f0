"""Running the verification tiers on a build and recording what they found (the tiers themselves are
defined in :mod:`flashkit.verify.tiers`; this module sits in the ledger because it records).

:func:`run_and_record` appends the build's ``artifact`` to the ledger (once per distinct build), runs the
image tiers on it and appends one ``verdict`` per tier. What the ledger then says about each tier for
this very artifact, including verdicts that apply because a digest is bit-identical to one judged
earlier, is returned as judgements for the command line to show.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from flashkit.core.errors import NotVerified, TierError
from flashkit.core.names import Tier, Verdict
from flashkit.images.build import BuildResult, load_result
from flashkit.images.engine import Engine
from flashkit.ledger.device_code import record_for_build
from flashkit.ledger.gate import Judgement, judgements
from flashkit.ledger.model import Artifact
from flashkit.ledger.record import record_build, record_outcomes
from flashkit.plan.plan import Plan
from flashkit.verify.tiers import TierOutcome, run_tiers


def cached_build(root: Path, plan: Plan) -> BuildResult:
    res = load_result(root, plan.env_id, plan.input_hash)
    if res is None:
        raise TierError(
            f"{plan.env_id} has no build for input hash {plan.input_hash}", hint=f"run `flashkit build {plan.env_id}`"
        )
    return res


def run_and_record(
    root: Path,
    plan: Plan,
    res: BuildResult,
    tiers: tuple[Tier, ...],
    engine: Engine,
    on_output: Callable[[str], None] | None = None,
) -> tuple[Artifact, list[TierOutcome], dict[Tier, Judgement]]:
    _ledger, artifact, _added = record_build(root, res)
    record_for_build(root, plan.spec, artifact, Path(res.wheel_path))
    outcomes = run_tiers(engine, plan.spec, res, tiers, on_output=on_output)
    ledger, _added = record_outcomes(root, artifact, outcomes)
    return artifact, outcomes, judgements(ledger, artifact)


def summary(outcomes: list[TierOutcome], judged: dict[Tier, Judgement]) -> str:
    """What ran now, then what the ledger says about every tier of this artifact."""
    lines = ["ran now:"]
    for t in outcomes:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(t.counts.items()))
        lines.append(f"  {t.tier:<13} {t.verdict:<8} {t.duration_s:6.1f}s  {counts}")
        lines += [f"      {r}" for r in t.reasons[:8]]
    lines.append("the ledger, for this build:")
    lines += [f"  {j.line()}" for j in judged.values()]
    return "\n".join(lines)


def require(outcomes: list[TierOutcome], required: tuple[Tier, ...]) -> None:
    bad = [t for t in outcomes if t.tier in required and t.verdict is not Verdict.PASSED]
    if bad:
        raise NotVerified(
            "not verified: " + "; ".join(f"{t.tier} {t.verdict}" for t in bad),
            hint="see the reasons above and the ledger under verified/",
        )
