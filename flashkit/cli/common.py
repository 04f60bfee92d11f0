"""Helpers the command modules share: the repository, the plans named on the command line, messages."""

from __future__ import annotations

import sys
from pathlib import Path

from flashkit.core import hostinfo, paths
from flashkit.core.errors import SpecError
from flashkit.plan import rules
from flashkit.plan.plan import Plan, plan_of
from flashkit.plan.spec import EnvSpec
from flashkit.plan.specfile import load_all, load_env


def root(args) -> Path:
    return paths.root_of(args)


def mem(args) -> int:
    return args.host_mem_gib if args.host_mem_gib else hostinfo.mem_gib()


def say(msg: str) -> None:
    print(msg, file=sys.stderr)


def specs(root_dir: Path, args, *, names: str = "env") -> list[EnvSpec]:
    """The specs of the env(s) the command names, or of every env with --all."""
    if getattr(args, "all", False):
        return load_all(root_dir)
    value = getattr(args, names, None)
    ids = value if isinstance(value, list) else ([value] if value else [])
    if not ids:
        raise SpecError("name an env (e.g. cu124-torch27) or pass --all")
    return [load_env(root_dir, e) for e in ids]


def plans(root_dir: Path, args, *, names: str = "env", accepted: bool = False) -> list[Plan]:
    """The plans of the env(s) the command names; with ``accepted``, each env's rules are checked
    before its other inputs are read (a rejected env is exit 4 even when it has no lockfile yet)."""
    out = []
    for spec in specs(root_dir, args, names=names):
        if accepted:
            rules.require_accepted(spec)
        out.append(plan_of(root_dir, spec))
    return out


def add_install_engine_option(p) -> None:
    """The --install-engine flag of the commands that build images (build, test)."""
    p.add_argument(
        "--install-engine",
        action="store_true",
        help="on a fresh host: apt-get install docker.io, mmdebstrap, buildah, skopeo first (or FLASHKIT_INSTALL_ENGINE=1)",
    )
