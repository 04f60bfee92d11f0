"""Ledger commands: test, verify (and import-artifact-result), publish, wheelhouse, ledger show/migrate."""

from __future__ import annotations

import os
from pathlib import Path

from flashkit.cli.common import add_install_engine_option, plans, root, say
from flashkit.cli.image_cmd import add_site_options, build_options
from flashkit.core import outputs, paths
from flashkit.core.errors import FlashkitError, LockError, NotVerified, PublishRefused, RecordError, UsageError
from flashkit.core.names import REQUIRED_ON_BUILD_HOST, Tier
from flashkit.images.build import build_plan, human_size, image_ref, load_result
from flashkit.images.engine import ensure_engine
from flashkit.ledger import device_code, gate, gpu_import, migrate, record, store, tier_runner
from flashkit.ledger import merge as ledger_merge
from flashkit.ledger.model import where_it_ran
from flashkit.plan import production
from flashkit.plan.envid import EnvId
from flashkit.plan.lock import check_python
from flashkit.plan.plan import plan_of
from flashkit.plan.specfile import broken_specs, env_ids, load_each, load_env
from flashkit.publish import wheel_index, wheelhouse
from flashkit.publish.push import PublishRequest, publish_image, require_a_build
from flashkit.publish.registry import REGISTRY_ENV, parse_target


def _tiers(text: str) -> tuple[Tier, ...]:
    try:
        tiers = Tier.parse_list(text)
    except ValueError as exc:
        raise UsageError(f"--tiers: {exc}") from None
    if Tier.ARTIFACT_GPU in tiers:
        raise UsageError(
            "--tiers: artifact-gpu runs on a GPU host (python -m flashkit.evidence.artifact_check); import its result"
        )
    return tiers


def _report(root_dir: Path, env: str, outcomes, judged) -> None:
    print(tier_runner.summary(outcomes, judged))
    print(f"ledger: {paths.rel(root_dir, store.ledger_path(root_dir, env))}")


def cmd_test(args) -> int:
    r = root(args)
    tiers = _tiers(args.tiers)
    (plan,) = plans(r, args, accepted=True)
    options = build_options(args, rebuild=args.rebuild)  # site inputs are checked before any engine is started
    engine = ensure_engine(install=args.install_engine)
    res = build_plan(r, plan, engine, options)
    how = f"built in {res.seconds:.0f}s" if res.built else "image up to date"
    print(
        f"{res.env} @ {res.input_hash}: {how}; runtime {human_size(res.runtime_size)}, "
        f"builder {human_size(res.builder_size)}; wheel {res.wheel_sha256[:16]}"
    )
    _artifact, outcomes, judged = tier_runner.run_and_record(r, plan, res, tiers, engine)
    _report(r, res.env, outcomes, judged)
    tier_runner.require(outcomes, tuple(t for t in tiers if t in REQUIRED_ON_BUILD_HOST))
    return 0


def cmd_import(args) -> int:
    if len(args.extra) != 2:
        raise UsageError("usage: flashkit verify import-artifact-result ENV RESULT.json [--junit REPORT.xml]")
    r = root(args)
    spec = load_env(r, args.extra[0])
    fact = gpu_import.import_result(r, spec, Path(args.extra[1]), Path(args.junit) if args.junit else None)
    print(
        f"{spec.id}: artifact-gpu {fact.verdict} for wheel {fact.subject.digest} recorded in "
        f"{paths.rel(r, store.ledger_path(r, str(spec.id)))} (verdict {fact.id[7:19]})"
    )
    counts = ", ".join(f"{k} {v}" for k, v in sorted(fact.counts.items()))
    print(f"  counts recomputed from the JUnit report: {counts or 'none (the tier did not run)'}")
    for reason in fact.reasons[:8]:
        print(f"  {reason}")
    for applies in record.applied_elsewhere(r, fact):
        print(
            f"  applies to {applies.env} too (build {applies.artifact_id[7:19]}): its image installs this very "
            f"wheel (wheel_from); recorded in {paths.rel(r, store.ledger_path(r, applies.env))}"
        )
    return 0 if fact.passed else NotVerified.exit_code


def cmd_verify(args) -> int:
    if args.env == "import-artifact-result":
        return cmd_import(args)
    if args.extra:
        raise UsageError(f"unexpected arguments {' '.join(args.extra)}")
    r = root(args)
    tiers = _tiers(args.tiers)
    (plan,) = plans(r, args)
    res = tier_runner.cached_build(r, plan)
    _artifact, outcomes, judged = tier_runner.run_and_record(r, plan, res, tiers, ensure_engine())
    print(f"{plan.env_id} @ {res.input_hash} (image {res.runtime_id[:19]}, wheel {res.wheel_sha256[:12]})")
    _report(r, plan.env_id, outcomes, judged)
    tier_runner.require(outcomes, tuple(t for t in tiers if t in REQUIRED_ON_BUILD_HOST))
    return 0


def cmd_publish(args) -> int:
    r = root(args)
    policy = gate.parse_policy(args.policy)
    target = parse_target(args.registry or os.environ.get(REGISTRY_ENV))
    (plan,) = plans(r, args)
    req = PublishRequest(
        root=r,
        env_id=plan.env_id,
        input_hash=plan.input_hash,
        immutable_tag=plan.tag,
        image_ref=image_ref(plan.env_id, plan.tag),
        policy=policy,
        target=target,
        tags=(plan.spec.id.card_tag, *plan.spec.publish_tags),
        signing_key=Path(args.signing_key) if args.signing_key else None,
        inputs=plan.manifest(),
        gpu_evidence=plan.spec.gpu_evidence,
    )
    require_a_build(req)
    out = publish_image(ensure_engine(), req, dry_run=args.dry_run, say=say)
    if isinstance(out, gate.GateDecision):
        print(f"{plan.env_id}: the gate passes ({', '.join(out.passed_tiers)} passed); dry run, nothing pushed")
        return 0
    print(f"{plan.env_id}: published {out.target}@{out.digest}")
    for t in out.tags:
        print(f"  {out.target}:{t}")
    print(f"  image {out.judged_image_id} (the judged image, unchanged)")
    if out.attestation:
        print(f"  attestation {out.target}:{out.attestation['tag']} signed by key {out.attestation['key_id'][:16]}")
    print(f"  recorded in {paths.rel(r, store.ledger_path(r, plan.env_id))}")
    return 0


def _checked_wheelhouse(r: Path, plan, policy, wheel: Path | None):
    """The env's verified wheel and its requirement files, or the error that refuses them."""
    if wheel is None:
        res = load_result(r, plan.env_id, plan.input_hash)
        if res is None:
            decision = gate.latest_decision(store.load(r, plan.env_id), plan.input_hash, policy)
            why = "" if decision else f" ({'; '.join(decision.reasons)[:300]})"
            raise PublishRefused(
                f"{plan.env_id}: no wheel of its current input hash {plan.input_hash} in this checkout{why}",
                hint=f"run `flashkit build {plan.env_id}` or pass --wheel PATH",
            )
        wheel = Path(res.wheel_path)
    vw = wheelhouse.check_wheel(r, plan.env_id, plan.input_hash, wheel, policy)
    prod = production.read(r, plan.spec)
    # The image's own set is the one its input hash covers (the plan's bytes); the others are production
    # sets, shipped only when consistent with the spec.
    sets = {**prod.sets, plan.spec.python: plan.locks.runtime}
    stale = [p for py in sets if py != plan.spec.python for p in check_python(plan.spec, py, sets[py])]
    if stale:
        raise LockError(f"{plan.env_id}: " + "; ".join(stale), hint=f"run `flashkit lock {plan.env_id}`")
    return vw, wheelhouse.requirement_files(vw, sets, prod.not_covered)


def _wheelhouse_all(r: Path, out: Path, policy) -> int:
    """Every env's verified wheel in one index; an env without one is listed as skipped, with the reason."""
    wheel_index.check_out(out)  # before any work: the folder is replaced whole
    checked, skipped = [], {}
    specs, broken = load_each(r)
    for env, exc in broken.items():
        skipped[env] = f"spec invalid: {str(exc).splitlines()[0]}"
    for spec in specs:
        try:
            checked.append(_checked_wheelhouse(r, plan_of(r, spec), policy, None))
        except FlashkitError as exc:  # any one env's problem is its own line, not the whole index's failure
            # The message without the advice: "refusing to publish ...; - build: not verified (...); ledger: ..."
            lines = [ln.strip() for ln in exc.message.splitlines() if not ln.startswith("what to do")]
            skipped[str(spec.id)] = "; ".join(lines)
    wheel_index.write_all(out, checked, skipped)
    for vw, _files in checked:
        say(f"{vw.env}: {vw.path.name} (sha256 {vw.sha256[:16]}), requirements in {out}/{vw.env}/")
    for env, why in skipped.items():
        say(f"skipped {env}: {why}")
    print(
        f"{out}/simple: {len(checked)} verified wheel(s); {len(skipped)} env(s) skipped (see {out}/{wheel_index.MANIFEST})"
    )
    if broken:  # the index holds the others; the exit code still says that not every env could be read
        raise broken_specs(broken)
    # An env skipped because its ledger does not read is not "not verified": its code, as ledger show gives it.
    unreadable = store.unreadable(r, [str(s.id) for s in specs])
    return min((exc.exit_code for exc in unreadable.values()), default=0)


def _env_wheelhouse(folder: Path) -> bool:
    return (folder / "requirements.txt").is_file() and (folder / "simple").is_dir()


def cmd_wheelhouse(args) -> int:
    r = root(args)
    policy = gate.parse_policy(args.policy)
    out = outputs.check_path(args.out if args.out.is_absolute() else r / args.out, flag="--out")
    if args.all:
        if args.envs or args.wheel:
            raise UsageError("--all takes every env's own verified wheel; give no env ids and no --wheel with it")
        with outputs.writing(out, flag="--out"):
            return _wheelhouse_all(r, out, policy)
    if not args.envs:
        raise UsageError("name the env(s) to export, e.g. `flashkit wheelhouse cu130-torch211`, or pass --all")
    if args.wheel and len(args.envs) != 1:
        raise UsageError("--wheel names the wheel of one env; give exactly one env with it")
    # Check every env before writing any: a refusal leaves the whole wheelhouse as it was.
    wheel = Path(args.wheel) if args.wheel else None
    checked = [_checked_wheelhouse(r, plan, policy, wheel) for plan in plans(r, args, names="envs")]
    for vw, _files in checked:  # each <out>/<env> is replaced whole: only a wheelhouse flashkit wrote
        outputs.check_folder(out / vw.env, flag="--out", ours=_env_wheelhouse, what="`flashkit wheelhouse` wrote")
    for vw, files in checked:
        with outputs.writing(out, flag="--out"):
            dest = wheelhouse.write_env_wheelhouse(out, vw, files)
        pythons = sorted((f[2:-4] for f in files if f.startswith("py")), key=production.vkey)
        say(f"{vw.env}: {dest}/requirements.txt for Python {', '.join(pythons)} ({vw.path.name} sha256 {vw.sha256})")
    return 0


def cmd_ledger_show(args) -> int:
    r = root(args)
    EnvId.parse(args.env)
    ledger = store.load(r, args.env)
    if not ledger.facts:
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
        "test", help="build an env (if its inputs changed), run its tiers, append the verdicts to its ledger"
    )
    p.add_argument("env", help="env id, e.g. cu124-torch27")
    p.add_argument("--rebuild", action="store_true", help="build even when the input hash is unchanged")
    p.add_argument("--tiers", default="build,abi,cpu,gpu", help="comma-separated tiers (default: build,abi,cpu,gpu)")
    p.add_argument("--quiet", action="store_true", help="show only build step headers")
    add_site_options(p)
    add_install_engine_option(p)
    p.set_defaults(run=cmd_test)

    p = sub.add_parser(
        "verify", help="run tiers on a built env, or import a GPU result (import-artifact-result ENV RESULT.json)"
    )
    p.add_argument("env", help="env id; or `import-artifact-result ENV RESULT.json`")
    p.add_argument("extra", nargs="*", help="ENV RESULT.json after import-artifact-result")
    p.add_argument("--tiers", default="build,abi,cpu,gpu", help="comma-separated tiers (default: build,abi,cpu,gpu)")
    p.add_argument("--junit", help="the result's JUnit report, when it is not beside the result")
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("publish", help="push an env's verified image, pull it back by digest, tag it, record it")
    p.add_argument("env", help="env id, e.g. cu130-torch211")
    p.add_argument("--registry", help=f"HOST[:PORT]/REPOSITORY (default: ${REGISTRY_ENV})")
    p.add_argument("--policy", default=gate.DEFAULT_POLICY, help="full (default), no-gpu, or a list like build,abi,cpu")
    p.add_argument("--dry-run", action="store_true", help="run the gate only; touch no registry")
    p.add_argument(
        "--signing-key", help="ed25519 private key that signs the attestation (default: $FLASHKIT_SIGNING_KEY)"
    )
    p.set_defaults(run=cmd_publish)

    p = sub.add_parser("wheelhouse", help="export verified wheels into an index with hash-pinned requirements")
    p.add_argument("envs", nargs="*", help="env ids (or --all)")
    p.add_argument(
        "--all",
        action="store_true",
        help="one PEP 503 index over every env's verified wheel, plus each env's requirements; "
        "envs without one are listed as skipped",
    )
    p.add_argument(
        "--out", type=Path, default=wheelhouse.DEFAULT_OUT, help=f"output folder (default {wheelhouse.DEFAULT_OUT})"
    )
    p.add_argument("--policy", default="full", help="required tiers, as for `flashkit publish` (default full)")
    p.add_argument(
        "--wheel", help="the wheel file to export (default: this checkout's build of the current input hash)"
    )
    p.set_defaults(run=cmd_wheelhouse)

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
