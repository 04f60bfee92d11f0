"""`flashkit ledger`: show an env's ledger, record its wheel's device code, merge ledger lines, migrate
records of the first format."""

from __future__ import annotations

import os
from pathlib import Path

from flashkit.cli.common import plans, root, say
from flashkit.core import paths
from flashkit.core.errors import RecordError, UsageError
from flashkit.images.build import load_result
from flashkit.ledger import device_code, gate, migrate, store
from flashkit.ledger import merge as ledger_merge
from flashkit.ledger.model import where_it_ran
from flashkit.plan.envid import EnvId
from flashkit.plan.specfile import env_ids, load_env


def cmd_ledger_show(args) -> int:
    r = root(args)
    EnvId.parse(args.env)
    ledger = store.load(r, args.env)
    if not ledger.facts:
        if args.env not in env_ids(r) and not os.path.lexists(store.ledger_path(r, args.env)):
            load_env(r, args.env)  # neither a spec nor a ledger: an unknown env, named with the nearest known ones
        raise RecordError(f"{args.env} has no ledger yet ({paths.rel(r, store.ledger_path(r, args.env))})")
    for h in ledger.input_hashes():
        print(f"input hash {h}")
        arts = ledger.artifacts(h)
        for art in arts:
            print(f"  build {art.id[7:19]} {art.date}: image {art.image_id}, wheel {art.wheel_sha256[:12]}")
            if art.builder:
                b = art.builder
                print(
                    f"    by {b.get('host')} with {b.get('tool')} ({b.get('storage')}){' cold' if b.get('cold') else ''}"
                )
            same = [
                a for a in arts if a is not art and a.image_id == art.image_id and a.builder_key() != art.builder_key()
            ]
            if same and art is min((art, *same), key=lambda a: a.date):
                print(f"    confirmed: {len(same)} independent build(s) produced the same image id")
            if art.wheel_from:
                src = art.wheel_from
                print(f"    wheel from {src['env']}@{src['input_hash']} (that build's file; not compiled here)")
            for code in ledger.device_codes(art.wheel_sha256)[:1]:
                print(f"    {device_code.describe(code)}")
            for j in gate.judgements(ledger, art).values():
                print(f"    {j.line()}")
            for applies, v in ledger.inherited(art.id):
                if applies.relation:
                    print(f"    {applies.relation} relation {applies.device_code}: {applies.because}")
                    continue
                print(
                    f"    applies from {applies.source_env}: its {v.tier} verdict {v.id[7:19]} ({v.verdict}, "
                    f"{v.date}) on this wheel, run on {where_it_ran(v.host)}"
                )
        for pub in ledger.publications(h):
            print(f"  published {pub.date}: {pub.target}@{pub.digest} tags {', '.join(pub.tags)} ({pub.policy})")
            if pub.attestation:
                print(f"    attestation {pub.attestation['tag']} signed by key {pub.attestation['key_id'][:16]}")
    return 0


def cmd_ledger_device_code(args) -> int:
    r = root(args)
    (plan,) = plans(r, args)
    if args.wheel:
        wheel = Path(args.wheel)
    else:
        res = load_result(r, plan.env_id, plan.input_hash)
        if res is None:
            raise UsageError(
                f"{plan.env_id}: no wheel of its current input hash {plan.input_hash[:20]} in this checkout",
                hint=f"run `flashkit build {plan.env_id}`, or pass --wheel PATH (a wheel a build of it exported)",
            )
        wheel = Path(res.wheel_path)
    art, fact, added = device_code.record_for_wheel(r, plan.spec, wheel)
    if fact is None:
        print(f"{plan.env_id}: {wheel.name} carries no device code (a Triton-only wheel); nothing recorded")
        return 0
    state = "recorded" if any(f.id == fact.id for f in added) else "already recorded"
    print(f"{plan.env_id}: build {art.id[7:19]}, wheel {art.wheel_sha256[:16]}: {device_code.describe(fact)} ({state})")
    for a in device_code.relations_naming(r, fact.digest):
        print(
            f"  {a.env} build {a.artifact_id[7:19]}: {a.tier} verdict {a.verdict_id[7:19]} of {a.source_env} reaches it"
        )
    return 0


def cmd_ledger_migrate(args) -> int:
    r = root(args)
    envs = args.envs or [e for e in env_ids(r) if os.path.lexists(store.legacy_path(r, e))]
    if not envs:
        say("nothing to migrate: no verified/<env>.json of the first format")
    for env in envs:
        EnvId.parse(env)
        added, archive = migrate.migrate_env(r, env)
        say(
            f"{env}: {added} facts appended to {paths.rel(r, store.ledger_path(r, env))}; original kept as {paths.rel(r, archive)}"
        )
    return 0


def cmd_ledger_merge(args) -> int:
    r = root(args)
    merged = ledger_merge.merge(r, [Path(f) for f in args.files])
    for env, (added, offered) in merged.counts.items():
        path = paths.rel(r, store.ledger_path(r, env))
        print(f"{env}: {added} of {offered} facts added to {path} ({offered - added} already there)")
    for env, n in merged.inherited.items():
        path = paths.rel(r, store.ledger_path(r, env))
        print(f"{env}: {n} applies of other envs' verdicts added to {path} (wheel_from, device code)")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "ledger", help="show an env's ledger, merge ledger lines, or migrate records of the first format"
    )
    lsub = p.add_subparsers(dest="ledger_action", required=True)
    s = lsub.add_parser("show", help="every build, verdict and publication of an env, and what applies to what")
    s.add_argument("env")
    s.set_defaults(run=cmd_ledger_show)
    s = lsub.add_parser(
        "device-code",
        help="record the device code (every cubin and PTX payload) of an env's exported wheel, and the GPU "
        "verdicts it lets reach other envs",
    )
    s.add_argument("env")
    s.add_argument("--wheel", help="the wheel (default: this checkout's build of the env's current input hash)")
    s.set_defaults(run=cmd_ledger_device_code)
    s = lsub.add_parser("migrate", help="convert verified/<env>.json (schema 1) into the append-only ledger")
    s.add_argument("envs", nargs="*", help="env ids (default: every env with a schema-1 record)")
    s.set_defaults(run=cmd_ledger_migrate)
    s = lsub.add_parser(
        "merge",
        help="append ledger lines recorded elsewhere (CI jobs' uploads) to verified/<env>.jsonl: checked, "
        "deduplicated by fact id, in order, never overwriting",
    )
    s.add_argument("files", nargs="+", metavar="FILE|DIR", help="files of ledger lines, or folders of *.jsonl files")
    s.set_defaults(run=cmd_ledger_merge)
