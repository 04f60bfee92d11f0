"""`flashkit wheelhouse`: verified wheels exported into a local index, with hash-pinned requirements."""

from __future__ import annotations

from pathlib import Path

from flashkit.cli.common import plans, root, say
from flashkit.core import outputs
from flashkit.core.errors import FlashkitError, LockError, PublishRefused, UsageError
from flashkit.images.build import load_result
from flashkit.ledger import gate, store
from flashkit.plan import production
from flashkit.plan.lock import check_python
from flashkit.plan.plan import plan_of
from flashkit.plan.specfile import broken_specs, load_each
from flashkit.publish import wheel_index, wheelhouse


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


def register(sub) -> None:
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
