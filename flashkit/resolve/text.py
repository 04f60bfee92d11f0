"""What `flashkit resolve` prints for a :class:`~flashkit.resolve.fit.Resolution`, as data.

One function writes the lines, and two readers show them: the command line (stdout for what a script
uses, stderr for the explanation) and the install page (``flashkit site``), which stores these lines for
every choice its selector offers. So the page cannot say anything the command would not.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from packaging.version import Version

from flashkit.core.errors import FlashkitError, NotPublished, NoVerifiedFit, SpecError, UsageError
from flashkit.doctor.model import Query
from flashkit.doctor.repo import RepoFacts
from flashkit.plan.production import fresh_venv_line
from flashkit.resolve.fit import EnvAnswer, Resolution, resolve

OUT, ERR = "out", "err"


@dataclasses.dataclass(frozen=True)
class Printed:
    """The lines in the order the command prints them, each with its stream; the exit code; the error the
    command ends with (printed by the CLI's error handler as ``flashkit: error: ...``), if any."""

    lines: tuple[tuple[str, str], ...]
    exit_code: int
    error: FlashkitError | None = None

    def stdout(self) -> tuple[str, ...]:
        return tuple(text for stream, text in self.lines if stream == OUT)

    def stderr(self) -> tuple[str, ...]:
        """The explanation, the closing error included, as a terminal shows it."""
        tail = f"flashkit: error: {self.error}".splitlines() if self.error is not None else []
        return (*(text for stream, text in self.lines if stream == ERR), *tail)


_ACCEL_LABEL = re.compile(r"(cu|rocm)(\d+(?:\.\d+)*)")


def parse_query(torch: str, *, cuda: str | None, rocm: str | None, python: str, cxx11_abi: bool | None) -> Query:
    """The query of `flashkit resolve`'s arguments, or UsageError naming the bad one.

    ``torch`` is what ``torch.__version__`` says: a release (``2.9.1``), a pre-release build such as NGC's
    (``2.10.0a0+b4e4ee81d3``), or one with a ``+cuNNN``/``+rocmX.Y`` label, which names the accelerator when
    ``cuda``/``rocm`` do not. Any other local label is the builder's and is left out of the query.
    """
    try:
        version = Version(torch)
    except ValueError:  # InvalidVersion, or a number longer than Python converts (a 5000-digit version)
        version = None
    if version is None or len(version.release) < 2:
        raise UsageError(f"--torch {torch}: give a torch version such as 2.9.1, 2.9.1+cu128 or 2.10.0a0+b4e4ee81d3")
    kind, accel = ("cuda", cuda) if cuda else ("rocm", rocm) if rocm else (None, None)
    label = _ACCEL_LABEL.fullmatch(version.local or "")
    if kind is None and label:
        kind = "cuda" if label.group(1) == "cu" else "rocm"
        digits = label.group(2)
        accel = digits if "." in digits else f"{digits[:-1]}.{digits[-1]}"  # cu128 -> 12.8
    for flag, value in (("--cuda", cuda), ("--rocm", rocm)):
        if value and not re.fullmatch(r"\d+\.\d+", value):
            raise UsageError(f"{flag} {value}: give a version such as 12.8 (major.minor)")
    if not re.fullmatch(r"3\.\d+", python):
        raise UsageError(f"--python {python}: give a CPython version such as 3.12")
    return Query(accelerator=kind, torch=version.public, accel_version=accel, cxx11_abi=cxx11_abi, python=python)


def describe(q: Query) -> str:
    accel = f"{'CUDA' if q.accelerator == 'cuda' else 'ROCm'} {q.accel_version}" if q.accelerator else "any CUDA/ROCm"
    abi = {True: "cxx11 ABI", False: "pre-cxx11 ABI", None: "either C++ ABI"}[q.cxx11_abi]
    return f"torch {q.torch}, {accel}, Python {q.python}, {abi}"


def _answer(a: EnvAnswer, head: str) -> list[tuple[str, str]]:
    out = [(ERR, f"{head} {a.env} (torch {a.torch}, {a.accelerator}, image Python {a.python}): {a.status}")]
    out += [(ERR, f"  - {why}") for why in a.why_not if not why.startswith(a.status)]  # the status says it
    out += [(ERR, f"  evidence: {line}") for line in a.evidence]
    out += [(ERR, f"  note: {note}") for note in a.notes]
    return out


_CARD_TAG = re.compile(r":torch\d+\.\d+-(?:cu|rocm)\d+(?:\.\d+)?$")


def image_lines(images: tuple[str, ...]) -> list[str]:
    """Check the image before running it, then pull the digest that was checked: verify-image on the card's tag
    (``org/flash:torch2.7-cu12.4``), docker pull by digest (a tag can be moved after the check)."""
    pinned = [ref for ref in images if "@sha256:" in ref]
    tags = [ref for ref in images if "@" not in ref]
    card = next((ref for ref in tags if _CARD_TAG.search(ref)), tags[0] if tags else None)
    lines = []
    if card or pinned:
        lines.append(f"flashkit verify-image {card or pinned[0]} --key flashkit.pub")
    if pinned:
        lines.append(f"docker pull {pinned[0]}")
    return lines


FITS, UNPUBLISHED = "fits:", "verified, not published:"  # how the answer naming a fit begins (the page finds it)


def _fit(res: Resolution) -> list[tuple[str, str]]:
    best = res.fits[0]
    out = _answer(best, FITS)
    if best.install:
        pip, *others = best.install
        out.append(
            (ERR, f"  requirements: {best.requirements} (torch, its dependencies and the kernel wheel, by hash)")
        )
        out += [(ERR, f"  or, with uv: {line}") for line in others]
        out.append(
            (
                ERR,
                f"  into a new venv only (it uninstalls what the file does not list): {fresh_venv_line(best.requirements)}",
            )
        )
        if best.tests:
            out.append((ERR, f"  the kernel suite's CPU tier: pip install --require-hashes -r {best.tests}"))
            out.append((ERR, "    then: python -m flash_kernels.selftest --tier cpu"))
        out.append((OUT, pip))
    out += [(OUT, line) for line in image_lines(best.images)]
    if not best.images and best.python == res.query.python:
        out.append((ERR, f"  image: none published at its input hash {str(best.input_hash)[:20]}"))
    out += [(ERR, f"also fits: {other.env}") for other in res.fits[1:]]
    return out


def _unpublished(res: Resolution, a: EnvAnswer) -> tuple[list[tuple[str, str]], FlashkitError]:
    """A verified fit that nobody can download yet: say so, and how to build it from a clone."""
    lines = _answer(dataclasses.replace(a, why_not=()), UNPUBLISHED)
    py = res.query.python
    error = NotPublished(
        f"{a.env} is verified for {describe(res.query)}, but nothing of it is published yet: "
        "no index serves its wheel and no registry its image",
        hint=f"build it from a clone of flashkit (15-25 GB of disk): `nox -s test-{a.env}`, then "
        f"`flashkit wheelhouse {a.env}`, then `pip install --require-hashes -r .work/wheelhouse/{a.env}/py{py}.txt`",
    )
    return lines, error


def printed(q: Query, res: Resolution, policy: str, broken: Mapping[str, str]) -> Printed:
    """The text of `flashkit resolve` for ``q``: ``policy`` as the policy describes itself, ``broken`` the
    specs that did not validate (env -> why), which make the exit 3 even when another env fits."""
    lines = [(ERR, f"left out, its spec does not validate: {why}") for why in broken.values()]
    lines.append((ERR, f"flashkit resolve: {describe(q)} (policy {policy})"))
    if res.fits:
        return Printed((*lines, *_fit(res)), SpecError.exit_code if broken else 0)
    waiting = [a for a in res.others if a.unpublished]
    if waiting and not broken:
        more, error = _unpublished(res, waiting[0])
        return Printed((*lines, *more), error.exit_code, error)
    lines += _near(res)
    for a in res.others:
        lines += _answer(a, "does not fit:")
    if broken:
        error: FlashkitError = SpecError(
            f"no verified build fits {describe(q)} among the envs whose specs validate: {res.reason}; "
            f"{', '.join(broken)} could not be read",
            hint="fix the spec(s) named above (`flashkit validate` lists every problem), then ask again",
        )
    else:
        error = NoVerifiedFit(f"no verified build fits {describe(q)}: {res.reason}", hint=_user_hint(res))
    return Printed(tuple(lines), error.exit_code, error)


NEAREST, NOTHING_NEAR = "nearest fit:", "nothing near:"  # how the no-fit answer begins (the page finds it so)
DOCTOR_HINT = "if an import fails with `undefined symbol`, `flashkit doctor` shows what differs and what fits"


def resolve_argv(q: Query) -> list[str]:
    """The `flashkit resolve` command line that asks ``q``."""
    argv = ["flashkit", "resolve", "--torch", str(q.torch)]
    if q.accelerator:
        argv += [f"--{q.accelerator}", str(q.accel_version)]
    argv += ["--python", str(q.python)]
    if q.cxx11_abi is not None:
        argv.append("--cxx11-abi" if q.cxx11_abi else "--no-cxx11-abi")
    return argv


def _near(res: Resolution) -> list[tuple[str, str]]:
    """The first thing a no-fit answer says: the nearest fit and what changes, or that nothing is near."""
    near = res.nearest
    if near is None:
        return [(ERR, f"{NOTHING_NEAR} {res.nothing_near}")]
    q = near.query
    accel = f" with {'CUDA' if q.accelerator == 'cuda' else 'ROCm'} {q.accel_version}" if q.accelerator else ""
    abi = {True: ", cxx11 ABI", False: ", pre-cxx11 ABI", None: ""}[q.cxx11_abi]
    state = "" if near.published else "; verified, not published yet"
    return [
        (ERR, f"{NEAREST} torch {q.torch}{accel}, Python {q.python}{abi} ({near.env}{state})"),
        (ERR, f"  changes: {'; '.join(near.changes) or 'none'}"),
        (ERR, f"  ask: {' '.join(resolve_argv(q))}"),
    ]


def _user_hint(res: Resolution) -> str:
    if res.nearest is not None:
        return f"the nearest fit above is verified: its `ask:` line prints how to install it; {DOCTOR_HINT}"
    return f"`flashkit matrix` lists what is verified; {DOCTOR_HINT}"


def answer(facts: RepoFacts, q: Query, policy: str) -> tuple[Resolution, Printed]:
    """``q`` resolved against a checkout's facts (read once by :func:`flashkit.doctor.repo.load`), and its text."""
    assert facts.specs is not None, "a checkout without readable specs has no answers"
    res = resolve(q, facts.specs, facts.verification, facts.lock_cuda, facts.requirements)
    return res, printed(q, res, policy, facts.broken)
