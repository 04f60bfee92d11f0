"""The matrix: every env with its rule verdict, base pinning, lock state, the Pythons its production
requirements cover, and what the hosts can do.

Pure rows (MatrixRow) built from specs and plans; the verification status is passed in (the CLI reads
it from the ledger), so this module never reads a record. Printing is in flashkit.cli.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.utils import parse_wheel_filename

from flashkit.plan import hosts, production, rules
from flashkit.plan.plan import Plan
from flashkit.plan.spec import EnvSpec


@dataclass(frozen=True)
class LedgerView:
    """What the ledger says at the current input hash (the CLI reads it: this module never reads a ledger)."""

    tiers: dict[str, str] = field(default_factory=dict)
    wheel: str | None = None
    published: tuple[str, ...] = ()
    device_code: str | None = None  # the latest build's wheel's device-code digest, when recorded
    gpu_how: str | None = None  # how its GPU judgement reaches it (own, applies, via device code ...)
    verified: bool = False  # the latest build there passes the default publish policy (the gate)


@dataclass(frozen=True)
class MatrixRow:
    env: str
    torch: str
    accelerator: str
    python: str
    abi: str
    compiler: str
    base: str
    pinned: bool
    pin_state: str  # pinned | local | unpinned
    verdict: str  # "accepted" | "rejected"
    reasons: tuple[str, ...]  # rejection texts (empty when accepted)
    rules: tuple[tuple[str, bool, str], ...]  # (rule id, accepted?, why) for every rule
    lock: str  # "ok" | "missing" | "stale" ...
    pythons: str  # the Pythons the production requirements cover, and those they do not
    requirements: dict  # production.Coverage.to_json(): covered, not_covered (with why), files
    input_hash: str | None
    hosts: str
    hosts_why: str
    status: str
    tiers: dict  # tier -> the latest build's verdict at the current input hash (absent: none)
    wheel: str | None  # that build's wheel file name
    wheel_local: str | None  # its local version: cu130torch2.11cxx11abitrue
    published: tuple[str, ...]  # tags published at the current input hash
    gpu_evidence: tuple[str, ...]  # which GPU evidence the env's gate accepts (spec gpu_evidence)
    device_code: str | None  # the device-code digest of that build's wheel, when recorded
    gpu_how: str | None  # how the GPU verdict reaches that build
    error: str | None = None  # verdict "invalid": why its spec could not be read (every other field empty)
    verified: bool = False  # the gate passes its latest build at the current input hash (default policy)

    def to_json(self) -> dict:
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}
        out["rules"] = [{"rule": r, "accepted": ok, "why": why} for r, ok, why in self.rules]
        return out


def lock_state(plan: Plan | None, production_problems: tuple[str, ...] = ()) -> str:
    if plan is None:
        return "missing"
    n = len(plan.lock_problems) + len(production_problems)
    return "ok" if not n else f"stale/inconsistent ({n} problems)"


def local_version(wheel: str | None) -> str | None:
    if not wheel:
        return None
    try:
        return parse_wheel_filename(wheel)[1].local
    except ValueError:  # not a wheel name flashkit wrote; show nothing rather than guess
        return None


def row(
    spec: EnvSpec,
    plan: Plan | None,
    status: str,
    cov: production.Coverage,
    production_problems: tuple[str, ...] = (),
    ledger: LedgerView | None = None,
) -> MatrixRow:
    """One env's row. ``plan`` is None when its inputs could not be read (a lockfile is missing);
    ``status`` is the ledger's verification status at the plan's input hash; ``cov`` the Pythons its
    production requirements cover and ``production_problems`` why those files are inconsistent;
    ``ledger`` the latest build's tier verdicts, wheel and published tags there."""
    seen = ledger or LedgerView()
    verdicts = rules.check(spec)
    rejected = [v for v in verdicts if isinstance(v, rules.Rejected)]
    support = hosts.support(spec)
    compiler = spec.compiler.source + (f" {spec.compiler.version}" if spec.compiler.version else "")
    return MatrixRow(
        env=str(spec.id),
        torch=spec.torch,
        accelerator=str(spec.accelerator),
        python=spec.python,
        abi="cxx11" if spec.cxx11_abi else "pre-cxx11",
        compiler=compiler,
        base=f"{spec.base.flavor}: {spec.base.ref}",
        pinned=spec.base.pinned,
        pin_state=spec.base.pin_state,
        verdict="rejected" if rejected else "accepted",
        reasons=tuple(f"{v.rule.id}: {v.reason} (fix: {v.fix})" for v in rejected),
        rules=tuple((v.rule.id, v.ok, v.note if isinstance(v, rules.Accepted) else v.reason) for v in verdicts),
        lock=lock_state(plan, production_problems),
        pythons=cov.summary(),
        requirements=cov.to_json(),
        input_hash=plan.input_hash if plan else None,
        hosts=support.summary(),
        hosts_why="; ".join(support.why),
        status=status,
        tiers=dict(seen.tiers),
        wheel=seen.wheel,
        wheel_local=local_version(seen.wheel),
        published=tuple(seen.published),
        gpu_evidence=tuple(spec.gpu_evidence),
        device_code=seen.device_code,
        gpu_how=seen.gpu_how,
        verified=seen.verified,
    )


def invalid_row(env: str, error: str) -> MatrixRow:
    """The row of a spec that does not validate: its name and the error, so the table still lists it."""
    return MatrixRow(
        env=env,
        torch="?",
        accelerator="?",
        python="?",
        abi="?",
        compiler="?",
        base="?",
        pinned=False,
        pin_state="unpinned",
        verdict="invalid",
        reasons=(),
        rules=(),
        lock="?",
        pythons="?",
        requirements={"covered": [], "not_covered": {}, "file": None, "per_python": {}},
        input_hash=None,
        hosts="?",
        hosts_why="",
        status=f"spec invalid: {error.splitlines()[0]}",
        tiers={},
        wheel=None,
        wheel_local=None,
        published=(),
        gpu_evidence=(),
        device_code=None,
        gpu_how=None,
        error=error,
    )
