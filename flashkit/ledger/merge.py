"""`flashkit ledger merge FILE|DIR...`: ledger lines from elsewhere (CI jobs' uploads) into ``verified/<env>.jsonl``.

Each line is checked as a ledger line is when it is read (schema, content id, semantics), every file before
anything is written, so one bad line merges nothing. Facts are then appended to their env's ledger with the
ledger's own append: under its lock, deduplicated by fact id, in the order the files give them, the old
lines untouched. Merging the same lines twice, or lines the ledger already has, adds nothing. A folder
stands for its ``*.jsonl`` files in name order (a CI job's ``<env>-build.jsonl`` before ``<env>-gpu.jsonl``).

Envs are merged in name order, except that an env whose lines hold cross-env applies comes after the others:
such an applies is checked against its source env's ledger when it is appended, and the verdict it names
may be among the lines of this same merge. A CI job uploads only its own env's lines, so after the merge
the cross-env applies the new lines imply are added as a local record would add them: a source env's new
wheel verdicts reach the envs that install that wheel, and a consumer's new build inherits its source's
verdicts (:mod:`flashkit.ledger.record`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flashkit.core import safeio
from flashkit.core.errors import FlashkitError, RecordError
from flashkit.core.names import Subject
from flashkit.ledger import record, store
from flashkit.ledger.model import Applies, Artifact, DeviceCodeFact, Fact, VerdictFact
from flashkit.plan.plan import plan_of
from flashkit.plan.specfile import env_ids, load_each


def files_of(paths: Sequence[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if os.path.isdir(p):  # os.path: False, not OSError, for a name too long to look up
            found = sorted(p.glob("*.jsonl"))
            if not found:
                raise RecordError(
                    f"{p}: a folder with no *.jsonl ledger lines", hint="name the files or folders to merge"
                )
            out += found
        else:
            out.append(p)
    return out


def env_of_file(path: Path, known: set[str]) -> str | None:
    """The env a file's name says it holds: ``<env>.jsonl`` (a ledger) or ``<env>-<part>.jsonl`` (a CI job's
    upload); the longest such id, so ``cu130-torch211-py313-build`` is that env's, not cu130-torch211's."""
    stem = path.name.removesuffix(".jsonl")
    named = [env for env in known if stem == env or stem.startswith(env + "-")]
    return max(named, key=len) if named else None


def read(root: Path, paths: Sequence[Path]) -> dict[str, list[Fact]]:
    """Every fact of ``paths`` by env, checked, in order; RecordError naming the file and line of a bad one."""
    known = set(env_ids(root))
    by_env: dict[str, list[Fact]] = {}
    where: dict[str, str] = {}
    for path in files_of(paths):
        text = safeio.read_text(path, what="ledger lines", error=RecordError, max_bytes=store.MAX_LEDGER_BYTES)
        # A file named for an env holds that env's lines only (checked with each line's file:line).
        ledger, at = store.parse_located(text, env=env_of_file(path, known), shown=str(path))
        for fact in ledger.facts:
            if fact.env not in known:
                raise RecordError(
                    f"{at[fact.id]}: a fact of env {fact.env!r}, which this checkout has no envs/{fact.env}.yaml for",
                    hint="merge in the checkout the lines were recorded for",
                )
            by_env.setdefault(fact.env, []).append(fact)
            where.setdefault(fact.id, at[fact.id])
    _require_readable_ledgers(root)
    for env, facts in by_env.items():
        _require_subjects(root, env, facts, by_env, where)
    _require_own_input_hashes(root, by_env, where)
    return by_env


def _require_readable_ledgers(root: Path) -> None:
    """Every ledger of the checkout reads: the lines are checked against all of them (whose input hash a fact
    carries, which verdict a relation names), and a merge that skipped one would accept what it would refuse.
    The error is the one `flashkit ledger show` gives for that env (the lowest code when several do not read)."""
    bad = store.unreadable(root, record.env_ledgers(root))
    if bad:
        env, exc = min(bad.items(), key=lambda item: (item[1].exit_code, item[0]))
        raise type(exc)(
            f"the ledger of {env} does not read, so no line can be checked against it; nothing was merged",
            detail=str(exc),
            hint=f"`flashkit ledger show {env}` names the problem; restore that ledger from git, then merge again",
        )


def _input_hash_owners(root: Path, by_env: dict[str, list[Fact]]) -> dict[str, set[str]]:
    """Input hash -> the envs it is known for: each env's current plan, its ledger's facts, and these lines."""
    owners: dict[str, set[str]] = {}
    specs, _broken = load_each(root)
    for spec in specs:
        try:
            owners.setdefault(plan_of(root, spec).input_hash, set()).add(str(spec.id))
        except FlashkitError:  # a lockfile that does not read: that env's hash is not known, its ledger's still are
            continue
    for env in record.env_ledgers(root):
        for line in (store.raw_text(root, env) or "").splitlines():
            try:
                h = json.loads(line).get("input_hash")
            except (ValueError, AttributeError, RecursionError):  # that ledger's own problem, reported when it is read
                continue
            if isinstance(h, str):
                owners.setdefault(h, set()).add(env)
    for env, facts in by_env.items():
        for fact in facts:
            owners.setdefault(fact.input_hash, set()).add(env)
    return owners


def _require_own_input_hashes(root: Path, by_env: dict[str, list[Fact]], where: dict[str, str]) -> None:
    """Every fact's input hash is one of its own env's: the hash covers the env's spec, id included, so no two
    envs share one. A build line moved to another env (its env field changed, its id recomputed) still carries
    the input hash of the env it was built for, whose plan or ledger names it."""
    owners = _input_hash_owners(root, by_env)
    for env, facts in by_env.items():
        for fact in facts:
            others = sorted(owners.get(fact.input_hash, set()) - {env})
            if others:
                raise RecordError(
                    f"{where[fact.id]}: field input_hash: {fact.input_hash[:24]}… is the input hash of "
                    f"{', '.join(others)} (its plan or its ledger), not of {env}: a {fact.kind} fact moved from "
                    "another env; nothing was merged",
                    hint="merge each env's lines as they were recorded",
                )


_SUBJECT_HINT = (
    "merge the build's lines too (a CI job's -build.jsonl before its -gpu.jsonl), or merge in the checkout "
    "whose ledger holds that build"
)


def _require_subjects(
    root: Path, env: str, facts: list[Fact], by_env: dict[str, list[Fact]], where: dict[str, str]
) -> None:
    """Every verdict, applies and device-code fact names a build that this env's ledger or this same merge
    holds: a verdict on a digest no build of the env produced is evidence about nothing, and the gate must
    never see one (a GPU "passed" with a made-up image id is a correctly hashed line)."""
    have = store.load_own(root, env).facts + tuple(facts)
    arts = [f for f in have if isinstance(f, Artifact)]
    built = {Subject.IMAGE: {a.image_id for a in arts}, Subject.WHEEL: {f"sha256:{a.wheel_sha256}" for a in arts}}
    art_ids = {a.id for a in arts}
    verdict_ids = {f.id for f in have if isinstance(f, VerdictFact)}
    for fact in facts:
        problem = None
        if isinstance(fact, VerdictFact) and fact.subject.kind in built:
            if fact.subject.digest not in built[fact.subject.kind]:
                problem = (
                    f"field subject: {fact.tier} verdict on {fact.subject.kind} {fact.subject.digest}, which no "
                    f"build (artifact) of {env} in its ledger or in these lines produced"
                )
        elif isinstance(fact, Applies | DeviceCodeFact) and fact.artifact_id not in art_ids:
            problem = f"field artifact_id: {fact.artifact_id} is no build of {env} in its ledger or in these lines"
        elif isinstance(fact, Applies) and fact.source_env is None and fact.verdict_id not in verdict_ids:
            problem = f"field verdict_id: {fact.verdict_id} is no verdict of {env} in its ledger or in these lines"
        if problem:
            raise RecordError(f"{where[fact.id]}: {problem}; nothing was merged", hint=_SUBJECT_HINT)


@dataclass(frozen=True)
class Merged:
    counts: dict[str, tuple[int, int]]  # env -> (facts added, facts offered)
    inherited: dict[str, int]  # env -> cross-env applies the merged lines brought to its ledger


def merge(root: Path, paths: Sequence[Path]) -> Merged:
    """Append the facts of ``paths`` to their ledgers, then the cross-env applies they imply."""
    by_env = read(root, paths)
    # One transaction: a line refused when it is appended (a relation that does not hold, checked against
    # the other envs' lines of this same merge) leaves every ledger as it was, not the envs before it merged.
    with store.transaction(root, [*by_env, *record.env_ledgers(root)]):
        return _merge(root, by_env)


def _merge(root: Path, by_env: dict[str, list[Fact]]) -> Merged:
    order = sorted(by_env, key=lambda env: (any(isinstance(f, Applies) and f.source_env for f in by_env[env]), env))
    added = {env: store.append(root, env, by_env[env])[1] for env in order}
    inherited: dict[str, int] = {}
    for env in order:
        for other, facts in record.propagate(root, env, added[env]).items():
            inherited[other] = inherited.get(other, 0) + len(facts)
        if any(isinstance(f, Artifact) and f.wheel_from for f in added[env]):
            more = record.inherited_applies(root, store.load(root, env))
            if more:
                inherited[env] = inherited.get(env, 0) + len(store.append(root, env, more)[1])
        # Device code: this env's new device code or GPU verdicts may reach other envs, and it may gain some.
        own = record.device_code_applies(root, store.load(root, env))
        if own:
            inherited[env] = inherited.get(env, 0) + len(store.append(root, env, own)[1])
        for other, facts in record.propagate_device_code(root, env, store.load(root, env), added[env]).items():
            inherited[other] = inherited.get(other, 0) + len(facts)
    counts = {env: (len(added[env]), len(by_env[env])) for env in sorted(by_env)}
    return Merged(counts, {k: v for k, v in sorted(inherited.items()) if v})
