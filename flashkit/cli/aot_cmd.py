"""`flashkit aot ENV`: the triton-aot tier (compile-only, no GPU, no image), its lock and its table.

flashkit aot ENV                 compile every specialisation for the env's targets, record the verdict
flashkit aot ENV --targets hip:gfx942 --only _bwd    a subset, for a quick look: printed, never recorded
flashkit aot ENV --python /usr/bin/python3 --jobs 16    an interpreter that already has the pinned triton
flashkit aot ENV --lock          resolve lockfiles/ENV/triton-aot.txt (base-image envs; needs PyPI)
flashkit aot ENV --show          the resource table of the verdict at the current input hash
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from flashkit.cli.common import plans, root, say
from flashkit.core import paths, safeio
from flashkit.core.atomic import write_text_atomic
from flashkit.core.errors import LockError, NotVerified, RecordError, UsageError
from flashkit.core.names import Tier
from flashkit.images.build import WORK
from flashkit.ledger import gate, record, store
from flashkit.locking import env_lock
from flashkit.plan import triton_pin
from flashkit.plan.plan import MAX_LOCK_BYTES, Plan
from flashkit.verify import triton_aot


def _aot_lock_text(r: Path, plan: Plan) -> str | None:
    path = paths.lock_dir(r, plan.env_id) / triton_pin.AOT_LOCK
    if not os.path.lexists(path):
        return None
    return safeio.read_text(path, what="triton-aot lock", error=LockError, max_bytes=MAX_LOCK_BYTES, root=r)


def cmd_lock(r: Path, plan: Plan) -> int:
    reqs = triton_pin.aot_lock_inputs(plan.spec)
    if not reqs:
        raise UsageError(
            f"{plan.env_id}: only an env whose torch comes from its base image (with a known triton) has "
            f"{triton_pin.AOT_LOCK}; this one uses the triton pinned in lockfiles/{plan.env_id}/py{plan.spec.python}.txt"
        )
    say(f"{plan.env_id}: resolving {' '.join(reqs)} for Python {plan.spec.python} (uv, needs PyPI)...")
    text = triton_pin.aot_lock_header(plan.spec) + env_lock.compile_requirements(plan.spec, reqs)
    path = paths.lock_dir(r, plan.env_id) / triton_pin.AOT_LOCK
    write_text_atomic(path, text)
    print(f"{plan.env_id}: wrote {paths.rel(r, path)}")
    return 0


def _targets(plan: Plan, text: str | None) -> tuple[tuple[str, ...], bool]:
    """The targets to compile for, and whether they are all the env's (only then is the run the tier)."""
    own = triton_aot.targets_for(plan.spec)
    if not text:
        return own, True
    asked = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    return asked, set(asked) >= set(own)


def cmd_show(r: Path, plan: Plan) -> int:
    j = gate.source_judgement(store.load(r, plan.env_id), plan.input_hash, Tier.TRITON_AOT)
    if j.verdict is None:
        print(f"{plan.env_id}: {j.how}")
        return NotVerified.exit_code
    v = j.verdict
    data = _report_of(r, v)
    print(f"{plan.env_id}: triton-aot {v.verdict} on {v.date[:10]}, triton {v.context.get('triton')}")
    for reason in v.reasons:
        print(f"  {reason}")
    report = safeio.parse_json(data, shown=f"the report of verdict {v.id[7:19]}", what="report", error=RecordError)
    print(triton_aot.table(report if isinstance(report, dict) else {}))
    return 0 if v.passed else NotVerified.exit_code


MAX_REPORT_BYTES = 64 * safeio.MIB


def _report_of(r: Path, v) -> bytes:
    """The report verdict ``v`` names, beside the ledger; RecordError when it is missing or not those bytes."""
    sha = v.evidence.get("report_sha256", "")
    path = record.evidence_path(r, sha)
    if not os.path.lexists(path):
        raise RecordError(f"verdict {v.id[7:19]} names the report {sha}, which is not in {paths.rel(r, path.parent)}")
    data = safeio.read_bytes(path, what="triton-aot report", error=RecordError, max_bytes=MAX_REPORT_BYTES, root=r)
    if hashlib.sha256(data).hexdigest() != sha:
        raise RecordError(f"{paths.rel(r, path)} is not the report verdict {v.id[7:19]} names (its sha256 differs)")
    return data


def _recorded(r: Path, plan: Plan) -> tuple[triton_aot.Recorded, ...]:
    """The env's passed triton-aot verdicts whose report is beside the ledger with the sha256 they name (one
    whose report is missing or altered is only left out: the run then compiles)."""
    out = []
    for v in store.load(r, plan.env_id).verdicts():
        if v.tier is not Tier.TRITON_AOT or not v.passed:
            continue
        with contextlib.suppress(RecordError):
            out.append(triton_aot.Recorded(v.id, v.input_hash, v.subject.digest, dict(v.context), _report_of(r, v)))
    return tuple(reversed(out))  # the latest first


def interpreter(text: str) -> Path:
    """``--python PATH`` as an executable regular file (a symlink to one is fine); UsageError otherwise. Running
    /dev/null, a FIFO (which would block) or a folder fails late and unclearly."""
    path = Path(text)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"--python {text}: {exc.strerror}", hint="give the path of a Python interpreter") from None
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
        what = "an executable file" if stat.S_ISREG(st.st_mode) else "a regular file"
        raise UsageError(f"--python {text} is not {what}", hint="give the path of a Python interpreter")
    return path


def cmd_aot(args) -> int:
    r = root(args)
    python = interpreter(args.python) if args.python else None  # before any work: a bad path is a usage error
    (plan,) = plans(r, args, accepted=True)
    if args.lock:
        return cmd_lock(r, plan)
    if args.show:
        return cmd_show(r, plan)
    pin = triton_pin.pin_for(plan.spec, plan.locks.runtime, _aot_lock_text(r, plan))
    targets, whole = _targets(plan, args.targets)
    recorded = whole and not args.only
    say(f"{plan.env_id}: compiling flash_kernels' Triton kernels for {', '.join(targets)} with triton {pin.version}")
    run = triton_aot.run(
        plan, pin, r / WORK, targets, jobs=args.jobs, only=args.only, python=python, recorded=_recorded(r, plan)
    )
    o = run.outcome
    if "report_reused" in run.context:
        say(f"{plan.env_id}: the report of {run.context['report_reused']} was made from these very files (reused)")
    elif run.reused:
        say(f"{plan.env_id}: reused the passed result of an earlier run for {', '.join(run.reused)} (.work/aot-parts/)")
    print(
        f"{plan.env_id} triton-aot: {o.verdict} ({', '.join(f'{k} {v}' for k, v in o.counts.items())}) in {o.duration_s:.0f}s"
    )
    for reason in o.reasons[:12]:
        print(f"  {reason}")
    if recorded:
        _ledger, fact, path = record.record_source_verdict(
            r, plan.env_id, plan.input_hash, run.sources_digest, o, run.report, run.context
        )
        print(
            f"ledger: {paths.rel(r, store.ledger_path(r, plan.env_id))} (verdict {fact.id[7:19]}); report {paths.rel(r, path)}"
        )
    else:
        print("not recorded: a subset of the env's targets or kernels is a look, not the tier")
    return 0 if o.verdict == "passed" else NotVerified.exit_code


def register(sub) -> None:
    p = sub.add_parser(
        "aot", help="triton-aot tier: compile every Triton specialisation for the env's GPU targets (no GPU needed)"
    )
    p.add_argument("env", help="env id, e.g. rocm64-torch27")
    p.add_argument("--targets", help="comma list such as hip:gfx942,cuda:80 (default: the env's gpu_targets)")
    p.add_argument("--only", metavar="TEXT", help="only specialisations whose name contains TEXT (not recorded)")
    p.add_argument("--jobs", type=int, default=2, help="compiles in parallel (default 2)")
    p.add_argument(
        "--python",
        metavar="PATH",
        help="compile with this interpreter, which must already hold the env's exact triton (a host with no "
        "index); default: a venv with the pinned wheel from the index",
    )
    p.add_argument("--lock", action="store_true", help=f"resolve lockfiles/ENV/{triton_pin.AOT_LOCK} (needs PyPI)")
    p.add_argument("--show", action="store_true", help="print the recorded resource table at the current input hash")
    p.set_defaults(run=cmd_aot)
