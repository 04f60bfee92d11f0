"""The matrix as the page shows it: each env's tiers as badges, and the fact behind each badge.

A badge is one tier of an env's latest build at its current input hash, judged by the gate exactly as
`flashkit matrix` and `flashkit publish` judge it (:func:`flashkit.ledger.gate.judgements`): passed, failed,
error, not run, no verdict, or passed through a relation (a wheel another env built, or identical device
code), named. Its evidence entry holds what a reader needs to check it: the verdict's fact id, the digest it
judged, its counts, where it ran, the date, how it reaches this build, and the attestation of any
publication at this input hash.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flashkit.core.errors import FlashkitError, LockError
from flashkit.core.names import TIER_ORDER, Subject
from flashkit.ledger import gate, store
from flashkit.ledger.model import RELATION_DEVICE_CODE, RELATION_SAME_WHEEL, Artifact, where_it_ran
from flashkit.plan.plan import plan_of
from flashkit.plan.specfile import load_each


@dataclasses.dataclass(frozen=True)
class Badge:
    env: str
    tier: str
    state: str  # passed | failed | error | not-run | none (no verdict)
    relation: str  # "" for the env's own digest; else how the verdict reaches it, with the env named
    anchor: str  # the id of its evidence entry
    facts: tuple[tuple[str, str], ...]  # (label, value) rows of its evidence entry

    @property
    def state_text(self) -> str:
        return "no verdict" if self.state == "none" else self.state

    @property
    def via(self) -> str:
        """The relation in a few words, for the badge (the evidence entry says it whole)."""
        if self.relation.startswith("same device code as "):
            return "code of " + self.relation.removeprefix("same device code as ")
        if self.relation.startswith("wheel built by "):
            return "wheel of " + self.relation.removeprefix("wheel built by ")
        return "same wheel" if self.relation else ""

    @property
    def text(self) -> str:
        shown = "no verdict" if self.state == "none" else self.state
        return f"{shown} ({self.relation})" if self.relation else shown


@dataclasses.dataclass(frozen=True)
class Row:
    env: str
    torch: str
    accelerator: str
    python: str
    abi: str
    input_hash: str
    badges: tuple[Badge, ...]
    notes: tuple[str, ...] = ()  # why a row has no badges (a spec that does not validate, an unreadable ledger)
    publications: tuple[tuple[tuple[str, str], ...], ...] = ()  # each publication's (label, value) rows


def _relation(j: gate.Judgement) -> str:
    if j.verdict is None:
        return ""
    if j.relation == RELATION_DEVICE_CODE:
        return f"same device code as {j.source_env}"
    if j.relation == RELATION_SAME_WHEEL:
        return f"same wheel, judged at {j.verdict.input_hash[:12]}"
    if j.source_env:
        return f"wheel built by {j.source_env}"
    return "applies: a bit-identical wheel" if j.how.startswith("applies") else ""


def _badge(env: str, j: gate.Judgement) -> Badge:
    anchor = f"{env}-{j.tier.value}"
    v = j.verdict
    if v is None:
        return Badge(env, j.tier.value, "none", "", anchor, (("verdict", "none"), ("why", j.how)))
    counts = ", ".join(f"{k} {n}" for k, n in sorted(v.counts.items()))
    rows = [
        ("verdict", str(v.verdict)),
        ("fact", v.id),
        (f"judged ({v.subject.kind.value})", v.subject.digest),
        ("how it reaches this build", j.how),
        ("counts", counts or "none recorded"),
        ("where it ran", where_it_ran(v.host)),
        ("date", v.date),
        ("source", v.source),
    ]
    if j.device_code:
        rows.append(("device code", j.device_code))
    rows += [("reason", r) for r in v.reasons[:5]]
    return Badge(env, j.tier.value, str(v.verdict), _relation(j), anchor, tuple(rows))


def _publications(ledger: store.Ledger, input_hash: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    out = []
    for pub in ledger.publications(input_hash):
        rows = [
            ("published", f"{pub.target}@{pub.digest}"),
            ("tags", ", ".join(pub.tags)),
            ("policy", pub.policy),
            ("date", pub.date),
            ("fact", pub.id),
        ]
        if pub.attestation:
            rows.append(("attestation", str(pub.attestation.get("digest", ""))))
        out.append(tuple(rows))
    return tuple(out)


def _judged(ledger: store.Ledger, input_hash: str, accepts) -> dict:
    arts: list[Artifact] = ledger.artifacts(input_hash)
    if arts:
        return gate.judgements(ledger, max(arts, key=lambda a: a.date), accepts)
    # No build here (a base this host cannot reach): only the tiers that judge the sources can have run.
    return {t: gate.source_judgement(ledger, input_hash, t) for t in TIER_ORDER if t.subject is Subject.SOURCE}


def rows(root: Path) -> list[Row]:
    """Every env's row, in id order; a spec that does not validate is a row that says so."""
    specs, broken = load_each(root)
    out = [Row(env, "", "", "", "", "", (), (f"its spec does not validate: {exc}",)) for env, exc in broken.items()]
    for spec in specs:
        env = str(spec.id)
        head = dict(
            env=env,
            torch=spec.torch,
            accelerator=str(spec.accelerator),
            python=spec.python,
            abi="cxx11" if spec.cxx11_abi else "pre-cxx11",
        )
        try:
            plan = plan_of(root, spec)
            ledger = store.load(root, env)
            found = _judged(ledger, plan.input_hash, spec.gpu_evidence)
        except (FlashkitError, LockError) as exc:  # one env's broken lock or ledger must not hide the others
            out.append(Row(**head, input_hash="", badges=(), notes=(str(exc).splitlines()[0],)))
            continue
        badges = tuple(_badge(env, found[t]) if t in found else _absent(env, t.value) for t in TIER_ORDER)
        out.append(
            Row(**head, input_hash=plan.input_hash, badges=badges, publications=_publications(ledger, plan.input_hash))
        )
    return sorted(out, key=lambda r: r.env)


def _absent(env: str, tier: str) -> Badge:
    return Badge(env, tier, "none", "", f"{env}-{tier}", (("verdict", "none"), ("why", "no build at this input hash")))
