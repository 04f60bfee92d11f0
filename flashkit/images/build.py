"""Building an env: the builder and runtime images with buildah, reproducibly, and the exported wheel.

The build context is a fresh directory written from the :class:`~flashkit.plan.plan.Plan`'s bytes (the
rendered Dockerfile, the env's lockfiles, the kernel sources), so what was hashed is exactly what is
built and nothing else in the checkout can change a layer. ``buildah build --timestamp SOURCE_DATE_EPOCH
--layers --format oci`` (see :mod:`flashkit.images.buildah` for why buildah) builds each stage on the
env's mmdebstrap bases (:mod:`flashkit.images.base`), so the same input hash gives the same base,
builder and runtime image ids on any host. The runtime image is copied unchanged into the engine, where
the tiers run it; the wheel is copied out of the builder image. Images are tagged by input hash
(immutable) and ``latest-local`` (moving); an image whose input-hash tag exists is not rebuilt unless
asked.

The result is cached in ``.work/builds/<env>-<input hash>.json`` (only this module writes there). The
cache is a convenience: the ledger, not this file, is the evidence, and a clone without ``.work/``
loses nothing but the wheel's local path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

from flashkit.core import safeio
from flashkit.core.atomic import utc_now, write_json_atomic
from flashkit.core.digests import sha256_file
from flashkit.core.errors import BuildError, SpecError
from flashkit.images import base, buildah, site_inputs
from flashkit.images.buildah import Buildah
from flashkit.images.container import image_inspect
from flashkit.images.engine import Engine
from flashkit.plan import baselock
from flashkit.plan.envid import EnvId
from flashkit.plan.inputhash import is_input_hash
from flashkit.plan.plan import Plan
from flashkit.plan.render import job_sizing, render_dockerfile, source_date_epoch

log = logging.getLogger(__name__)

IMAGE_REPO = "flashkit"
NAMESPACE_ENV = "FLASHKIT_IMAGE_NAMESPACE"  # another namespace for this host's images (default flashkit)
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
    runtime_base_id: str | None = None  # the runtime stage's base (base_image_id is the builder's)
    builder: dict = dataclasses.field(default_factory=dict)  # host, tool, storage, cold: who built it
    # {"env", "input_hash"}: the build of another env whose wheel (the very file) this image installs;
    # None: this env built its own. The ledger's artifact carries it, and inherits that wheel's verdicts.
    wheel_from: dict | None = None
    # The runtime image's layers (rootfs diff ids, base first): when two builds of one input hash give two
    # runtime ids, these say which step's layer differs, long after either image is gone.
    runtime_layers: tuple[str, ...] | None = None

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        for name in _OPTIONAL:
            if data[name] is None:
                del data[name]  # results written before the field existed stay as they were
        if data.get("runtime_layers") is not None:
            data["runtime_layers"] = list(data["runtime_layers"])
        return data


_RESULT_TYPES = {f.name: f.type for f in dataclasses.fields(BuildResult)}
_OPTIONAL = {"wheel_from", "runtime_layers"}  # result files written before they existed load unchanged


def namespace() -> str:
    value = os.environ.get(NAMESPACE_ENV) or IMAGE_REPO
    if not re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*", value):
        raise BuildError(f"{NAMESPACE_ENV}={value!r} is not an image namespace (lowercase letters, digits, . _ -)")
    return value


def image_ref(env_id: str, tag: str) -> str:
    return f"{namespace()}/{env_id}:{tag}"


def shared_builder_name(builder_ref: str) -> str:
    """The name a ``wheel_from`` env's Containerfile starts from: the source's builder in the fixed namespace.

    buildah writes a FROM name into the image's history, so the source builder's namespaced name would
    make the same inputs give different ids under different FLASHKIT_IMAGE_NAMESPACE values. The fixed
    name is the one the rendered Dockerfile defaults to; its tag is the source's input hash, so it names
    exactly one build whatever host made it.
    """
    return f"{IMAGE_REPO}/{builder_ref.partition('/')[2]}"


def _name_source_builder(bh: Buildah, src: BuildResult) -> str:
    """``src``'s builder under its shared name (a second tag on the same image when the namespace is not the default)."""
    fixed = shared_builder_name(src.builder_ref)
    if fixed != src.builder_ref:
        bh.run("tag", src.builder_id, fixed)
    return fixed


def result_path(root: Path, env_id: str, input_hash: str) -> Path:
    return root / WORK / "builds" / f"{env_id}-{input_hash}.json"


def _check_result(data: object, shown: str) -> BuildResult:
    """A cached result, typed and checked; anything else is a clear error naming the file and field."""
    if not isinstance(data, dict):
        raise BuildError(f"{shown}: a build result must be a JSON object, not {type(data).__name__}")
    missing = sorted(set(_RESULT_TYPES) - _OPTIONAL - set(data))
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
    if not all(isinstance(data[k], dict) for k in ("context", "builder")) or not isinstance(data["built"], bool):
        raise BuildError(f"{shown}: fields context/built have the wrong type", hint="delete the file and rebuild")
    _check_wheel_from(data.get("wheel_from"), shown)
    layers = data.get("runtime_layers")
    if layers is not None:
        if not isinstance(layers, list) or not all(isinstance(x, str) and IMAGE_ID_RE.fullmatch(x) for x in layers):
            raise BuildError(
                f"{shown}: field runtime_layers is not a list of layer digests (sha256:<64 hex>)",
                hint="delete the file and rebuild",
            )
        data = {**data, "runtime_layers": tuple(layers)}
    return BuildResult(**data)


def _check_wheel_from(value: object, shown: str) -> None:
    if value is None:
        return
    ok = isinstance(value, dict) and set(value) == {"env", "input_hash"} and is_input_hash(value["input_hash"])
    try:
        EnvId.parse(value["env"] if ok else "")  # type: ignore[index]
    except SpecError:
        ok = False
    if not ok:
        raise BuildError(
            f"{shown}: field wheel_from = {value!r} is not {{'env': <env id>, 'input_hash': <input hash>}}",
            hint="delete the file and rebuild",
        )


def load_result(root: Path, env_id: str, input_hash: str) -> BuildResult | None:
    """The cached result of building ``env_id`` at ``input_hash``, or None when there is none."""
    p = result_path(root, env_id, input_hash)
    if not p.exists() and not p.is_symlink():
        return None
    shown = safeio.describe(p, root)
    data = safeio.read_json(
        p,
        what="build result",
        error=BuildError,
        max_bytes=MAX_RESULT_BYTES,
        root=root,
        hint="delete the file and rebuild",
    )
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


def _tail(path: Path, n: int = 40) -> str:
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-n:])


def export_wheel(bh: Buildah, builder_ref: str, dest: Path) -> Path:
    """Copy the single flash_kernels wheel out of the builder image into ``dest``."""
    found = [p for p in buildah.copy_out(bh, builder_ref, "/wheels", dest) if p.name.endswith(".whl")]
    if len(found) != 1 or not found[0].name.startswith("flash_kernels-"):
        raise BuildError(
            f"expected exactly one flash_kernels wheel in /wheels of {builder_ref}, found {[p.name for p in found]}",
            hint="the builder stage must leave the wheel it built in /wheels",
        )
    return found[0]


def _up_to_date(root: Path, plan: Plan, engine: Engine, bh: Buildah, refs: tuple[str, str]) -> BuildResult | None:
    existing = load_result(root, plan.env_id, plan.input_hash)
    if existing is None or not Path(existing.wheel_path).exists():
        return None
    runtime, builder = image_inspect(engine, refs[0]), buildah.inspect(bh, refs[1])
    if runtime and builder and runtime["Id"] == existing.runtime_id and builder.image_id == existing.builder_id:
        return dataclasses.replace(existing, built=False)
    return None


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    rebuild: bool = False
    no_cache: bool = False
    check: bool = False  # the second build of `build --check`: own tags, no cache, not the build of record
    host_mem_gib: int = 8
    site: site_inputs.SiteInputs = dataclasses.field(default_factory=lambda: site_inputs.SiteInputs({}, None, None))
    on_line: Callable[[str], None] = lambda line: None
    buildah_root: str | None = None  # another storage: an independent builder (default $FLASHKIT_BUILDAH_ROOT)


def host_identity() -> str:
    """This host, without saying more than needed: its name and a short hash of its machine id."""
    try:
        mid = Path("/etc/machine-id").read_text().strip()
    except OSError:
        mid = ""
    return f"{socket.gethostname()[:64]} ({hashlib.sha256(mid.encode()).hexdigest()[:12] if mid else 'no machine-id'})"


def _build_args(
    plan: Plan, bases: dict[str, base.BaseImage], opts: BuildOptions, wheel_builder: str | None = None
) -> list[str]:
    args = [
        "build",
        "--timestamp",
        str(source_date_epoch(plan.spec)),
        "--format",
        "oci",
        "--layers",
        # A failed or interrupted build otherwise leaves its stage containers behind, each pinning its
        # image's layers (gigabytes) until someone removes it.
        "--force-rm",
        "--network",
        "host",
        # No --label here: buildah writes command-line labels into every intermediate image as well, and a
        # later build with other labels reuses those as its cache. Each history entry names its parent
        # intermediate by id ("FROM <id>"), so the runtime id then depended on which earlier build (which
        # env, which input hash) had left the cache: one input hash gave two runtime ids with identical
        # layers. The Dockerfile's own LABEL step sets io.flashkit.env and io.flashkit.input-hash instead.
    ]
    if opts.no_cache:
        args.append("--no-cache")
    if bases:
        args += [
            "--build-arg",
            f"BASE_IMAGE={bases['builder'].tag}",
            "--build-arg",
            f"RUNTIME_IMAGE={bases['runtime'].tag}",
        ]
    if wheel_builder:
        args += ["--build-arg", f"WHEEL_BUILDER_IMAGE={wheel_builder}"]
    return args


def wheel_source_build(root: Path, plan: Plan, engine: Engine, opts: BuildOptions) -> BuildResult | None:
    """The build of the env whose wheel ``plan`` installs (built now when it is not up to date), or None
    when ``plan`` compiles its own. A check build still takes the source's build of record: what is
    checked is this env's image, not the source's again."""
    if plan.wheel_source is None:
        return None
    log.info("%s installs the wheel of %s: building that first if needed", plan.env_id, plan.wheel_source.env_id)
    src_opts = dataclasses.replace(opts, check=False, rebuild=False, no_cache=False)
    return build_plan(root, plan.wheel_source, engine, src_opts)


def make_bases(plan: Plan, bh: Buildah, *, mirror: str | None, log_path: Path) -> dict[str, base.BaseImage]:
    """The builder and runtime bases of a debian-flavoured plan in ``bh``'s storage (made, or reused by tag)."""
    if plan.spec.base.flavor != "debian":
        return {}
    lock, problems = baselock.parse(plan.locks.base or "")
    if lock is None:
        raise BuildError(f"{plan.env_id}: the base lock is not valid: {'; '.join(problems)}")
    return {
        stage: base.make_base(
            bh, plan.spec, lock, stage, namespace=base.BASE_NAMESPACE, mirror=mirror, log_path=log_path
        )
        for stage in baselock.STAGES
    }


def build_plan(root: Path, plan: Plan, engine: Engine, opts: BuildOptions) -> BuildResult:
    """Build ``plan``'s builder and runtime images and export its wheel (see the module docstring)."""
    plan.require_consistent_locks()
    env_id, h = plan.env_id, plan.input_hash
    short = f"{plan.tag}-check" if opts.check else plan.tag
    rebuild, no_cache = (True, True) if opts.check else (opts.rebuild, opts.no_cache)
    opts = dataclasses.replace(opts, rebuild=rebuild, no_cache=no_cache)
    runtime_ref, builder_ref = image_ref(env_id, short), image_ref(env_id, f"{short}-builder")
    bh = buildah.find_buildah(opts.buildah_root)
    if not opts.rebuild:
        cached = _up_to_date(root, plan, engine, bh, (runtime_ref, builder_ref))
        if cached is not None:
            log.info("%s is up to date (input hash %s); --rebuild to build again", env_id, h)
            return cached

    dockerfile = render_dockerfile(plan, host_mem_gib=opts.host_mem_gib)
    suffix = "-check" if opts.check else ""
    ctx = root / WORK / "ctx" / f"{env_id}-{h}{suffix}"
    write_context(plan, dockerfile, ctx)
    log_path = root / WORK / "logs" / f"{env_id}-{h}{suffix}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"# flashkit build {env_id} input hash {h} at {utc_now()} with {bh.describe()}\n")
    log.info("building %s (input hash %s) with %s; log %s", env_id, h, bh.describe(), log_path)

    src = wheel_source_build(root, plan, engine, opts)
    start = time.monotonic()
    cold = buildah.inspect(bh, builder_ref) is None and buildah.inspect(bh, runtime_ref) is None
    bases = make_bases(plan, bh, mirror=opts.site.urls.get("debian_mirror"), log_path=log_path)
    refs = {"builder": builder_ref, "runtime": runtime_ref}
    args = _build_args(plan, bases, opts, _name_source_builder(bh, src) if src else None)
    ids = _build_stages(bh, ctx, refs, args, opts, log_path, env_id)
    buildah.push_to_engine(bh, ids["runtime"], runtime_ref, engine)
    seconds = time.monotonic() - start
    if not opts.check:
        _tag_latest(engine, bh, env_id, ids)

    wheel_dir = root / WORK / "wheels" / env_id / h / ("check" if opts.check else "")
    wheel, digest = _export_checked_wheel(bh, builder_ref, wheel_dir, plan, src)
    runtime_attrs, builder_info = image_inspect(engine, runtime_ref), buildah.inspect(bh, builder_ref)
    runtime_info = buildah.inspect(bh, ids["runtime"])
    result = BuildResult(
        env=env_id,
        input_hash=h,
        runtime_ref=runtime_ref,
        runtime_id=ids["runtime"],
        builder_ref=builder_ref,
        builder_id=ids["builder"],
        runtime_size=int(runtime_attrs["Size"]),
        builder_size=builder_info.size if builder_info else 0,
        wheel_path=str(wheel),
        wheel_sha256=digest,
        lock_sha256=hashlib.sha256(plan.locks.runtime.encode()).hexdigest(),
        base_image_id=bases["builder"].image_id if bases else None,
        runtime_base_id=bases["runtime"].image_id if bases else None,
        builder={"host": host_identity(), **bh.identity(), "cold": cold},
        built=True,
        seconds=round(seconds, 1),
        log_path=str(log_path),
        wheel_from={"env": src.env, "input_hash": src.input_hash} if src else None,
        runtime_layers=runtime_info.layers if runtime_info else None,
        context={"client": bh.describe(), **opts.site.record(), **({"base": bases["builder"].tag} if bases else {})},
        date=utc_now(),
    )
    if not opts.check:
        write_json_atomic(result_path(root, env_id, h), result.to_json())
    shutil.rmtree(ctx, ignore_errors=True)
    return result


def _build_stages(
    bh: Buildah, ctx: Path, refs: dict[str, str], args: list[str], opts: BuildOptions, log_path: Path, env_id: str
) -> dict[str, str]:
    """Build each stage of the context's Dockerfile under its ref; the image ids by stage."""
    sizing = job_sizing(opts.host_mem_gib)
    jobs = {"build-jobs": f"MAX_JOBS={sizing.max_jobs}\nNVCC_THREADS={sizing.nvcc_threads}\n"}
    ids: dict[str, str] = {}
    with site_inputs.SecretFiles(opts.site, jobs) as secrets:
        for stage in STAGES:
            iid = ctx.parent / f"{ctx.name}.{stage}.iid"
            cmd = [*args, *secrets, "--target", stage, "-t", refs[stage], "--iidfile", str(iid)]
            rc = buildah.stream(bh, [*cmd, "-f", str(ctx / "Dockerfile"), str(ctx)], log_path, opts.on_line)
            if rc != 0:
                what, tail = f"building the {stage} stage of {env_id}", _tail(log_path)
                raise buildah.no_space_error(bh, what, tail, log_path) or BuildError(
                    f"{what} failed (exit {rc})", detail=tail, hint=f"full log: {log_path}"
                )
            ids[stage] = iid.read_text().strip()
    return ids


def _export_checked_wheel(
    bh: Buildah, builder_ref: str, wheel_dir: Path, plan: Plan, src: BuildResult | None
) -> tuple[Path, str]:
    """The builder's wheel, exported with its SHA256SUMS; an env that installs another's wheel must hold
    exactly that env's file (its builder stage is that env's builder image)."""
    wheel = export_wheel(bh, builder_ref, wheel_dir)
    digest = sha256_file(wheel)
    if src is not None and digest != src.wheel_sha256:
        raise BuildError(
            f"{plan.env_id}: the wheel in its builder stage ({digest[:12]}) is not {src.env}'s "
            f"({src.wheel_sha256[:12]}), though the stage is that env's builder image",
            hint=f"rebuild both: `flashkit build {src.env} --rebuild` then this env",
        )
    (wheel_dir / "SHA256SUMS").write_text(f"{digest}  {wheel.name}\n")
    return wheel, digest


def _tag_latest(engine: Engine, bh: Buildah, env_id: str, ids: dict[str, str]) -> None:
    """Move ``latest-local`` (engine: runtime) and ``latest-local-builder`` (buildah: builder)."""
    bh.run("tag", ids["builder"], image_ref(env_id, "latest-local-builder"))
    repo, _, tag = image_ref(env_id, "latest-local").rpartition(":")
    sdk = engine.sdk()
    try:
        sdk.images.get(ids["runtime"]).tag(repo, tag)
    finally:
        sdk.close()


def human_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"
