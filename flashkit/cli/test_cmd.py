"""`flashkit test <env>`: build if the input hash changed, run the tiers, write the record.

This is what `nox -s test-<env>` runs. The exit status is 0 only when the
build, abi and cpu tiers passed; gpu is run where the host has a GPU and
recorded as not-run elsewhere (never as passed).
"""

from __future__ import annotations

import argparse

from flashkit.core import paths
from flashkit.ledger import record
from flashkit.images.build import build_env, human_size
from flashkit.images.engine import add_install_engine_option, ensure_engine
from flashkit.ledger.verify import REQUIRED_HERE, exit_for, summary, verify


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("test", help="build an env (if its inputs changed), run all tiers, record verdicts")
    p.add_argument("env", help="env id, e.g. cu124-torch27")
    p.add_argument("--rebuild", action="store_true", help="build even when the input hash is unchanged")
    p.add_argument("--tiers", default="build,abi,cpu,gpu", help="comma-separated tiers (default: all four)")
    p.add_argument("--quiet", action="store_true", help="show only build step headers")
    add_install_engine_option(p)
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    root = paths.root_of(args)
    engine = ensure_engine(install=args.install_engine)
    res = build_env(
        root,
        args.env,
        rebuild=args.rebuild,
        quiet=args.quiet,
        engine=engine,
        host_mem_gib=getattr(args, "host_mem_gib", None),
    )
    how = f"built in {res.seconds:.0f}s" if res.built else "image up to date"
    print(
        f"{res.env} @ {res.input_hash}: {how}; "
        f"runtime {human_size(res.runtime_size)}, builder {human_size(res.builder_size)}; "
        f"wheel {res.wheel_sha256[:16]}"
    )
    from flashkit.plan.spec import load_env

    spec = load_env(root, args.env)
    tiers = tuple(t.strip() for t in args.tiers.split(",") if t.strip())
    results = verify(root, spec, res, tiers, engine)
    print(summary(results))
    print(f"record: {paths.rel(root, record.record_path(res.env, root))}")
    return exit_for(results, tuple(t for t in tiers if t in REQUIRED_HERE))
