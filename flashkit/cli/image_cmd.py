"""Image commands: engine, base, registry, build (and build --check), gc."""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from pathlib import Path

from flashkit.cli.common import add_install_engine_option, mem, plans, root, specs
from flashkit.core import paths
from flashkit.core.atomic import write_text_atomic
from flashkit.core.errors import NotReproducible, ToolError, UsageError
from flashkit.images import base, build, build_check, buildah, gc, site_inputs
from flashkit.images.engine import ensure_engine
from flashkit.ledger import store
from flashkit.ledger.record import record_build
from flashkit.plan import baselock, rules
from flashkit.plan.plan import plan_of
from flashkit.plan.specfile import load_all
from flashkit.publish.local_registry import LocalRegistry

# buildah's progress: "[2/3] STEP 7/15: RUN ..." opens a step (no "[n/m] " for a one-stage file), "[3/3] COMMIT
# ..." and "Successfully tagged ..." close a stage; "Error: ..." is buildah's own failure line.
_STEP = re.compile(r"^(?:\[\d+/\d+\] )?(?:STEP \d+/\d+:|COMMIT\b)|^Successfully tagged |^Error: ")


def shown_when_quiet(line: str) -> bool:
    """Does ``build --quiet`` show this line of buildah's output (the log keeps every line)?"""
    return bool(_STEP.match(line))


def build_options(args, **extra) -> build.BuildOptions:
    """Build options from the command line: memory, site inputs (checked), progress output."""
    quiet = getattr(args, "quiet", False)
    start = time.monotonic()

    def on_line(line: str) -> None:
        if not quiet or shown_when_quiet(line):
            sys.stderr.write(f"[{time.monotonic() - start:7.1f}s] {line}")

    urls = {
        "pip_index_url": getattr(args, "pip_index_url", None),
        "debian_mirror": getattr(args, "debian_mirror", None),
    }
    return build.BuildOptions(host_mem_gib=mem(args), site=site_inputs.gather(urls), on_line=on_line, **extra)


def cmd_engine(args) -> int:
    engine = ensure_engine(start=args.action == "ensure", install=args.install, log_path=args.log)
    print(
        f"engine: {engine.server_version} (API {engine.api_version}, storage {engine.storage_driver}, "
        f"data root {engine.data_root}) at {engine.base_url}"
    )
    print(f"builder: {buildah.find_buildah().describe()}")
    return 0


def cmd_base(args) -> int:
    r = root(args)
    (spec,) = specs(r, args)
    rules.require_accepted(spec)
    if spec.base.flavor != "debian":
        raise UsageError(f"{spec.id} starts from {spec.base.ref}, not from a Debian base made here")
    log_path = r / ".work" / "logs" / f"base-{spec.id}.log"
    if args.base_action == "lock":
        lock = base.lock_bases(spec, mirror=args.mirror, log_path=log_path)
        path = paths.base_lock_file(r, str(spec.id))
        write_text_atomic(path, baselock.format_lock(spec, lock))
        for stage in baselock.STAGES:
            print(f"{stage}: {len(lock.packages[stage])} packages")
        print(f"wrote {paths.rel(r, path)} (part of the input hash: commit it)")
        return 0
    plan = plan_of(r, spec)
    plan.require_consistent_locks()  # a base lock that does not parse stops here (exit of LockError)
    for img in build.make_bases(plan, buildah.find_buildah(), mirror=args.mirror, log_path=log_path).values():
        made = f"made in {img.seconds:.0f}s, rootfs {img.rootfs_sha256}" if img.rootfs_sha256 else "already there"
        print(f"{img.tag}  {img.image_id}  ({made})")
    return 0


def cmd_registry(args) -> int:
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a TCP port is 1-65535")
    reg = LocalRegistry(port=args.port, storage=args.storage, log_path=args.storage / "registry.log")
    reg.start()
    print(f"registry serving at {reg.address} (storage {reg.storage}); Ctrl-C stops it")
    try:
        reg.wait()
    except KeyboardInterrupt:
        pass
    finally:
        reg.stop()
    return 0


def cmd_build(args) -> int:
    r = root(args)
    (plan,) = plans(r, args, accepted=True)
    options = build_options(args)  # site inputs are checked before any engine is started
    plan.require_consistent_locks()  # and so are the locks: a stale one is refused on a host without an engine too
    engine = ensure_engine(install=args.install_engine)
    if args.check:
        report = build_check.check_plan(r, plan, engine, options, keep=args.keep_check_storage)
        print(report.text())
        print(f"report: {paths.rel(r, build_check.report_path(r, report.env, report.input_hash))}")
        if report.identical:
            # A second, independent builder got the same digests: that is evidence, and the ledger keeps it.
            _ledger, art, added = record_build(r, report.second)
            if added:
                print(
                    f"recorded in {paths.rel(r, store.ledger_path(r, report.env))}: build {art.id[7:19]} by {art.builder}"
                )
        if not report.identical:
            raise NotReproducible(f"{report.env}: the second builder's build is not bit-identical to the first (above)")
        return 0
    res = build.build_plan(r, plan, engine, dataclasses.replace(options, rebuild=args.rebuild, no_cache=args.no_cache))
    what = "built" if res.built else "up to date"
    print(f"{res.env} {what}: input hash {res.input_hash}" + (f" in {res.seconds:.0f}s" if res.built else ""))
    print(f"  runtime {res.runtime_ref}  {res.runtime_id}  {build.human_size(res.runtime_size)}")
    print(f"  builder {res.builder_ref}  {res.builder_id}  {build.human_size(res.builder_size)}")
    print(f"  wheel   {res.wheel_path}  sha256 {res.wheel_sha256}")
    print(f"  log     {res.log_path}")
    return 0


def cmd_gc(args) -> int:
    r = root(args)
    # The images this host names are under its namespace (FLASHKIT_IMAGE_NAMESPACE, default flashkit).
    args.prefix = f"{build.namespace()}/" if args.prefix is None else args.prefix
    gc.check_prefix(args.prefix)  # before the engine is asked for anything
    keep = gc.keep_tags([plan_of(r, s) for s in load_all(r)])
    report = gc.collect(ensure_engine(), keep, prefix=args.prefix, dry_run=args.dry_run, build_cache=args.build_cache)
    for tag in report.plan.keep:
        print(f"keep    {tag}")
    for tag in report.plan.remove:
        print(f"{'would remove' if args.dry_run else 'remove'}  {tag}  ({build.human_size(report.sizes.get(tag, 0))})")
    for line in report.in_use:
        print(f"kept (in use) {line}")
    if report.cache_freed is not None:
        print(f"build cache: {build.human_size(report.cache_freed)} reclaimed")
    verb, n = ("would remove", len(report.plan.remove)) if args.dry_run else ("removed", report.removed)
    print(f"{verb} {n} tag(s), kept {len(report.plan.keep)}")
    try:
        bh = buildah.find_buildah()
    except ToolError as exc:
        print(f"buildah containers: not checked ({exc.message})")
    else:
        for cid, name, why in gc.sweep_containers(bh, prefix=args.prefix, dry_run=args.dry_run):
            print(f"{'would remove' if args.dry_run else 'remove'}  buildah container {name} {cid[:12]}  ({why})")
    if args.runtime_copies:
        plans = [plan_of(r, s) for s in load_all(r)]
        for ref, size in gc.drop_runtime_copies(ensure_engine(), buildah.find_buildah(), plans, dry_run=args.dry_run):
            print(
                f"{'would remove' if args.dry_run else 'remove'}  buildah {ref}  ({build.human_size(size)}; the engine holds it)"
            )
    return 0


def add_site_options(p) -> None:
    p.add_argument("--pip-index-url", help="pip index for the build (default: $FLASHKIT_PIP_INDEX_URL); no credentials")
    p.add_argument("--debian-mirror", help="Debian mirror for apt in the build (default: $FLASHKIT_DEBIAN_MIRROR)")


def register(sub) -> None:
    p = sub.add_parser("engine", help="find, install or start the docker engine")
    p.add_argument("action", choices=["ensure", "status"], help="ensure: start dockerd if needed; status: report only")
    p.add_argument(
        "--install",
        action="store_true",
        help="apt-get install whichever of docker.io, mmdebstrap, buildah, skopeo, diffoscope-minimal, docker-registry is missing",
    )
    p.add_argument(
        "--log", type=Path, default=Path(".work/logs/dockerd.log"), help="dockerd's log when flashkit starts it"
    )
    p.set_defaults(run=cmd_engine)

    p = sub.add_parser("base", help="lock or make an env's Debian bases (mmdebstrap, no registry)")
    bsub = p.add_subparsers(dest="base_action", required=True)
    c = bsub.add_parser("lock", help="resolve the bases' packages now and write lockfiles/ENV/base.txt (root)")
    c.add_argument("env", help="env id, e.g. cu130-torch211")
    c.add_argument("--mirror", help="Debian archive URL (default: FLASHKIT_DEBIAN_MIRROR, else the host's apt sources)")
    c = bsub.add_parser("build", help="make the env's builder and runtime bases at the locked versions (root)")
    c.add_argument("env", help="env id, e.g. cu130-torch211")
    c.add_argument("--mirror", help="Debian archive URL (default: FLASHKIT_DEBIAN_MIRROR, else the host's apt sources)")
    p.set_defaults(run=cmd_base)

    p = sub.add_parser("registry", help="run a local OCI registry on 127.0.0.1 (docker-registry)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--storage", type=Path, default=Path(".work/registry"), help="where pushed blobs are kept")
    p.set_defaults(run=cmd_registry)

    p = sub.add_parser("build", help="build an env's builder and runtime images and export its wheel")
    p.add_argument("env", help="env id, e.g. cu130-torch211")
    p.add_argument("--rebuild", action="store_true", help="build even when an image with this input hash exists")
    p.add_argument(
        "--no-cache", action="store_true", help="ignore buildah's layer cache (cold layers; the bases are reused)"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="build again, cold, in a fresh buildah storage and compare with the build of record: wheel, bases, "
        "builder and runtime images must be bit-identical (exit 30 if not; diffoscope names differing files)",
    )
    p.add_argument("--keep-check-storage", metavar="DIR", help="with --check: build the second time in DIR and keep it")
    p.add_argument("--quiet", action="store_true", help="show only step headers; the log keeps everything")
    add_site_options(p)
    add_install_engine_option(p)
    p.set_defaults(run=cmd_build)

    p = sub.add_parser("gc", help="remove images of old input hashes and -check rebuilds (frees disk)")
    p.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    p.add_argument(
        "--build-cache",
        action="store_true",
        help="also prune the engine's build cache (docker builder prune; flashkit builds with buildah)",
    )
    p.add_argument(
        "--prefix",
        default=None,
        help=f"repositories to collect (default $FLASHKIT_IMAGE_NAMESPACE/, else {gc.REPO_PREFIX})",
    )
    p.add_argument(
        "--runtime-copies",
        action="store_true",
        help="also drop buildah's copy of each runtime image the engine holds (a layer cache only; frees 5-7 GB per env)",
    )
    p.set_defaults(run=cmd_gc)
