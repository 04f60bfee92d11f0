"""Building an env: the builder and runtime images with BuildKit, and the exported wheel.

The build context is a fresh directory written from the :class:`~flashkit.plan.plan.Plan`'s bytes (the
rendered Dockerfile, the env's lockfiles, the kernel sources), so what was hashed is exactly what is
built and nothing else in the checkout can change a layer. Images are tagged by input hash
(immutable) and ``latest-local`` (moving); an image whose input-hash tag exists is not rebuilt unless
asked.

The result is cached in ``.work/builds/<env>-<input hash>.json`` (only this module writes there). The
cache is a convenience: the ledger, not this file, is the evidence, and a clone without ``.work/``
loses nothing but the wheel's local path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from flashkit.core import safeio
from flashkit.core.atomic import utc_now, write_json_atomic
from flashkit.core.digests import sha256_file
from flashkit.core.errors import BaseImageError, BuildError
from flashkit.core.names import label
from flashkit.images import site
from flashkit.images.base import pinned_base
from flashkit.images.container import Container, image_inspect
from flashkit.images.engine import Engine
from flashkit.plan.plan import Plan
from flashkit.plan.render import render_dockerfile

log = logging.getLogger(__name__)

IMAGE_REPO = "flashkit"
STAGES = ("builder", "runtime")
WORK = Path(".work")
MAX_RESULT_BYTES = 64 * safeio.KIB
SHA256_RE = re.compile(r"[0-9a-f]{64}")
IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")


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
    context: dict
    date: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


_RESULT_TYPES = {f.name: f.type for f in dataclasses.fields(BuildResult)}


def image_ref(env_id: str, tag: str) -> str:
    return f"{IMAGE_REPO}/{env_id}:{tag}"


def result_path(root: Path, env_id: str, input_hash: str) -> Path:
    return root / WORK / "builds" / f"{env_id}-{input_hash}.json"


def _check_result(data: object, shown: str) -> BuildResult:
    """A cached result, typed and checked; anything else is a clear error naming the file and field."""
    if not isinstance(data, dict):
        raise BuildError(f"{shown}: a build result must be a JSON object, not {type(data).__name__}")
    missing = sorted(set(_RESULT_TYPES) - set(data))
    extra = sorted(set(data) - set(_RESULT_TYPES))
    if missing or extra:
        raise BuildError(
            f"{shown}: build result fields {'missing: ' + ', '.join(missing) if missing else ''}"
            f"{'; unknown: ' + ', '.join(extra) if extra else ''}",
            hint="delete the file and build again (`flashkit build ENV --rebuild`)",
        )
    checks = {
        "runtime_id": IMAGE_ID_RE,
        "builder_id": IMAGE_ID_RE,
        "wheel_sha256": SHA256_RE,
        "lock_sha256": SHA256_RE,
    }
    for name, pattern in checks.items():
        if not isinstance(data[name], str) or not pattern.fullmatch(data[name]):
            raise BuildError(
                f"{shown}: field {name} = {data[name]!r} is not a digest", hint="delete the file and rebuild"
            )
    for name in ("runtime_size", "builder_size"):
        if not isinstance(data[name], int) or isinstance(data[name], bool) or data[name] < 0:
            raise BuildError(f"{shown}: field {name} is not a size in bytes", hint="delete the file and rebuild")
    for name in ("env", "input_hash", "runtime_ref", "builder_ref", "wheel_path", "log_path", "date"):
        if not isinstance(data[name], str):
            raise BuildError(f"{shown}: field {name} is not text", hint="delete the file and rebuild")
    if not isinstance(data["context"], dict) or not isinstance(data["built"], bool):
        raise BuildError(f"{shown}: fields context/built have the wrong type", hint="delete the file and rebuild")
    return BuildResult(**data)


def load_result(root: Path, env_id: str, input_hash: str) -> BuildResult | None:
    """The cached result of building ``env_id`` at ``input_hash``, or None when there is none."""
    p = result_path(root, env_id, input_hash)
    if not p.exists() and not p.is_symlink():
        return None
    shown = safeio.describe(p, root)
    text = safeio.read_text(p, what="build result", error=BuildError, max_bytes=MAX_RESULT_BYTES, root=root)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BuildError(f"{shown}: not valid JSON ({exc})", hint="delete the file and rebuild") from None
    res = _check_result(data, shown)
    if res.env != env_id or res.input_hash != input_hash:
        raise BuildError(f"{shown}: it describes {res.env}@{res.input_hash}, not {env_id}@{input_hash}")
    return res


def write_context(plan: Plan, dockerfile: str, ctx: Path) -> None:
    """Fill ``ctx`` with exactly what the Dockerfile copies, from the plan's bytes, laid out as in the repo."""
    if ctx.exists():
        shutil.rmtree(ctx)
    ctx.mkdir(parents=True)
    (ctx / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    locks = ctx / "lockfiles" / plan.env_id  # the image's Python's set and the builder's, as render names them
    locks.mkdir(parents=True)
    (locks / f"py{plan.spec.python}.txt").write_text(plan.locks.runtime, encoding="utf-8")
    (locks / "build.txt").write_text(plan.locks.build, encoding="utf-8")
    for src in plan.sources:
        dest = ctx / src.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(src.data)
        dest.chmod(0o755 if src.mode == "100755" else 0o644)


def _stream_build(argv: list[str], env: dict[str, str], log_path: Path, on_line: Callable[[str], None]) -> int:
    """Run the build, keep every line in ``log_path`` and hand each to ``on_line`` (progress)."""
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
            on_line(line)
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


def _up_to_date(root: Path, plan: Plan, engine: Engine, refs: tuple[str, str]) -> BuildResult | None:
    existing = load_result(root, plan.env_id, plan.input_hash)
    runtime, builder = (image_inspect(engine, r) for r in refs)
    if existing and runtime and builder and runtime["Id"] == existing.runtime_id and Path(existing.wheel_path).exists():
        return dataclasses.replace(existing, built=False)
    return None


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    rebuild: bool = False
    no_cache: bool = False
    check: bool = False  # the second build of `build --check`: own tags, no cache, not the build of record
    host_mem_gib: int = 8
    site: site.SiteInputs = dataclasses.field(default_factory=lambda: site.SiteInputs({}, None, None))
    on_line: Callable[[str], None] = lambda line: None


def _common_args(plan: Plan, dockerfile: str, base_tag: str | None, opts: BuildOptions) -> list[str]:
    args = [
        "--progress=plain",
        "--label",
        f"{label('env')}={plan.env_id}",
        "--label",
        f"{label('input-hash')}={plan.input_hash}",
    ]
    if opts.no_cache:
        args.append("--no-cache")
    if base_tag:
        # BuildKit cannot start FROM a bare image id; the pinned tag names exactly that id.
        for arg in ("BASE_IMAGE", "RUNTIME_IMAGE"):
            if re.search(rf"^ARG {arg}\b", dockerfile, flags=re.M):
                args += ["--build-arg", f"{arg}={base_tag}"]
    return args


def build_plan(root: Path, plan: Plan, engine: Engine, opts: BuildOptions) -> BuildResult:
    """Build ``plan``'s builder and runtime images and export its wheel (see the module docstring)."""
    plan.require_consistent_locks()
    env_id, h = plan.env_id, plan.input_hash
    short = f"{plan.tag}-check" if opts.check else plan.tag
    rebuild, no_cache = (True, True) if opts.check else (opts.rebuild, opts.no_cache)
    opts = dataclasses.replace(opts, rebuild=rebuild, no_cache=no_cache)
    runtime_ref, builder_ref = image_ref(env_id, short), image_ref(env_id, f"{short}-builder")
    base = _ensure_base(engine, root, plan.spec.base.suite) if plan.spec.base.flavor == "debian" else None
    if not opts.rebuild:
        cached = _up_to_date(root, plan, engine, (runtime_ref, builder_ref))
        if cached is not None:
            log.info("%s is up to date (input hash %s); --rebuild to build again", env_id, h)
            return cached

    # Memory sizes MAX_JOBS/NVCC_THREADS in the Dockerfile; it is a site input, not identity.
    dockerfile = render_dockerfile(plan, host_mem_gib=opts.host_mem_gib)
    suffix = "-check" if opts.check else ""
    ctx = root / WORK / "ctx" / f"{env_id}-{h}{suffix}"
    write_context(plan, dockerfile, ctx)
    log_path = root / WORK / "logs" / f"{env_id}-{h}{suffix}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"# flashkit build {env_id} input hash {h} at {utc_now()}\n")
    client = engine.build_client
    common = _common_args(plan, dockerfile, base.pinned_tag if base else None, opts)
    log.info("building %s (input hash %s) with %s; log %s", env_id, h, client.describe(), log_path)

    start = time.monotonic()
    ids: dict[str, str] = {}
    with site.SecretFiles(opts.site) as secrets:
        for stage in STAGES:
            ref = builder_ref if stage == "builder" else runtime_ref
            tags = ["-t", ref]
            if not opts.check:
                tags += ["-t", image_ref(env_id, "latest-local-builder" if stage == "builder" else "latest-local")]
            iid = ctx.parent / f"{ctx.name}.{stage}.iid"
            argv = [*client.build_argv(), *common, *secrets, "--target", stage, *tags, "--iidfile", str(iid), str(ctx)]
            rc = _stream_build(argv, client.build_env(), log_path, opts.on_line)
            if rc != 0:
                raise BuildError(
                    f"building the {stage} stage of {env_id} failed (exit {rc})",
                    detail=_tail(log_path),
                    hint=f"full log: {log_path}",
                )
            ids[stage] = iid.read_text().strip()
    seconds = time.monotonic() - start

    wheel_dir = root / WORK / "wheels" / env_id / h / ("check" if opts.check else "")
    wheel = export_wheel(engine, builder_ref, wheel_dir)
    digest = sha256_file(wheel)
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
        lock_sha256=hashlib.sha256(plan.locks.runtime.encode()).hexdigest(),
        base_image_id=base.image_id if base else None,
        built=True,
        seconds=round(seconds, 1),
        log_path=str(log_path),
        context={"client": client.describe(), **opts.site.record(), **({"base": base.pinned_tag} if base else {})},
        date=utc_now(),
    )
    if not opts.check:
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
