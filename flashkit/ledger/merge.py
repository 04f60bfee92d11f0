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

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flashkit.core import safeio
from flashkit.core.errors import RecordError
from flashkit.ledger import record, store
from flashkit.ledger.model import Applies, Artifact, Fact
from flashkit.plan.specfile import env_ids


def files_of(paths: Sequence[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(p.glob("*.jsonl"))
            if not found:
                raise RecordError(
                    f"{p}: a folder with no *.jsonl ledger lines", hint="name the files or folders to merge"
                )
            out += found
        else:
            out.append(p)
    return out


def read(root: Path, paths: Sequence[Path]) -> dict[str, list[Fact]]:
    """Every fact of ``paths`` by env, checked, in order; RecordError naming the file and line of a bad one."""
    known = set(env_ids(root))
    by_env: dict[str, list[Fact]] = {}
    for path in files_of(paths):
        text = safeio.read_text(path, what="ledger lines", error=RecordError, max_bytes=store.MAX_LEDGER_BYTES)
        for fact in store.parse_lines(text, env=None, shown=str(path)).facts:
            if fact.env not in known:
                raise RecordError(
                    f"{path}: a fact of env {fact.env!r}, which this checkout has no envs/{fact.env}.yaml for",
                    hint="merge in the checkout the lines were recorded for",
                )
            by_env.setdefault(fact.env, []).append(fact)
    return by_env


@dataclass(frozen=True)
class Merged:
    counts: dict[str, tuple[int, int]]  # env -> (facts added, facts offered)
    inherited: dict[str, int]  # env -> cross-env applies the merged lines brought to its ledger


def merge(root: Path, paths: Sequence[Path]) -> Merged:
    """Append the facts of ``paths`` to their ledgers, then the cross-env applies they imply."""
    by_env = read(root, paths)
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
