"""Reading and appending ``verified/<env>.jsonl``: the ledger of one env.

One fact per line, in the order they were appended. Appending takes a file lock
(``verified/<env>.jsonl.lock``, the ``filelock`` package) for the whole read-check-write, writes the old
lines unchanged plus the new ones to a temporary file and renames it into place: a concurrent writer
waits instead of losing an update, and a crash leaves the old ledger, never half a line. Git merges the
file with ``merge=union`` (``.gitattributes``), which is exactly right for independent appended lines.

Reading validates every line (JSON Schema, then :func:`flashkit.ledger.model.semantic_problem` and the
content id) and fails on the first bad one with its file, line and field: a ledger either reads whole or
not at all. A file of the first record format (``verified/<env>.json``) is refused with the command that
migrates it.

An ``applies`` fact with ``source_env`` names a verdict in another env's ledger (an env whose image installs
the wheel that env built). Reading resolves it: the verdict must be in ``verified/<source_env>.jsonl`` with
that id, of that tier, judging that very wheel; anything else is an error naming this file and line, never
an applies silently honoured or dropped. The resolved verdicts are :attr:`Ledger.foreign`. One level only:
the source ledger is read and checked line by line, but its own cross-env applies are not resolved in turn
(the verdict an applies names is always the source's own, so nothing further is needed, and no chain or
cycle of envs can recurse). Appending a cross-env applies resolves it first, so a ledger never gains a line
that would make it unreadable.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from flashkit.core import safeio
from flashkit.core.errors import DeviceCodeMismatch, FlashkitError, RecordError
from flashkit.ledger.model import (
    RELATION_DEVICE_CODE,
    Applies,
    Artifact,
    DeviceCodeFact,
    Fact,
    Publication,
    VerdictFact,
    WheelPublication,
    canonical,
    content_id,
    from_body,
    semantic_problem,
)

DIR = "verified"
MAX_LEDGER_BYTES = 64 * safeio.MIB
MAX_LINE_BYTES = 256 * safeio.KIB
MAX_DEPTH = 16  # a fact nests four levels at most (device code: extensions, a list, a payload's fields)
_RESTORE = "restore the file from git; the ledger is append-only"
LOCK_TIMEOUT_S = 300


def ledger_path(root: Path, env: str) -> Path:
    return Path(root) / DIR / f"{env}.jsonl"


def legacy_path(root: Path, env: str) -> Path:
    return Path(root) / DIR / f"{env}.json"


@functools.cache
def _validator():
    import jsonschema

    schema = json.loads(resources.files("flashkit.ledger").joinpath("schema/ledger-v2.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def schema_problem(body: object) -> str | None:
    """The first way ``body`` breaks the ledger schema, naming the field (None when it does not)."""
    errors = sorted(_validator().iter_errors(body), key=lambda e: (len(e.absolute_path), list(e.absolute_path)))
    if not errors:
        return None
    err = errors[-1]  # the deepest: it names the field, not just "the object is invalid"
    where = ".".join(str(p) for p in err.absolute_path) or "(the fact)"
    return f"field {where}: {err.message[:300]}"


def check_body(body: object) -> Fact:
    """A fact from one parsed line, or ValueError saying what is wrong with it."""
    problem = schema_problem(body)
    if problem:
        raise ValueError(problem)
    assert isinstance(body, dict)
    if body["id"] != content_id(body):
        raise ValueError(f"field id: {body['id']} is not the sha256 of the fact's content (the line was edited)")
    fact = from_body(body)
    problem = semantic_problem(fact)
    if problem:
        raise ValueError(problem if problem.startswith("field ") else f"field verdict: {problem}")
    return fact


@dataclass(frozen=True)
class Ledger:
    env: str
    facts: tuple[Fact, ...]  # in append order
    # The other envs' verdicts that this ledger's cross-env applies name, by id (checked when read).
    foreign: dict[str, VerdictFact] = field(default_factory=dict)

    def artifacts(self, input_hash: str | None = None) -> list[Artifact]:
        return [f for f in self.facts if isinstance(f, Artifact) and input_hash in (None, f.input_hash)]

    def verdicts(self, input_hash: str | None = None) -> list[VerdictFact]:
        return [f for f in self.facts if isinstance(f, VerdictFact) and input_hash in (None, f.input_hash)]

    def applies(self) -> list[Applies]:
        return [f for f in self.facts if isinstance(f, Applies)]

    def inherited(self, artifact_id: str) -> list[tuple[Applies, VerdictFact]]:
        """The cross-env applies for one artifact of this ledger, each with the verdict it names."""
        return [
            (a, self.foreign[a.verdict_id])
            for a in self.applies()
            if a.source_env is not None and a.artifact_id == artifact_id and a.verdict_id in self.foreign
        ]

    def device_codes(self, wheel_sha256: str | None = None) -> list[DeviceCodeFact]:
        """The device-code facts of this ledger (of one wheel's sha256, hex, when given)."""
        return [f for f in self.facts if isinstance(f, DeviceCodeFact) and wheel_sha256 in (None, f.wheel_sha256)]

    def device_code_of(self, wheel_sha256: str) -> str | None:
        """The device-code digest recorded for a wheel (the first recorded; every one agrees, see reading)."""
        found = self.device_codes(wheel_sha256)
        return found[0].digest if found else None

    def publications(self, input_hash: str | None = None) -> list[Publication]:
        return [f for f in self.facts if isinstance(f, Publication) and input_hash in (None, f.input_hash)]

    def wheel_publications(self, input_hash: str | None = None) -> list[WheelPublication]:
        return [f for f in self.facts if isinstance(f, WheelPublication) and input_hash in (None, f.input_hash)]

    def by_id(self) -> dict[str, Fact]:
        return {f.id: f for f in self.facts}

    def input_hashes(self) -> list[str]:
        return list(dict.fromkeys(f.input_hash for f in self.facts))


def parse_lines(text: str, *, env: str | None, shown: str) -> Ledger:
    """Every fact of ``text``, each line checked; ``env`` None: facts of any env (lines to merge). Cross-env
    applies are not resolved here (see :func:`load`)."""
    return _parse(text, env=env, shown=shown)[0]


def parse_located(text: str, *, env: str | None, shown: str) -> tuple[Ledger, dict[str, str]]:
    """As :func:`parse_lines`, and for each fact id the ``file:line`` it was first read from."""
    return _parse(text, env=env, shown=shown)


def _parse(text: str, *, env: str | None, shown: str) -> tuple[Ledger, dict[str, str]]:
    """The ledger of ``text`` and, for each fact id, the ``file:line`` it was first read from."""
    ledger, seen = _parse_checked(text, env, shown)
    return ledger, dict(seen)


# Checking a line (schema, content id, semantics) is most of the cost of reading a ledger, and one command
# reads a source env's ledger once for itself and again for each env whose applies name it; the install page
# resolves a thousand choices in one process. The result depends on the arguments only, and a Ledger is
# immutable, so equal text is checked once. Errors are not cached: they are raised again on the next read.
@functools.lru_cache(maxsize=64)
def _parse_checked(text: str, env: str | None, shown: str) -> tuple[Ledger, dict[str, str]]:
    facts: list[Fact] = []
    seen: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        if not line:
            continue
        where = f"{shown}:{number}"
        if len(line) > MAX_LINE_BYTES:
            raise RecordError(f"{where}: a line longer than {MAX_LINE_BYTES // 1024} KiB is not a ledger fact")
        body = safeio.parse_json(
            line, shown=where, what="ledger fact", error=RecordError, max_depth=MAX_DEPTH, hint=_RESTORE
        )
        try:
            fact = check_body(body)
        except ValueError as exc:
            raise RecordError(f"{where}: {exc}", hint=_RESTORE) from None
        if env is not None and fact.env != env:
            raise RecordError(f"{where}: field env: a fact of {fact.env!r} in the ledger of {env!r}")
        if fact.id not in seen:
            seen[fact.id] = where
            facts.append(fact)
        if isinstance(fact, DeviceCodeFact):
            _one_digest_per_wheel(fact, facts, where)
    return Ledger(env or "", tuple(facts)), seen


def _one_digest_per_wheel(fact: DeviceCodeFact, facts: list[Fact], where: str) -> None:
    """The device code is a function of the wheel's bytes: two facts for one wheel must agree."""
    for other in facts:
        if (
            isinstance(other, DeviceCodeFact)
            and other.wheel_sha256 == fact.wheel_sha256
            and other.digest != fact.digest
        ):
            raise DeviceCodeMismatch(
                f"{where}: field digest: wheel sha256:{fact.wheel_sha256[:16]}… is recorded with device code "
                f"{fact.digest} here and {other.digest} earlier; one wheel has one device code",
                hint=_RESTORE,
            )


def load(root: Path, env: str) -> Ledger:
    """The ledger of ``env`` (empty when it has none yet), its cross-env applies resolved."""
    ledger, where = _read(root, env)
    if not any(a.source_env for a in ledger.applies()):
        return ledger
    foreign = resolve_foreign(root, ledger.applies(), ledger.facts, lambda a: where[a.id])
    return dataclasses.replace(ledger, foreign=foreign)


def load_own(root: Path, env: str) -> Ledger:
    """The ledger of ``env`` with every line checked but its cross-env applies not resolved: the facts it
    holds itself, as a source env's ledger is read (one level; see the module docstring)."""
    return _read(root, env)[0]


def _read(root: Path, env: str) -> tuple[Ledger, dict[str, str]]:
    """The ledger of ``env``, every line checked, cross-env applies not resolved; and where each fact is."""
    path, legacy = ledger_path(root, env), legacy_path(root, env)
    if os.path.lexists(legacy):
        raise RecordError(
            f"{safeio.describe(legacy, root)} is a record of the first format (schema 1)",
            hint="run `flashkit ledger migrate` once: it converts it to the append-only ledger and keeps the original",
        )
    text = _text(root, path)
    if text is None:
        return Ledger(env, ()), {}
    return _parse(text, env=env, shown=safeio.describe(path, root))


def _text(root: Path, path: Path) -> str | None:
    """A ledger file's text as it stands: what a running transaction wrote to it, else the file (None: none)."""
    tx = _TRANSACTION.get()
    if tx is not None and path in tx.pending:
        return tx.pending[path]
    if not os.path.lexists(path):
        return None
    return safeio.read_text(path, what="ledger", error=RecordError, max_bytes=MAX_LEDGER_BYTES, root=root)


def ledger_envs(root: Path) -> list[str]:
    """The names of the ledgers in ``verified/`` (``<name>.jsonl``; the caller checks which are env ids), with
    those a running transaction creates."""
    names = {p.name.removesuffix(".jsonl") for p in (Path(root) / DIR).glob("*.jsonl")}
    tx = _TRANSACTION.get()
    if tx is not None:
        names |= {p.name.removesuffix(".jsonl") for p in tx.pending}
    return sorted(names)


def raw_text(root: Path, env: str) -> str | None:
    """A ledger's text for a quick scan, unchecked: None when there is none or it cannot be read (a scan for
    the ledgers that name something skips it; reading that ledger itself reports why)."""
    try:
        return _text(root, ledger_path(root, env))
    except RecordError:
        return None


def unreadable(root: Path, envs: Iterable[str]) -> dict[str, FlashkitError]:
    """The envs among ``envs`` whose ledger does not read by :func:`load`, each with its error. A command that
    shows many envs (matrix, site, resolve) shows the others, names these, and exits with the lowest of their
    codes, as `flashkit ledger show` exits for that one env: one bad ledger, one exit code everywhere."""
    out: dict[str, FlashkitError] = {}
    for env in envs:
        try:
            load(root, env)
        except FlashkitError as exc:
            out[env] = exc
    return out


_FOREIGN_HINT = (
    "restore both ledgers from git (they are append-only); if the source env's lines were recorded elsewhere, "
    "merge them first (`flashkit ledger merge`)"
)


def resolve_foreign(
    root: Path, applies: Iterable[Applies], facts: Iterable[Fact], where: Callable[[Applies], str]
) -> dict[str, VerdictFact]:
    """The verdict each cross-env applies names, from its source env's ledger, checked to be the verdict the
    applies says it is (the same tier, the same judged wheel) and to hold for a build among ``facts`` (this
    ledger's) that installs that env's wheel. ``where`` names an applies in errors."""
    arts = {f.id: f for f in facts if isinstance(f, Artifact)}
    sources: dict[str, dict[str, Fact]] = {}
    out: dict[str, VerdictFact] = {}
    own_codes = [f for f in facts if isinstance(f, DeviceCodeFact)]

    def source_of(a: Applies, shown: str) -> dict[str, Fact]:
        if a.source_env not in sources:
            sources[a.source_env] = _source_facts(root, a, where(a), shown)
        return sources[a.source_env]

    for a in applies:
        if a.source_env is None:
            continue
        shown = safeio.describe(ledger_path(root, a.source_env), root)
        if a.relation == RELATION_DEVICE_CODE:
            out[a.verdict_id] = _device_code_relation(a, arts, own_codes, source_of(a, shown), where(a))
            continue
        art = arts.get(a.artifact_id)
        if art is None or (art.wheel_from or {}).get("env") != a.source_env or art.subject(a.tier.subject) != a.subject:
            raise RecordError(
                f"{where(a)}: field artifact_id: {a.artifact_id} is not a build in this ledger whose image installs "
                f"the wheel {a.subject.digest} of {a.source_env} (wheel_from)",
                hint=_FOREIGN_HINT,
            )
        fact = source_of(a, shown).get(a.verdict_id)
        if not isinstance(fact, VerdictFact):
            what = "no fact" if fact is None else f"a fact of kind {fact.kind}, not a verdict,"
            raise RecordError(
                f"{where(a)}: field verdict_id: {shown} has {what} with id {a.verdict_id} "
                f"(this applies says that verdict of {a.source_env} holds for build {a.artifact_id[7:19]})",
                hint=_FOREIGN_HINT,
            )
        if fact.tier is not a.tier or fact.subject != a.subject:
            name = "tier" if fact.tier is not a.tier else "subject"
            raise RecordError(
                f"{where(a)}: field {name}: this applies names {a.tier} on {a.subject.kind} {a.subject.digest}, "
                f"but verdict {a.verdict_id[7:19]} in {shown} is {fact.tier} on {fact.subject.kind} "
                f"{fact.subject.digest}",
                hint=_FOREIGN_HINT,
            )
        out[a.verdict_id] = fact
    return out


_RELATION_HINT = (
    "a device-code relation holds only between wheels whose recorded device code is identical; restore both "
    "ledgers from git, or record the device code again (`flashkit ledger device-code ENV`) and let flashkit "
    "write the relation"
)


def _device_code_relation(
    a: Applies,
    arts: dict[str, Artifact],
    own_codes: list[DeviceCodeFact],
    source: dict[str, Fact],
    at: str,
) -> VerdictFact:
    """The verdict a device-code applies names, once every link of the relation is checked: this build's wheel
    has device code ``a.device_code`` (a device-code fact here), the verdict is the source env's own
    artifact-gpu on a wheel whose device code the source ledger records as the same digest, and the verdict's
    own record of what ran (when the GPU host computed it) agrees. Anything else: exit 34."""
    art = arts.get(a.artifact_id)
    if art is None:
        raise DeviceCodeMismatch(
            f"{at}: field artifact_id: {a.artifact_id} is not a build in this ledger", hint=_RELATION_HINT
        )
    mine = {f.digest for f in own_codes if f.wheel_sha256 == art.wheel_sha256}
    if a.device_code not in mine:
        said = ", ".join(sorted(mine)) or "none recorded"
        raise DeviceCodeMismatch(
            f"{at}: field device_code: {a.device_code} is not the device code of this build's wheel "
            f"sha256:{art.wheel_sha256[:16]}… ({said})",
            hint=_RELATION_HINT,
        )
    verdict = source.get(a.verdict_id)
    if not isinstance(verdict, VerdictFact) or verdict.tier is not a.tier or verdict.subject != a.subject:
        raise DeviceCodeMismatch(
            f"{at}: field verdict_id: {a.source_env}'s ledger has no {a.tier} verdict {a.verdict_id[7:19]} "
            f"on {a.subject.digest}",
            hint=_RELATION_HINT,
        )
    judged = a.subject.digest.removeprefix("sha256:")
    theirs = {f.digest for f in source.values() if isinstance(f, DeviceCodeFact) and f.wheel_sha256 == judged}
    ran = verdict.context.get("device_code")
    if a.device_code not in theirs or (ran is not None and ran != a.device_code):
        said = ", ".join(sorted(theirs | ({ran} if ran else set()))) or "none recorded"
        raise DeviceCodeMismatch(
            f"{at}: field device_code: the wheel {a.subject.digest[:23]}… that verdict {a.verdict_id[7:19]} of "
            f"{a.source_env} judged has device code {said}, not {a.device_code}",
            hint=_RELATION_HINT,
        )
    return verdict


def _source_facts(root: Path, a: Applies, at: str, shown: str) -> dict[str, Fact]:
    assert a.source_env is not None
    if raw_text(root, a.source_env) is None and not os.path.lexists(ledger_path(root, a.source_env)):
        raise RecordError(
            f"{at}: field source_env: {a.source_env} has no ledger ({shown}) to hold verdict {a.verdict_id}",
            hint=_FOREIGN_HINT,
        )
    try:
        return load_own(root, a.source_env).by_id()  # one level: its own cross-env applies stay unresolved
    except RecordError as exc:
        raise RecordError(f"{at}: field source_env: the ledger of {a.source_env} is unreadable: {exc}") from None


def lock_for(path: Path):
    from filelock import FileLock

    return FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)


@contextlib.contextmanager
def _locked(root: Path, env: str) -> Iterator[None]:
    """The ledger's file lock, held for the block; RecordError when it cannot be taken."""
    from filelock import Timeout

    path = ledger_path(root, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = Path(str(path) + ".lock")
    # Taking the lock opens the file for writing and truncates it: a symlink there would truncate its target.
    if lock.is_symlink():
        raise RecordError(
            f"{safeio.describe(lock, root)} is a symlink; the ledger's lock file must be a plain file",
            hint="remove it (it holds nothing; flashkit creates it when it appends)",
        )
    try:
        held = lock_for(path)
        held.acquire()
    except Timeout:
        raise RecordError(
            f"{safeio.describe(path, root)}: another flashkit held the ledger lock for {LOCK_TIMEOUT_S}s"
        ) from None
    except OSError as exc:
        if exc.filename != str(lock):
            raise
        raise RecordError(
            f"{safeio.describe(lock, root)}: the ledger's lock cannot be taken: {exc.strerror}",
            hint="remove it if it is not a plain file (it holds nothing)",
        ) from None
    try:
        yield
    finally:
        held.release()


@dataclass
class _Transaction:
    root: Path
    locks: contextlib.ExitStack
    locked: set[str] = field(default_factory=set)
    pending: dict[Path, str] = field(default_factory=dict)  # ledger file -> its whole new text

    def lock(self, env: str) -> None:
        if env not in self.locked:
            self.locks.enter_context(_locked(self.root, env))
            self.locked.add(env)


_TRANSACTION: contextvars.ContextVar[_Transaction | None] = contextvars.ContextVar("ledger_tx", default=None)


@contextlib.contextmanager
def transaction(root: Path, envs: Iterable[str]) -> Iterator[None]:
    """Appends to any ledger inside the block are held back and written together when it ends, or not at all:
    an error anywhere in it leaves every ledger file as it was, byte for byte. Reading inside it sees what was
    appended. The ledgers of ``envs`` are locked from the start, in name order (two transactions never wait
    on each other in a circle), others when first appended to; all stay locked until the files are written.
    Each file is replaced whole (one rename each), so a crash leaves every ledger an old or a new version."""
    from flashkit.core.atomic import write_texts_atomic

    if _TRANSACTION.get() is not None:
        raise RuntimeError("ledger transactions do not nest")
    with contextlib.ExitStack() as locks:
        tx = _Transaction(Path(root), locks)
        for env in sorted(set(envs)):
            tx.lock(env)
        token = _TRANSACTION.set(tx)
        try:
            yield
        finally:
            _TRANSACTION.reset(token)
        write_texts_atomic(tx.pending)


def append(root: Path, env: str, facts: Iterable[Fact]) -> tuple[Ledger, list[Fact]]:
    """Append ``facts`` (checked, deduplicated by id) under the ledger's lock; returns the new ledger and
    the facts that were really added. Inside a :func:`transaction`, they are written when it ends."""
    tx = _TRANSACTION.get()
    if tx is not None:
        tx.lock(env)
        return _append_locked(root, env, ledger_path(root, env), list(facts))
    with _locked(root, env):
        return _append_locked(root, env, ledger_path(root, env), list(facts))


def _append_locked(root: Path, env: str, path: Path, facts: list[Fact]) -> tuple[Ledger, list[Fact]]:
    from flashkit.core.atomic import write_text_atomic

    current = load(root, env)
    known = {f.id for f in current.facts}
    added: list[Fact] = []
    lines: list[str] = []
    for fact in facts:
        line = fact.line()
        try:
            check_body(json.loads(line))
        except ValueError as exc:  # a bug in the writer, never a user's input: refuse rather than record it
            raise RecordError(f"refusing to append an invalid {fact.kind} fact to {env}: {exc}") from None
        if fact.env != env or fact.id in known:
            continue
        known.add(fact.id)
        added.append(fact)
        lines.append(line)
    # A cross-env applies is checked against its source ledger before it is written (see the module docstring).
    shown = safeio.describe(path, root)
    foreign = resolve_foreign(
        root,
        [f for f in added if isinstance(f, Applies)],
        current.facts + tuple(added),
        lambda a: f"refusing to append applies {a.id[7:19]} to {shown}",
    )
    if lines:
        old = _text(root, path) or ""
        if old and not old.endswith("\n"):
            raise RecordError(f"{shown}: the last line is incomplete; restore the file from git")
        tx = _TRANSACTION.get()
        if tx is not None:
            tx.pending[path] = old + "".join(line + "\n" for line in lines)
        else:
            write_text_atomic(path, old + "".join(line + "\n" for line in lines))
    return Ledger(env, current.facts + tuple(added), {**current.foreign, **foreign}), added


__all__ = [
    "DIR",
    "Ledger",
    "append",
    "canonical",
    "check_body",
    "ledger_path",
    "legacy_path",
    "load",
    "parse_lines",
    "transaction",
]
