"""`flashkit resolve`: the exact install command or image that fits a named torch/CUDA/Python, or why none does.

stdout carries only what a script uses (the commands, the image references, or the JSON); the explanation
goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from flashkit.cli.common import root, say
from flashkit.core.errors import NoVerifiedFit, SpecError, UsageError
from flashkit.doctor import repo as repo_facts
from flashkit.doctor.fit import EnvAnswer, Resolution, resolve
from flashkit.doctor.model import Query
from flashkit.ledger import gate

_TORCH = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\+(cu|rocm)(\d+(?:\.\d+)*))?")


def query_of(args) -> Query:
    """The command line as a :class:`Query`; a local version (``2.9.1+cu128``) names the CUDA when --cuda does not."""
    m = _TORCH.fullmatch(args.torch)
    if not m:
        raise UsageError(f"--torch {args.torch}: give a torch version such as 2.9.1 or 2.9.1+cu128")
    kind, accel = ("cuda", args.cuda) if args.cuda else ("rocm", args.rocm) if args.rocm else (None, None)
    if kind is None and m.group(4):
        digits = m.group(5)
        kind = "cuda" if m.group(4) == "cu" else "rocm"
        accel = digits if "." in digits else f"{digits[:-1]}.{digits[-1]}"  # cu128 -> 12.8
    for flag, value in (("--cuda", args.cuda), ("--rocm", args.rocm)):
        if value and not re.fullmatch(r"\d+\.\d+", value):
            raise UsageError(f"{flag} {value}: give a version such as 12.8 (major.minor)")
    python = args.python or "{}.{}".format(*sys.version_info[:2])
    if not re.fullmatch(r"3\.\d+", python):
        raise UsageError(f"--python {python}: give a CPython version such as 3.12")
    torch = ".".join(g for g in m.group(1, 2, 3) if g is not None)
    return Query(accelerator=kind, torch=torch, accel_version=accel, cxx11_abi=args.cxx11_abi, python=python)


def _describe(q: Query) -> str:
    accel = f"{'CUDA' if q.accelerator == 'cuda' else 'ROCm'} {q.accel_version}" if q.accelerator else "any CUDA/ROCm"
    abi = {True: "cxx11 ABI", False: "pre-cxx11 ABI", None: "either C++ ABI"}[q.cxx11_abi]
    return f"torch {q.torch}, {accel}, Python {q.python}, {abi}"


def _say_answer(a: EnvAnswer, head: str) -> None:
    say(f"{head} {a.env} (torch {a.torch}, {a.accelerator}, image Python {a.python}): {a.status}")
    for why in a.why_not:
        if not why.startswith(a.status):  # the status line above already says it
            say(f"  - {why}")
    for line in a.evidence:
        say(f"  evidence: {line}")
    for note in a.notes:
        say(f"  note: {note}")


def _print_fit(res: Resolution) -> None:
    best = res.fits[0]
    _say_answer(best, "fits:")
    if best.install:
        say(f"  requirements: {best.requirements} (the kernel wheel: `flashkit wheelhouse {best.env}`)")
        for line in best.install:
            print(line)
    for ref in best.images:
        print(f"image: {ref}")
    for other in res.fits[1:]:
        say(f"also fits: {other.env}")


def run(args) -> int:
    q = query_of(args)
    policy = gate.parse_policy(args.policy)  # a bad --policy is exit 2 here, not an "unreadable ledger" later
    facts = repo_facts.load(root(args), args.policy)
    if facts.problem is not None or facts.specs is None:
        problem = facts.problem
        raise SpecError(problem.what if problem else "no env specs", hint=problem.fix if problem else None)
    res = resolve(q, facts.specs, facts.verification, facts.lock_cuda, facts.requirements)
    for why in facts.broken.values():
        say(f"left out, its spec does not validate: {why}")
    # The answer among the other envs is still given, but a broken spec may be the env that fits: exit 3.
    broken = SpecError.exit_code if facts.broken else 0
    if args.json:
        print(json.dumps({**res.to_json(), "broken_specs": facts.broken}, indent=2, sort_keys=True))
        return broken or (0 if res.fits else NoVerifiedFit.exit_code)
    say(f"flashkit resolve: {_describe(q)} (policy {policy.describe()})")
    if res.fits:
        _print_fit(res)
        return broken
    for a in res.others:
        _say_answer(a, "does not fit:")
    if broken:
        raise SpecError(
            f"no verified build fits {_describe(q)} among the envs whose specs validate: {res.reason}; "
            f"{', '.join(facts.broken)} could not be read",
            hint="fix the spec(s) named above (`flashkit validate` lists every problem), then ask again",
        )
    raise NoVerifiedFit(
        f"no verified build fits {_describe(q)}: {res.reason}",
        hint="the envs and their state: `flashkit matrix`; a new env is a new envs/<id>.yaml, "
        "verified with `nox -s test-<env>`",
    )


def register(sub) -> None:
    p = sub.add_parser(
        "resolve",
        help="the exact pip line or image that fits a torch/CUDA/Python, from the verified envs (exit 33: none fits)",
        description="Match a torch, CUDA or ROCm, Python and C++ ABI against the envs whose latest build at "
        "their current input hash passes the policy, by doctor's rules. Prints the install commands "
        "(stdout) or the published image, or says why no verified build fits (exit 33).",
    )
    p.add_argument("--torch", required=True, metavar="X.Y[.Z][+cuNNN]", help="the torch you run, e.g. 2.9.1")
    accel = p.add_mutually_exclusive_group()
    accel.add_argument("--cuda", metavar="X.Y", help="torch's CUDA version (torch.version.cuda), e.g. 12.8")
    accel.add_argument("--rocm", metavar="X.Y", help="torch's ROCm (HIP) version, e.g. 6.4")
    p.add_argument("--python", metavar="X.Y", help="the Python to install on (default: the one running flashkit)")
    p.add_argument(
        "--cxx11-abi",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch's C++ ABI (torch._C._GLIBCXX_USE_CXX11_ABI); default: either",
    )
    p.add_argument("--policy", default=gate.DEFAULT_POLICY, help="tiers that must have passed, as for publish")
    p.add_argument("--json", action="store_true", help="print one JSON object (exit 33 still says: none fits)")
    p.set_defaults(run=run)
