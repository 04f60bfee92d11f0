"""The publish gate and the verification status: pure functions of a ledger and the digests at hand.

"Verified" is decided here and nowhere else. For an image id under an input hash:

- the image tiers (abi, cpu, gpu) need a verdict whose subject is exactly that image id;
- the wheel tiers (build, artifact-gpu) need a verdict whose subject is the sha256 of the wheel that
  an ``artifact`` fact says this image was built with. A verdict that judged the same wheel bytes on
  another image (a rebuild on another host) applies, and the judgement says so;
- a wheel tier's verdict may also be another env's: when this image installs the wheel that env built
  (the artifact's ``wheel_from``), an ``applies`` fact with ``source_env`` in this ledger names that
  env's verdict on the very same sha256 (resolved and checked when the ledger is read). Image tiers are
  never taken from another env: this image is judged here or not at all;
- an artifact-gpu verdict judged a wheel file on a GPU host: it holds for every build of this env whose
  wheel is that very file, at any input hash (an edit to the runtime stage or a runtime lock moves the hash
  and leaves the wheel alone), once that build's own build, abi and cpu tiers passed (relation
  ``same-wheel``; the applies fact names both input hashes);
- the latest verdict for a (tier, subject) wins, so a tier that failed after it passed is not passed
  (this env's own and the inherited verdicts alike);
- a source tier (triton-aot) judged the kernel sources, which the input hash covers byte for byte: its
  latest verdict at the artifact's input hash is the judgement, for every build at that hash and for an env
  that cannot be built here at all;
- "not-run" and "error" are never "passed".

Policy. ``full`` (the default) requires build, abi, cpu and a GPU tier (gpu or artifact-gpu).
A weaker policy must be named (``--policy no-gpu`` or a list such as ``build,abi,cpu``; ``a|b`` means
either) and the published image's signed attestation states it.
"""

from __future__ import annotations

import dataclasses
import difflib

from flashkit.core.errors import UsageError
from flashkit.core.names import TIER_ORDER, Subject, Tier
from flashkit.ledger.model import (
    RELATION_DEVICE_CODE,
    RELATION_SAME_WHEEL,
    Applies,
    Artifact,
    VerdictFact,
    where_it_ran,
)
from flashkit.ledger.store import Ledger

GPU_TIERS = (Tier.GPU, Tier.ARTIFACT_GPU)
POLICIES: dict[str, tuple[tuple[Tier, ...], ...]] = {
    "full": ((Tier.BUILD,), (Tier.ABI,), (Tier.CPU,), GPU_TIERS),
    "no-gpu": ((Tier.BUILD,), (Tier.ABI,), (Tier.CPU,)),
}
DEFAULT_POLICY = "full"


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    requirements: tuple[tuple[Tier, ...], ...]

    def describe(self) -> str:
        return ",".join("|".join(t.value for t in alts) for alts in self.requirements)

    @property
    def weaker_than_default(self) -> bool:
        # A default requirement is kept when some requirement here is at least as strict (fewer alternatives).
        return not all(any(set(r) <= set(d) for r in self.requirements) for d in POLICIES[DEFAULT_POLICY])


def parse_policy(text: str | None) -> Policy:
    """A named policy (``full``, ``no-gpu``) or a comma list of tiers, ``a|b`` meaning either."""
    given, text = text, (DEFAULT_POLICY if text is None else text).strip()
    if not text:  # given, but empty: not a quiet way to ask for the default
        raise UsageError(
            f"--policy {given!r}: name a policy ({', '.join(POLICIES)}) or a comma list of tiers; leave it out for "
            f"the default ({DEFAULT_POLICY})"
        )
    if text in POLICIES:
        return Policy(text, POLICIES[text])
    reqs: list[tuple[Tier, ...]] = []
    names = [t.value for t in TIER_ORDER]
    for item in text.split(","):
        alts = [a.strip() for a in item.split("|") if a.strip()]
        if not alts:
            raise UsageError(f"--policy {text!r}: empty tier in the list")
        for a in alts:
            if a not in names:
                near = difflib.get_close_matches(a, [*names, *POLICIES], n=1)
                hint = f" Perhaps you meant {near[0]!r}?" if near else ""
                raise UsageError(
                    f"--policy: unknown tier {a!r}; tiers are {', '.join(names)}, named policies {', '.join(POLICIES)}.{hint}"
                )
        group = tuple(Tier(a) for a in alts)
        if group not in reqs:
            reqs.append(group)
    return Policy("custom", tuple(reqs))


@dataclasses.dataclass(frozen=True)
class Judgement:
    tier: Tier
    verdict: VerdictFact | None
    how: str  # which digest the verdict judged, and why it counts for this artifact
    source_env: str | None = None  # the env whose ledger holds the verdict (None: this env's own)
    relation: str | None = None  # "wheel-from", "device-code", "same-wheel" (None: this env's own digest here)
    device_code: str | None = None  # the identical device-code digest a device-code relation rests on

    @property
    def passed(self) -> bool:
        return self.verdict is not None and self.verdict.passed

    def line(self) -> str:
        if self.verdict is None:
            return f"{self.tier}: not verified ({self.how})"
        return f"{self.tier}: {self.verdict.verdict} ({self.how})"


def artifacts_of_image(ledger: Ledger, input_hash: str, image_id: str) -> list[Artifact]:
    return [a for a in ledger.artifacts(input_hash) if a.image_id == image_id]


def _latest(verdicts: list[VerdictFact]) -> VerdictFact | None:
    # Append order breaks ties of equal dates: the later line is the later evidence.
    indexed = list(enumerate(verdicts))
    return max(indexed, key=lambda iv: (iv[1].date, iv[0]))[1] if indexed else None


def source_judgement(ledger: Ledger, input_hash: str, tier: Tier) -> Judgement:
    """A source tier at ``input_hash``: no build is needed, the input hash names the very sources."""
    verdict = _latest([v for v in ledger.verdicts(input_hash) if v.tier is tier])
    if verdict is None:
        return Judgement(tier, None, f"no {tier} verdict at input hash {input_hash[:20]}")
    return Judgement(tier, verdict, f"judged {verdict.subject.short()} on {verdict.date[:10]}")


def judge(ledger: Ledger, artifact: Artifact, tier: Tier, accepts: tuple[str, ...] | None = None) -> Judgement:
    """The verdict that decides ``tier`` for ``artifact``, and how it reaches it. ``accepts``: the env's
    ``gpu_evidence`` (None: every relation the ledger records; each was written only where the spec allowed)."""
    if tier.subject is Subject.SOURCE:
        return source_judgement(ledger, artifact.input_hash, tier)
    allowed = set(accepts) if accepts is not None else {"own", "wheel-from", "device-code"}
    subject = artifact.subject(tier.subject)
    found = [v for v in ledger.verdicts(artifact.input_hash) if v.tier is tier and v.subject == subject]
    inherited = _inherited(ledger, artifact, tier) if "wheel-from" in allowed else []
    by_code = _by_device_code(ledger, artifact, tier) if "device-code" in allowed else []
    if tier in GPU_TIERS and "own" not in allowed:
        found = []
    same = _same_wheel(ledger, artifact, tier) if "own" in allowed else []
    verdict = _latest(found + [v for _a, v in inherited] + [v for _a, v in by_code] + [v for _a, v in same])
    if verdict is None:
        return Judgement(tier, None, f"no verdict judged {subject.short()}")
    code = next((a for a, v in by_code if v.id == verdict.id), None)
    if code is not None:
        return _device_code_judgement(ledger, artifact, tier, verdict, code)
    moved = next((a for a, v in same if v.id == verdict.id), None)
    if moved is not None:
        return _same_wheel_judgement(ledger, artifact, tier, verdict)
    via = next((a for a, v in inherited if v.id == verdict.id), None)
    if via is not None:
        src = artifact.wheel_from or {}
        return Judgement(
            tier,
            verdict,
            f"applies from {via.source_env}: this image installs the wheel {src.get('env')}@"
            f"{str(src.get('input_hash'))[:20]} built ({subject.short()}, wheel_from); that env's {tier} verdict "
            f"{verdict.id[7:19]} judged it on {verdict.date[:10]} ({where_it_ran(verdict.host)})",
            source_env=via.source_env,
            relation="wheel-from",
        )
    if tier.subject is Subject.IMAGE or verdict.context.get("image_id") in (None, artifact.image_id):
        where = f", {where_it_ran(verdict.host)}" if tier in GPU_TIERS else ""
        return Judgement(tier, verdict, f"judged {subject.short()} on {verdict.date[:10]}{where}")
    return Judgement(
        tier,
        verdict,
        f"applies: the wheel is bit-identical ({subject.short()}) to the one judged on {verdict.date[:10]} "
        f"in image {verdict.context['image_id'][7:19]}, verdict {verdict.id[7:19]}",
    )


OWN_TIERS_FOR_DEVICE_CODE = (Tier.BUILD, Tier.ABI, Tier.CPU)


def _device_code_judgement(
    ledger: Ledger, artifact: Artifact, tier: Tier, verdict: VerdictFact, a: Applies
) -> Judgement:
    """A GPU verdict reached through identical device code counts only once this very image passed its own
    build, abi and cpu tiers: the GPU run covered the device code, those tiers cover the torch binding."""
    host = verdict.host
    ran = f"torch {host.get('torch', '?')}" + (
        f", CUDA runtime {host['cuda_runtime']}" if host.get("cuda_runtime") else ""
    )
    how = (
        f"via device code {a.device_code[:19]}…, run in wheel {verdict.subject.digest[7:19]} of {verdict.env} under "
        f"{ran} on {host.get('gpu', '?')} ({verdict.date[:10]}, verdict {verdict.id[7:19]}); this wheel carries the "
        f"same cubins and PTX; its torch binding ran only in its own build, abi and cpu tiers"
    )
    held = _unless_own_tiers_missing(ledger, artifact, tier, f"a verdict reaches it {how}, but")
    return held or Judgement(tier, verdict, how, a.source_env, RELATION_DEVICE_CODE, a.device_code)


def _unless_own_tiers_missing(ledger: Ledger, artifact: Artifact, tier: Tier, lead: str) -> Judgement | None:
    """A "not verified" judgement while this image's own build, abi or cpu has not passed (None once they
    all have): a verdict reached through a relation covers the wheel, never the image it now sits in."""
    own = {t: judge(ledger, artifact, t) for t in OWN_TIERS_FOR_DEVICE_CODE}
    missing = [j.line() for j in own.values() if not j.passed]
    if not missing:
        return None
    why = f"{lead} that counts only once this image's own build, abi and cpu passed ({'; '.join(missing)})"
    return Judgement(tier, None, why)


def _same_wheel_judgement(ledger: Ledger, artifact: Artifact, tier: Tier, verdict: VerdictFact) -> Judgement:
    """This env's verdict on the very wheel file, recorded at another input hash: it judged these bytes, and
    counts once this build's own build, abi and cpu tiers passed (they judge what moved the input hash)."""
    how = (
        f"same wheel ({verdict.subject.short()}), judged at input hash {verdict.input_hash[:20]}… on "
        f"{where_it_ran(verdict.host)} ({verdict.date[:10]}, verdict {verdict.id[7:19]}); the input hash moved and "
        f"the wheel did not"
    )
    held = _unless_own_tiers_missing(ledger, artifact, tier, f"a verdict reaches it: {how};")
    return held or Judgement(tier, verdict, how, relation=RELATION_SAME_WHEEL)


def _same_wheel(ledger: Ledger, artifact: Artifact, tier: Tier) -> list[tuple[Applies, VerdictFact]]:
    """This env's artifact-gpu verdicts at other input hashes that an applies carries to ``artifact``."""
    if tier is not Tier.ARTIFACT_GPU:
        return []
    mine = {v.id: v for v in ledger.verdicts() if v.tier is tier and v.input_hash != artifact.input_hash}
    subject = artifact.subject(Subject.WHEEL)
    return [
        (a, mine[a.verdict_id])
        for a in ledger.applies()
        if a.source_env is None
        and a.artifact_id == artifact.id
        and a.verdict_id in mine
        and mine[a.verdict_id].subject == subject
    ]


def _by_device_code(ledger: Ledger, artifact: Artifact, tier: Tier) -> list[tuple[Applies, VerdictFact]]:
    """Other envs' artifact-gpu verdicts on wheels whose device code is identical to ``artifact``'s wheel's."""
    if tier is not Tier.ARTIFACT_GPU:
        return []
    return [(a, v) for a, v in ledger.inherited(artifact.id) if a.relation == RELATION_DEVICE_CODE]


def _inherited(ledger: Ledger, artifact: Artifact, tier: Tier) -> list[tuple[Applies, VerdictFact]]:
    """Other envs' verdicts of a wheel ``tier`` that this ledger's applies bring to ``artifact``'s very wheel."""
    if tier.subject is not Subject.WHEEL:
        return []  # an image is judged in its own env only
    subject = artifact.subject(Subject.WHEEL)
    return [
        (a, v)
        for a, v in ledger.inherited(artifact.id)
        if a.relation is None and v.tier is tier and v.subject == subject
    ]


def judgements(ledger: Ledger, artifact: Artifact, accepts: tuple[str, ...] | None = None) -> dict[Tier, Judgement]:
    return {t: judge(ledger, artifact, t, accepts) for t in TIER_ORDER}


@dataclasses.dataclass(frozen=True)
class GateDecision:
    ok: bool
    reasons: tuple[str, ...]
    passed: tuple[Judgement, ...]  # the judgements that passed for this very artifact

    def __bool__(self) -> bool:
        return self.ok

    @property
    def passed_tiers(self) -> tuple[str, ...]:
        return tuple(j.tier.value for j in self.passed)


def gate(
    ledger: Ledger, input_hash: str, image_id: str, policy: Policy, accepts: tuple[str, ...] | None = None
) -> GateDecision:
    """May the image ``image_id`` built at ``input_hash`` be published under ``policy``? Reads only the ledger."""
    arts = artifacts_of_image(ledger, input_hash, image_id)
    if not arts:
        known = ", ".join(sorted({a.image_id[7:19] for a in ledger.artifacts(input_hash)})) or "none"
        return GateDecision(
            False,
            (f"no build in the ledger produced image {image_id} at input hash {input_hash} (images there: {known})",),
            (),
        )
    # An image holds one wheel; several artifact facts for it (re-runs) agree on it by construction.
    best: dict[Tier, Judgement] = {}
    for art in arts:
        for tier, j in judgements(ledger, art, accepts).items():
            if tier not in best or (j.passed and not best[tier].passed):
                best[tier] = j
    reasons = []
    for alts in policy.requirements:
        if not any(best[t].passed for t in alts):
            reasons.append(" / ".join(best[t].line() for t in alts))
    passed = tuple(best[t] for t in TIER_ORDER if best[t].passed)
    return GateDecision(not reasons, tuple(reasons), passed)


@dataclasses.dataclass(frozen=True)
class Summary:
    """What `flashkit matrix` shows of an env's ledger at its current input hash."""

    status: str  # one line, as :func:`status`
    # tier -> the latest build's verdict ("passed", "failed", ...; "passed(applies)" for a bit-identical wheel
    # judged in another image of this env, "passed(applies:<env>)" for the wheel of <env> this image installs,
    # "passed(same-wheel:<input hash>)" for this env's very wheel judged at another input hash)
    tiers: dict[str, str]
    wheel: str | None  # the latest build's wheel file name
    published: tuple[str, ...]  # the image tags published at this input hash, and "wheel:<base URL>" per wheel's
    device_code: str | None = None  # the device-code digest of that wheel, when recorded
    gpu_how: str | None = None  # the GPU judgement of that build, as one line


def _source_verdicts(ledger: Ledger, input_hash: str) -> dict[str, str]:
    """The source tiers at ``input_hash``, for an env with no build there (one that cannot be built here)."""
    found = (source_judgement(ledger, input_hash, t) for t in TIER_ORDER if t.subject is Subject.SOURCE)
    return {j.tier.value: str(j.verdict.verdict) for j in found if j.verdict is not None}


def _marked(found: dict[Tier, Judgement]) -> dict[str, str]:
    """tier -> its verdict, marked with how it reaches the build ("passed(device-code:<env>)" ...)."""
    out = {}
    for tier, j in found.items():
        if j.verdict is not None:
            if j.relation == RELATION_DEVICE_CODE:
                mark = f"(device-code:{j.source_env})"
            elif j.relation == RELATION_SAME_WHEEL:
                mark = f"(same-wheel:{j.verdict.input_hash[:12]})"
            elif j.source_env:
                mark = f"(applies:{j.source_env})"
            else:
                mark = "(applies)" if j.how.startswith("applies") else ""
            out[tier.value] = f"{j.verdict.verdict}{mark}"
    return out


def _status_line(verdicts: dict[str, str]) -> str:
    return " ".join(f"{tier}:{v}" for tier, v in verdicts.items()) or "not verified (no tier ran)"


def summary(ledger: Ledger, input_hash: str, accepts: tuple[str, ...] | None = None) -> Summary:
    arts = ledger.artifacts(input_hash)
    tags = tuple(dict.fromkeys(t for pub in ledger.publications(input_hash) for t in pub.tags))
    # Where the wheel is on an index: the publication's base URL (its requirement files are there).
    tags += tuple(dict.fromkeys(f"wheel:{pub.base_url}" for pub in ledger.wheel_publications(input_hash)))
    if not arts:
        return Summary(status(ledger, input_hash), _source_verdicts(ledger, input_hash), None, tags)
    art = max(arts, key=lambda a: a.date)
    found = judgements(ledger, art, accepts)  # once: the status line, the marks and the GPU line all read it
    verdicts = _marked(found)
    gpu = next((found[t] for t in GPU_TIERS if found[t].passed), None) or found[Tier.ARTIFACT_GPU]
    return Summary(
        _status_line(verdicts), verdicts, art.wheel, tags, ledger.device_code_of(art.wheel_sha256), gpu.line()
    )


def status(ledger: Ledger, input_hash: str, accepts: tuple[str, ...] | None = None) -> str:
    """One line for `flashkit matrix` and doctor: each tier's state for the latest build at ``input_hash``."""
    arts = ledger.artifacts(input_hash)
    if not arts and _source_verdicts(ledger, input_hash):
        shown = " ".join(f"{t}:{v}" for t, v in _source_verdicts(ledger, input_hash).items())
        return f"{shown} (no build at this input hash)"
    if not arts:
        if ledger.facts:
            older = ledger.input_hashes()[-1]
            return f"not verified at this input hash (the ledger's latest is {older[:20]})"
        return "not verified"
    return _status_line(_marked(judgements(ledger, max(arts, key=lambda a: a.date), accepts)))


def latest_decision(
    ledger: Ledger, input_hash: str, policy: Policy, accepts: tuple[str, ...] | None = None
) -> GateDecision:
    """The gate for the latest build at ``input_hash`` (refused when there is none)."""
    arts = ledger.artifacts(input_hash)
    if not arts:
        return GateDecision(False, (f"no build at input hash {input_hash}",), ())
    return gate(ledger, input_hash, max(arts, key=lambda a: a.date).image_id, policy, accepts)
