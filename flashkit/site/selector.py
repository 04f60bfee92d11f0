"""The install selector's data: for every choice the page offers, what `flashkit resolve` prints.

The page computes nothing. Here every (torch, CUDA/ROCm, Python, C++ ABI) the selects can form is
resolved with the command's own code (:func:`flashkit.doctor.resolve_text.answer`), and its lines are
stored; the page's script only looks the choice up. To stay small, lines are stored once and named by
index, and the choice's own description ("torch 2.12.0, CUDA 13.0, Python 3.12, either C++ ABI"), which
is in the header and in a closing error, is stored as a marker that the page replaces with the chosen
options' phrases joined by ", ". That join is checked here against the command's description for every
choice, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from packaging.version import Version

from flashkit.doctor import resolve_text
from flashkit.doctor.model import Query
from flashkit.doctor.repo import RepoFacts

MARK = "\x00"  # stands for the choice's description inside a stored line (never in a printed line)
ABIS = ((None, "either", "either C++ ABI"), (True, "cxx11", "cxx11 ABI"), (False, "pre-cxx11", "pre-cxx11 ABI"))


@dataclasses.dataclass(frozen=True)
class Option:
    label: str  # what the select shows
    phrase: str  # its part of the description resolve prints
    argv: tuple[str, ...]  # its part of the `flashkit resolve` command line


def options(facts: RepoFacts) -> tuple[tuple[Option, ...], ...]:
    """The four selects' options, from the specs and the Pythons their requirements cover (or images run)."""
    specs = facts.specs or []
    torches = sorted({s.torch for s in specs}, key=Version)
    accels = sorted({(s.accelerator.kind, s.accelerator.version) for s in specs}, key=lambda a: (a[0], Version(a[1])))
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


class _Lines:
    """Each distinct line once; a line is named by its index."""

    def __init__(self) -> None:
        self.table: list[str] = []
        self.index: dict[str, int] = {}

    def ref(self, line: str) -> int:
        if line not in self.index:
            self.index[line] = len(self.table)
            self.table.append(line)
        return self.index[line]


def selector_data(facts: RepoFacts, policy: str) -> dict[str, Any]:
    """Everything the selector shows, as JSON-ready data (see the module docstring for its shape)."""
    selects = options(facts)
    lines, answers, answer_index, pick = _Lines(), [], {}, []
    for choice in _every(selects):
        q = query(choice)
        desc = ", ".join(o.phrase for o in choice)
        if desc != resolve_text.describe(q):
            raise AssertionError(f"the page would describe {desc!r}, resolve says {resolve_text.describe(q)!r}")
        _res, text = resolve_text.answer(facts, q, policy)
        stored = (
            text.exit_code,
            tuple(lines.ref(line.replace(desc, MARK)) for line in text.stdout()),
            tuple(lines.ref(line.replace(desc, MARK)) for line in text.stderr()),
        )
        if stored not in answer_index:
            answer_index[stored] = len(answers)
            answers.append([stored[0], list(stored[1]), list(stored[2])])
        pick.append(answer_index[stored])
    return {
        "selects": [[{"label": o.label, "phrase": o.phrase, "argv": list(o.argv)} for o in opts] for opts in selects],
        "lines": lines.table,
        "answers": answers,
        "pick": pick,  # row-major over the selects, in their order
        "mark": MARK,
    }


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
