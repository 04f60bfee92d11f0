"""`flashkit resolve`: the exact install command or image that fits a named torch/CUDA/Python, or why none does.

stdout carries only what a script uses (the commands, the image references, or the JSON); the explanation
goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from flashkit.cli.common import root, say
from flashkit.core.errors import SpecError, UsageError
from flashkit.doctor import repo as repo_facts
from flashkit.doctor.model import Query
from flashkit.ledger import gate
from flashkit.resolve import text as resolve_text


def query_of(args) -> Query:
    """The command line as a :class:`Query` (see :func:`resolve_text.parse_query`)."""
    python = args.python or "{}.{}".format(*sys.version_info[:2])
    return resolve_text.parse_query(args.torch, cuda=args.cuda, rocm=args.rocm, python=python, cxx11_abi=args.cxx11_abi)


def run(args) -> int:
    q = query_of(args)
    policy = gate.parse_policy(args.policy)  # a bad --policy is exit 2 here, not an "unreadable ledger" later
    if args.site:
        from flashkit.doctor import published

        if args.policy != gate.DEFAULT_POLICY:
            raise UsageError("--site answers under the policy the publication was made with; give no --policy")
        facts = published.fetch(args.site)
    else:
        facts = repo_facts.load(root(args), args.policy)
    if facts.problem is not None or facts.specs is None:
        problem = facts.problem
        raise SpecError(problem.what if problem else "no env specs", hint=problem.fix if problem else None)
    res, text = resolve_text.answer(facts, q, policy.describe())
    if args.json:
        for why in facts.broken.values():
            say(f"left out, its spec does not validate: {why}")
        print(json.dumps({**res.to_json(), "broken_specs": facts.broken}, indent=2, sort_keys=True))
    else:
        for stream, line in text.lines:
            print(line, file=sys.stdout if stream == resolve_text.OUT else sys.stderr)
    # The answer among the other envs is given either way; but a broken spec (3) or a ledger that does not read
    # (its own code, as `flashkit ledger show` gives) may be the env that fits, and the exit code says so.
    if facts.unreadable and not facts.broken:
        if text.error is not None and not args.json:
            say(f"flashkit: error: {text.error}")
        for env, exc in sorted(facts.unreadable.items()):
            say(f"{env}: ledger unreadable: {str(exc).splitlines()[0]}")
        return min(exc.exit_code for exc in facts.unreadable.values())
    if text.error is not None and not args.json:
        raise text.error
    return text.exit_code


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
    p.add_argument(
        "--site", metavar="URL", help="answer from a flashkit publication (its base URL) instead of a checkout"
    )
    p.set_defaults(run=run)
