"""The install selector's data: for every choice the page offers, what `flashkit resolve` prints.

The page computes nothing. Here every (torch, CUDA/ROCm, Python, C++ ABI) the selects can form is
resolved with the command's own code (:func:`flashkit.resolve.text.answer`), and its lines are
stored; the page's script only looks the choice up. To stay small, lines are stored once and named by
index (``lines``), stderr is stored as blocks of line numbers (``blocks``: the header, the nearest fit,
each env, the closing error), and the choice's own description ("torch 2.12.0, CUDA 13.0, Python 3.12,
either C++ ABI"), which is in the header and in a closing error, is stored as a marker that the page
replaces with the chosen options' phrases joined by ", ". That join is checked here against the command's
description for every choice, so the two cannot drift apart.

An answer is ``[exit code, stdout line numbers, stderr block numbers, which stderr block is the nearest
fit (-1: none), the choice that nearest fit names (its index in pick; -1: none the selects can form)]``;
``pick`` names the answer of every choice, row-major over the selects.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from packaging.version import Version

from flashkit.core.errors import NoVerifiedFit
from flashkit.doctor.model import Query
from flashkit.doctor.repo import RepoFacts
from flashkit.plan import compat
from flashkit.resolve import text as resolve_text

MARK = "\x00"  # stands for the choice's description inside a stored line (never in a printed line)
# Then, in this order, the chosen torch, CUDA/ROCm and Python versions (the ABI has none): a line that names
# the chosen Python ("py3.12.txt", "here 3.12") is then stored once for every Python. Each marker is absent
# from the text before it goes in, so putting the values back, in the reverse order, gives the line as printed.
PART_MARKS = ("\x01", "\x02", "\x03", None)
ABIS = ((None, "either", "either C++ ABI"), (True, "cxx11", "cxx11 ABI"), (False, "pre-cxx11", "pre-cxx11 ABI"))


@dataclasses.dataclass(frozen=True)
class Option:
    label: str  # what the select shows
    phrase: str  # its part of the description resolve prints
    argv: tuple[str, ...]  # its part of the `flashkit resolve` command line


def torch_cudas(facts: RepoFacts) -> set[tuple[str, str]]:
    """What ``torch.version.cuda`` (or HIP's version) reports for the torch builds users of the matrix's torch
    minors have: PyPI's default wheel and PyTorch's own index per series (:mod:`flashkit.plan.compat`), the
    runtime each env's lockfile pins for its torch, and each spec's own (a base image's torch)."""
    specs = facts.specs or []
    out = {(s.accelerator.kind, s.accelerator.version) for s in specs}
    out |= {("cuda", v) for v in facts.lock_cuda.values() if v}
    for series in {".".join(str(s.torch).split(".")[:2]) for s in specs}:
        pypi = compat.TORCH_DEFAULT_CUDA.get(series)
        out |= {("cuda", v) for v in (*compat.TORCH_INDEX_CUDA.get(series, ()), *((pypi,) if pypi else ()))}
    return out


def options(facts: RepoFacts) -> tuple[tuple[Option, ...], ...]:
    """The four selects' options: the specs' torches, the CUDA/ROCm versions those torches report
    (:func:`torch_cudas`), the Pythons their requirements cover (or images run), and the ABIs."""
    specs = facts.specs or []
    torches = sorted({s.torch for s in specs}, key=Version)
    accels = sorted(torch_cudas(facts), key=lambda a: (a[0], Version(a[1])))
    pythons = {s.python for s in specs}
    for cov in facts.requirements.values():
        pythons |= set(getattr(cov, "covered", ()))
    name = {"cuda": "CUDA", "rocm": "ROCm"}
    return (
        tuple(Option(t, f"torch {Version(t).public}", ("--torch", t)) for t in torches),
        tuple(Option(f"{name[k]} {v}", f"{name[k]} {v}", (f"--{k}", v)) for k, v in accels),
        tuple(Option(p, f"Python {p}", ("--python", p)) for p in sorted(pythons, key=Version)),
        tuple(
            Option(label, phrase, () if flag is None else ("--cxx11-abi" if flag else "--no-cxx11-abi",))
            for flag, label, phrase in ABIS
        ),
    )


def query(choice: tuple[Option, ...]) -> Query:
    """The query `flashkit resolve` makes of the choice's command line, by the command's own parser."""
    argv = [arg for opt in choice for arg in opt.argv]
    flags = {
        argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i] in ("--torch", "--cuda", "--rocm", "--python")
    }
    abi = True if "--cxx11-abi" in argv else False if "--no-cxx11-abi" in argv else None
    return resolve_text.parse_query(
        flags["--torch"], cuda=flags.get("--cuda"), rocm=flags.get("--rocm"), python=flags["--python"], cxx11_abi=abi
    )


class _Table:
    """Each distinct item (a line, or a block of line numbers) once; an item is named by its index."""

    def __init__(self) -> None:
        self.table: list[Any] = []
        self.index: dict[Any, int] = {}

    def ref(self, item: Any) -> int:
        if item not in self.index:
            self.index[item] = len(self.table)
            self.table.append(list(item) if isinstance(item, tuple) else item)
        return self.index[item]


def blocks(lines: tuple[str, ...]) -> list[tuple[str, ...]]:
    """stderr cut where a line starts unindented: the header, the nearest fit, each env, the error, the hint."""
    out: list[list[str]] = []
    for line in lines:
        if out and line.startswith(" "):
            out[-1].append(line)
        else:
            out.append([line])
    return [tuple(b) for b in out]


def selector_data(facts: RepoFacts, policy: str) -> dict[str, Any]:
    """Everything the selector shows, as JSON-ready data (see the module docstring for its shape)."""
    selects = options(facts)
    lines, parts, answers, answer_index, pick = _Table(), _Table(), [], {}, []
    for choice in _every(selects):
        q = query(choice)
        desc = ", ".join(o.phrase for o in choice)
        if desc != resolve_text.describe(q):
            raise AssertionError(f"the page would describe {desc!r}, resolve says {resolve_text.describe(q)!r}")
        res, text = resolve_text.answer(facts, q, policy)
        err = blocks(text.stderr())
        near = [k for k, b in enumerate(err) if b[0].startswith((resolve_text.NEAREST, resolve_text.NOTHING_NEAR))]
        marked = functools.partial(_marked, [(MARK, desc), *_part_marks(choice)])
        stored = (
            text.exit_code,
            tuple(lines.ref(marked(line)) for line in text.stdout()),
            tuple(parts.ref(tuple(lines.ref(marked(line)) for line in b)) for b in err),
            near[0] if near else -1,
            _flat(selects, res.nearest.query) if res.nearest else -1,
        )
        if stored not in answer_index:
            answer_index[stored] = len(answers)
            answers.append([stored[0], list(stored[1]), list(stored[2]), stored[3], stored[4]])
        pick.append(answer_index[stored])
    return {
        "selects": [[_option_json(o) for o in opts] for opts in selects],
        "lines": lines.table,
        "blocks": parts.table,
        "answers": answers,
        "pick": pick,  # row-major over the selects, in their order
        "mark": MARK,
        "part_marks": list(PART_MARKS),
        "nofit": NoVerifiedFit.exit_code,
    }


def _option_json(o: Option) -> dict[str, Any]:
    return {
        "label": o.label,
        "phrase": o.phrase,
        "argv": list(o.argv),
        "param": list(param(o)) if param(o) else None,
        "value": value(o),
    }


def value(o: Option) -> str:
    """The version an option names, as resolve prints it ("2.7.1", "12.6", "3.12"; "" for an ABI)."""
    return o.phrase.rsplit(" ", 1)[-1] if o.argv and o.argv[0] in ("--torch", "--cuda", "--rocm", "--python") else ""


def _part_marks(choice: tuple[Option, ...]) -> list[tuple[str, str]]:
    return [(m, value(o)) for m, o in zip(PART_MARKS, choice, strict=True) if m and value(o)]


def _marked(marks: list[tuple[str, str]], line: str) -> str:
    for mark, text in marks:
        line = line.replace(text, mark)
    return line


def unmarked(data: dict[str, Any], choice: list[dict[str, Any]], line: str) -> str:
    """A stored line as resolve printed it for ``choice`` (the options' JSON): the markers' values put back."""
    marks = [(data["mark"], ", ".join(o["phrase"] for o in choice))]
    marks += [(m, o["value"]) for m, o in zip(data["part_marks"], choice, strict=True) if m and o["value"]]
    for mark, text in reversed(marks):
        line = line.replace(mark, text)
    return line


def param(o: Option) -> tuple[str, str] | None:
    """The option in the page's URL (``?torch=2.7.1&cuda=12.6&python=3.11&abi=cxx11``); None: the default."""
    if len(o.argv) == 2:
        return o.argv[0].removeprefix("--"), o.argv[1]
    if o.argv:
        return "abi", "cxx11" if o.argv[0] == "--cxx11-abi" else "pre-cxx11"
    return None


def _flat(selects: tuple[tuple[Option, ...], ...], q: Query) -> int:
    """The choice (its index in ``pick``) whose query is ``q``, or -1 when the selects cannot form it."""
    flat = 0
    for k, opts in enumerate(selects):
        found = [i for i, o in enumerate(opts) if _part_of(o, k, q)]
        if not found:
            return -1
        flat = flat * len(opts) + found[0]
    return flat


def _part_of(o: Option, k: int, q: Query) -> bool:
    if k == 0:
        return resolve_text.parse_query(o.argv[1], cuda=None, rocm=None, python="3.0", cxx11_abi=None).torch == q.torch
    if k == 1:
        return (o.argv[0].removeprefix("--"), o.argv[1]) == (q.accelerator, q.accel_version)
    if k == 2:
        return o.argv[1] == q.python
    return o.argv == (() if q.cxx11_abi is None else ("--cxx11-abi" if q.cxx11_abi else "--no-cxx11-abi",))


def _every(selects: tuple[tuple[Option, ...], ...]):
    """Every choice, row-major: the last select varies fastest (the order of ``pick``)."""
    if not selects:
        yield ()
        return
    for head in selects[0]:
        for rest in _every(selects[1:]):
            yield (head, *rest)


def command(choice: tuple[Option, ...]) -> list[str]:
    """The `flashkit resolve` command line of a choice (what the page says it shows)."""
    return ["flashkit", "resolve", *(arg for opt in choice for arg in opt.argv)]


# What the page's script does with the data, here for the page as it is written (without JavaScript it
# shows the first choice this way) and for the tests; select.js does the same in the browser.


def sizes(data: dict[str, Any]) -> list[int]:
    return [len(s) for s in data["selects"]]


def indices(data: dict[str, Any], flat: int) -> list[int]:
    """A choice's option index per select, from its index in ``pick``."""
    out = []
    for size in reversed(sizes(data)):
        out.insert(0, flat % size)
        flat //= size
    return out


def flat_index(data: dict[str, Any], idx: list[int]) -> int:
    flat = 0
    for size, i in zip(sizes(data), idx, strict=True):
        flat = flat * size + i
    return flat


@dataclasses.dataclass(frozen=True)
class Shown:
    """What the page shows for a choice: resolve's exit code, stdout and stderr, the nearest-fit block of a
    no-fit answer (also inside stderr, where resolve prints it), the choice it names, and the command."""

    code: int
    out: tuple[str, ...]
    err: tuple[str, ...]
    near: tuple[str, ...]
    near_choice: list[int] | None
    command: str


def shown(data: dict[str, Any], idx: list[int]) -> Shown:
    code, out, err, near_at, near_flat = data["answers"][data["pick"][flat_index(data, idx)]]
    choice = [data["selects"][k][i] for k, i in enumerate(idx)]

    def text(refs: list[int]) -> tuple[str, ...]:
        return tuple(unmarked(data, choice, data["lines"][i]) for i in refs)

    err_blocks = [text(data["blocks"][b]) for b in err]
    return Shown(
        code=code,
        out=text(out),
        err=tuple(line for b in err_blocks for line in b),
        near=err_blocks[near_at] if near_at >= 0 else (),
        near_choice=indices(data, near_flat) if near_flat >= 0 else None,
        command=" ".join(["flashkit", "resolve", *(a for o in choice for a in o["argv"])]),
    )


def greyed(data: dict[str, Any], idx: list[int]) -> list[list[bool]]:
    """Per select, per option: whether choosing it, the other selects as they are, ends in no fit (exit 33).
    The chosen option is never marked: the answer shown says whether the choice fits."""
    out = []
    for k, opts in enumerate(data["selects"]):
        row = []
        for i in range(len(opts)):
            other = [*idx[:k], i, *idx[k + 1 :]]
            nofit = data["answers"][data["pick"][flat_index(data, other)]][0] == data["nofit"]
            row.append(nofit and i != idx[k])
        out.append(row)
    return out


def initial(data: dict[str, Any]) -> list[int]:
    """The choice shown first: a fit (exit 0 first, then any other answer that names a fit) with the fewest
    notes (its env's own CUDA and Python), newest torch first, either ABI; the newest torch when nothing fits."""
    best, best_key = None, None
    for flat in range(len(data["pick"])):
        idx = indices(data, flat)
        code = data["answers"][data["pick"][flat]][0]
        if idx[3] != 0 or code == data["nofit"]:
            continue
        err = shown(data, idx).err
        if not any(line.startswith((resolve_text.FITS, resolve_text.UNPUBLISHED)) for line in err):
            continue
        notes = sum(line.lstrip().startswith("note:") for line in err)
        key = (code == 0, -notes, idx[0])
        if best_key is None or key > best_key:
            best, best_key = idx, key
    return best or [sizes(data)[0] - 1, 0, 0, 0]
