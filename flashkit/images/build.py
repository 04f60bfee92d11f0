"""`flashkit build <env>`: render, build the builder and runtime images with BuildKit, export the wheel.

The build context is an explicit directory holding only what the Dockerfile
copies (the rendered Dockerfile, the env's lockfiles, the flash_kernels
sources), so nothing else in the checkout can change a layer. Images are
tagged by input hash (immutable) and ``latest-local`` (moving); an image whose
input-hash tag exists is not rebuilt unless asked.

Site-specific inputs (the proxy CA, a pip index, a Debian mirror) reach the
build as a BuildKit secret or build arguments: they are recorded as build
context in the result, never as identity, and the CA never enters a layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from flashkit.core import hostinfo
from flashkit.core import paths
from flashkit.evidence.artifact_check import sha256  # one streaming file hash, stdlib-only
from flashkit.images.base import pinned_base
from flashkit.images.container import Container, image_inspect
from flashkit.images.engine import Engine, add_install_engine_option, ensure_engine
from flashkit.core.errors import BaseImageError, BuildError
from flashkit.ledger.record import utc_now, write_json_atomic

log = logging.getLogger(__name__)

IMAGE_REPO = "flashkit"
STAGES = ("builder", "runtime")
WORK = Path(".work")
# Site settings a build may take: setting -> (environment variable, Dockerfile ARGs it may feed).
SITE_ARGS = {
    "PIP_INDEX_URL": ("FLASHKIT_PIP_INDEX_URL", ("PIP_INDEX_URL",)),
    "DEBIAN_MIRROR": ("FLASHKIT_DEBIAN_MIRROR", ("DEBIAN_MIRROR", "APT_MIRROR")),
}
_SOURCE_IGNORE = shutil.ignore_patterns(
    "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.pyc", ".pytest_cache", ".ruff_cache"
)


@dataclasses.dataclass(frozen=True)
class BuildResult:
    env: str
    input_hash: str
    runtime_ref: str
    runtime_id: str
    builder_ref: str
    builder_id: str
    runtime_size: int
    builder_size: int
    wheel_path: str
    wheel_sha256: str
    lock_sha256: str
    base_image_id: str | None
    built: bool  # False when an existing image with this input hash was reused
    seconds: float
    log_path: str
    context: dict[str, str]
    date: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def image_ref(env_id: str, tag: str) -> str:
    return f"{IMAGE_REPO}/{env_id}:{tag}"


def result_path(root: Path, env_id: str, input_hash: str) -> Path:
    return root / WORK / "builds" / f"{env_id}-{input_hash}.json"


def load_result(root: Path, env_id: str, input_hash: str) -> BuildResult | None:
    p = result_path(root, env_id, input_hash)
    if not p.exists():
        return None
    return BuildResult(**json.loads(p.read_text()))


def prepare_context(root: Path, spec, dockerfile: str, ctx: Path) -> None:
    """Fill ``ctx`` with exactly what the Dockerfile copies, laid out as in the repository."""
    if ctx.exists():
        shutil.rmtree(ctx)
    ctx.mkdir(parents=True)
    (ctx / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    env_id = str(spec.id)
    (ctx / paths.LOCKFILES_DIR).mkdir()
    for lock in (paths.lock_file(root, env_id), paths.build_lock_file(root, env_id)):
        if lock.exists():
            shutil.copy2(lock, ctx / paths.LOCKFILES_DIR / lock.name)
    shutil.copytree(root / spec.kernel_source, ctx / spec.kernel_source, ignore=_SOURCE_IGNORE)


def declared_args(dockerfile: str) -> set[str]:
    return set(re.findall(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)", dockerfile, flags=re.M))


def site_settings(dockerfile: str, overrides: dict[str, str | None]) -> dict[str, str]:
    """Build args for site settings: CLI value, else FLASHKIT_* env.

    Refused when the Dockerfile lacks the ARG, since the value would be silently ignored.
    """
    declared = declared_args(dockerfile)
    out: dict[str, str] = {}
    for setting, (env_name, args) in SITE_ARGS.items():
        value = overrides.get(setting) or os.environ.get(env_name)
        if not value:
            continue
        targets = [a for a in args if a in declared]
        if not targets:
            wanted = ", ".join(f"ARG {a}" for a in args)
            raise BuildError(
                f"{setting} was set ({env_name} or its flag) but the rendered Dockerfile "
                f"declares none of {wanted}, so it would be ignored",
                hint="unset it, or declare the ARG in templates/Dockerfile.j2",
            )
        for a in targets:
            out[a] = value
    return out


def _stream_build(argv: list[str], env: dict[str, str], log_path: Path, quiet: bool) -> int:
    """Run the build, keep every line in ``log_path`` and show progress live."""
    start = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as logf:
        logf.write(f"$ {' '.join(argv)}\n")
        logf.flush()
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            logf.flush()  # the log is what people tail during a long compile
            # BuildKit's plain progress: "#7 [builder 3/9] RUN ..." opens a step,
            # "#7 DONE 12.3s" / "#7 CACHED" closes it; quiet mode shows only those.
            if not quiet or re.match(r"^#\d+ (\[|DONE|CACHED|ERROR)", line):
                sys.stderr.write(f"[{time.monotonic() - start:7.1f}s] {line}")
        return proc.wait()


def _tail(path: Path, n: int = 40) -> str:
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-n:])


def export_wheel(engine: Engine, builder_ref: str, dest: Path) -> Path:
    """Copy the single flash_kernels wheel out of the builder image into ``dest``."""
    with Container(engine, builder_ref, network=False) as c:
        found = c.exec(["find", "/", "-xdev", "-name", "flash_kernels-*.whl", "-not", "-path", "/proc/*"])
        wheels = sorted({p.strip() for p in found.output.splitlines() if p.strip().endswith(".whl")})
        if len(wheels) != 1:
            raise BuildError(
                f"expected exactly one flash_kernels wheel in {builder_ref}, found {wheels or 'none'}",
                hint="the builder stage must leave the wheel it built in the image",
            )
        if dest.exists():
            shutil.rmtree(dest)
        return c.copy_out(wheels[0], dest)


def build_env(
    root: Path,
    env_id: str,
    *,
    rebuild: bool = False,
    no_cache: bool = False,
    quiet: bool = False,
    overrides: dict[str, str | None] | None = None,
    engine: Engine | None = None,
    host_mem_gib: int | None = None,
    check: bool = False,
) -> BuildResult:
    """Build ENV's builder and runtime images and export its wheel.

    ``check=True`` is the second build of ``flashkit build --check``: no layer cache, its own tags
    (``<tag>-check``) and wheel folder, and no result file, so the first build stays the one of record.
    """
    from flashkit.plan.inputhash import input_hash, tag_suffix
    from flashkit.plan.render import render_env
    from flashkit.plan.spec import load_env

    engine = engine or ensure_engine()
    spec = load_env(root, env_id)
    env_id = str(spec.id)
    h = input_hash(root, spec)
    short = tag_suffix(h)
    if check:
        short, rebuild, no_cache = f"{short}-check", True, True
    runtime_ref, builder_ref = image_ref(env_id, short), image_ref(env_id, f"{short}-builder")
    lock_path = paths.lock_file(root, env_id)
    if not lock_path.exists():
        raise BuildError(f"{paths.rel(root, lock_path)} does not exist", hint=f"run `flashkit lock {env_id}`")
    lock_text = lock_path.read_text(encoding="utf-8")

    base = _ensure_base(engine, root, spec.base.suite) if spec.base.flavor == "debian" else None
    base_id = base.image_id if base else None

    existing = load_result(root, env_id, h)
    runtime_attrs, builder_attrs = image_inspect(engine, runtime_ref), image_inspect(engine, builder_ref)
    if (
        not rebuild
        and existing
        and runtime_attrs
        and builder_attrs
        and runtime_attrs["Id"] == existing.runtime_id
        and Path(existing.wheel_path).exists()
    ):
        log.info("%s is up to date (input hash %s); --rebuild to build again", env_id, h)
        return dataclasses.replace(existing, built=False)

    # Memory sizes MAX_JOBS/NVCC_THREADS in the Dockerfile; it is a site input, not identity.
    dockerfile = render_env(root, spec, host_mem_gib=host_mem_gib or hostinfo.mem_gib())
    ctx = root / WORK / "ctx" / f"{env_id}-{h}{'-check' if check else ''}"
    prepare_context(root, spec, dockerfile, ctx)
    logs = root / WORK / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{env_id}-{h}{'-check' if check else ''}.log"
    log_path.write_text(f"# flashkit build {env_id} input hash {h} at {utc_now()}\n")

    client = engine.build_client
    settings = site_settings(dockerfile, overrides or {})
    common = ["--progress=plain", "--label", f"org.flashkit.env={env_id}", "--label", f"org.flashkit.input-hash={h}"]
    if no_cache:
        common.append("--no-cache")
    for k, v in sorted(settings.items()):
        common += ["--build-arg", f"{k}={v}"]
    if base:
        # BuildKit cannot start FROM a bare image id; the pinned tag names exactly that id.
        for arg in ("BASE_IMAGE", "RUNTIME_IMAGE"):
            if arg in declared_args(dockerfile):
                common += ["--build-arg", f"{arg}={base.pinned_tag}"]
    ca = os.environ.get("SSL_CERT_FILE")
    if ca and Path(ca).is_file():
        # The proxy CA reaches RUN steps as a secret mount, never as a layer.
        common += ["--secret", f"id=ca,src={ca}"]
    context = {
        "client": client.describe(),
        "ca_secret": ca or "",
        **settings,
        **({"base": base.pinned_tag} if base else {}),
    }
    log.info("building %s (input hash %s) with %s; log %s", env_id, h, client.describe(), log_path)

    start = time.monotonic()
    ids: dict[str, str] = {}
    for stage in STAGES:
        ref = builder_ref if stage == "builder" else runtime_ref
        tags = ["-t", ref]
        if not check:
            tags += ["-t", image_ref(env_id, "latest-local-builder" if stage == "builder" else "latest-local")]
        iid = ctx.parent / f"{ctx.name}.{stage}.iid"
        argv = [
            *client.build_argv(),
            *common,
            "--target",
            stage,
            *tags,
            "--iidfile",
            str(iid),
            str(ctx),
        ]
        rc = _stream_build(argv, client.build_env(), log_path, quiet)
        if rc != 0:
            raise BuildError(
                f"building the {stage} stage of {env_id} failed (exit {rc})",
                detail=_tail(log_path),
                hint=f"full log: {log_path}",
            )
        ids[stage] = iid.read_text().strip()
    seconds = time.monotonic() - start

    wheel_dir = root / WORK / "wheels" / env_id / h / ("check" if check else "")
    wheel = export_wheel(engine, builder_ref, wheel_dir)
    digest = sha256(wheel)
    (wheel_dir / "SHA256SUMS").write_text(f"{digest}  {wheel.name}\n")

    runtime_attrs, builder_attrs = image_inspect(engine, runtime_ref), image_inspect(engine, builder_ref)
    result = BuildResult(
        env=env_id,
        input_hash=h,
        runtime_ref=runtime_ref,
        runtime_id=ids["runtime"],
        builder_ref=builder_ref,
        builder_id=ids["builder"],
        runtime_size=int(runtime_attrs["Size"]),
        builder_size=int(builder_attrs["Size"]),
        wheel_path=str(wheel),
        wheel_sha256=digest,
        lock_sha256=hashlib.sha256(lock_text.encode()).hexdigest(),
        base_image_id=base_id,
        built=True,
        seconds=round(seconds, 1),
        log_path=str(log_path),
        context=context,
        date=utc_now(),
    )
    if not check:
        write_json_atomic(result_path(root, env_id, h), result.to_json())
    shutil.rmtree(ctx, ignore_errors=True)
    return result


def _ensure_base(engine: Engine, root: Path, suite: str | None):
    from flashkit.images.base import RECORD_PATH, create_base

    if suite is None:
        raise BuildError("a debian-flavoured env needs base.suite")
    record = root / RECORD_PATH
    try:
        return pinned_base(engine, suite, record)
    except BaseImageError as exc:
        log.info("%s; creating it now", exc.message.splitlines()[0])
        return create_base(engine, suite, record_path=record, workdir=root / WORK / "bases")


def human_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("build", help="build an env's builder and runtime images and export its wheel")
    p.add_argument("env", help="env id, e.g. cu130-torch211")
    p.add_argument("--rebuild", action="store_true", help="build even when an image with this input hash exists")
    p.add_argument("--no-cache", action="store_true", help="ignore BuildKit's layer cache (cold build)")
    p.add_argument(
        "--check",
        action="store_true",
        help="build again without cache and compare with the build of record: the wheel must be "
        "bit-identical (exit 30 if not); differing image layers are listed with their step",
    )
    p.add_argument("--quiet", action="store_true", help="show only step headers; the log keeps everything")
    p.add_argument("--pip-index-url", help="pip index for the build (default: $FLASHKIT_PIP_INDEX_URL)")
    p.add_argument("--debian-mirror", help="Debian mirror for apt in the build (default: $FLASHKIT_DEBIAN_MIRROR)")
    add_install_engine_option(p)
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    root = paths.root_of(args)
    options = dict(
        quiet=args.quiet,
        host_mem_gib=getattr(args, "host_mem_gib", None),
        overrides={"PIP_INDEX_URL": args.pip_index_url, "DEBIAN_MIRROR": args.debian_mirror},
        engine=ensure_engine(install=args.install_engine),
    )
    if args.check:
        from flashkit.images.build_check import NotReproducible, check_env, report_path

        report = check_env(root, args.env, **options)
        print(report.text())
        print(f"report: {paths.rel(root, report_path(root, report.env, report.input_hash))}")
        if not report.wheel.identical:
            raise NotReproducible(f"{report.env}: the cold rebuild's wheel differs from the first build's (above)")
        return 0
    res = build_env(root, args.env, rebuild=args.rebuild, no_cache=args.no_cache, **options)
    what = "built" if res.built else "up to date"
    print(f"{res.env} {what}: input hash {res.input_hash}" + (f" in {res.seconds:.0f}s" if res.built else ""))
    print(f"  runtime {res.runtime_ref}  {res.runtime_id}  {human_size(res.runtime_size)}")
    print(f"  builder {res.builder_ref}  {res.builder_id}  {human_size(res.builder_size)}")
    print(f"  wheel   {res.wheel_path}  sha256 {res.wheel_sha256}")
    print(f"  log     {res.log_path}")
    return 0
