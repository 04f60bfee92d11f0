"""The matrix: every env with its rule verdict, base pinning, lock state and what the hosts can do.

Pure rows (MatrixRow) built from specs and lockfile texts; printing is in flashkit.cli.main.
Verification status comes from flashkit.ledger.record when that module provides `status(repo_root, env_id,
input_hash)`; until then the column says "not verified" (never "passed").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from flashkit.plan import inputhash
from flashkit.plan import lock
from flashkit.plan import rules
from flashkit.core.errors import FlashkitError
from flashkit.plan.spec import EnvSpec


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
    input_hash: str | None
    hosts: str
    hosts_why: str
    status: str

    def to_json(self) -> dict:
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}
        out["rules"] = [{"rule": r, "accepted": ok, "why": why} for r, ok, why in self.rules]
        return out


def _status_provider():
    try:
        record = importlib.import_module("flashkit.ledger.record")
    except ImportError:
        return None
    return getattr(record, "status", None)


def row(repo_root: Path, spec: EnvSpec, status_of=None) -> MatrixRow:
    verdicts = rules.check(spec)
    rejected = [v for v in verdicts if isinstance(v, rules.Rejected)]
    try:
        texts = lock.read(repo_root, spec)
        problems = lock.check(spec, texts.runtime, texts.build)
        lock_state = "ok" if not problems else f"stale/inconsistent ({len(problems)} problems)"
    except FlashkitError:
        texts, lock_state = None, "missing"
    h = None
    if texts is not None:
        try:
            h = inputhash.input_hash(repo_root, spec)
        except FlashkitError:
            h = None
    status = "not verified"
    if status_of is not None and h is not None:
        try:
            status = str(status_of(repo_root, str(spec.id), h))
        except Exception as exc:  # a broken record must not hide the matrix; say so instead
            status = f"unknown (record unreadable: {exc})"
    support = spec.host_support
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
        lock=lock_state,
        input_hash=h,
        hosts=support.summary(),
        hosts_why="; ".join(support.why),
        status=status,
    )


def rows(repo_root: Path, specs: list[EnvSpec]) -> list[MatrixRow]:
    provider = _status_provider()
    return [row(repo_root, s, provider) for s in specs]
