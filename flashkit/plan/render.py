"""Rendering an env into a Dockerfile: a pure function of its :class:`~flashkit.plan.plan.Plan` and the
build host's memory (passed in, never probed here). Same inputs, same bytes.
"""

from __future__ import annotations

import datetime
import functools
import re
from dataclasses import dataclass

import jinja2

from flashkit.core import paths
from flashkit.core.errors import SpecError
from flashkit.plan import compat, inputhash, lock
from flashkit.plan.plan import Plan
from flashkit.plan.spec import EnvSpec

RUNTIME_UID = 10001  # fixed, above the distributions' dynamic range, so file ownership is predictable
APT_MIRROR_DEFAULT = "http://deb.debian.org/debian"  # plain http works in containers without the proxy CA
PIP_INDEX_DEFAULT = "https://pypi.org/simple"
UBUNTU_UNPINNED = (
    "Unpinned on purpose: Ubuntu's archive is unreachable from this project's hosts, so exact versions "
    "cannot be looked up or verified here; the base image digest fixes the starting point."
)


@dataclass(frozen=True)
class JobSizing:
    max_jobs: int
    nvcc_threads: int


def job_sizing(host_mem_gib: int) -> JobSizing:
    """Compile parallelism that fits the build host's memory (compile OOM is the classic failure).

    nvcc on attention kernels peaks around 3-4 GiB per thread; budget 4 GiB per (job x nvcc thread)
    and keep a quarter of memory for everything else. Cores are left to ninja's own default.
    """
    if host_mem_gib < 1:
        raise ValueError(f"build host memory must be at least 1 GiB, got {host_mem_gib}")
    nvcc_threads = 2 if host_mem_gib >= 16 else 1
    max_jobs = max(1, min(16, (host_mem_gib * 3 // 4) // (4 * nvcc_threads)))
    return JobSizing(max_jobs=max_jobs, nvcc_threads=nvcc_threads)


def _apt_packages(spec: EnvSpec) -> tuple[list[str], list[str], str | None]:
    """(builder packages, runtime packages, reason they are unpinned or None) that the Dockerfile installs.

    Debian-flavoured images install none: their bases are made by mmdebstrap with every package at the
    version lockfiles/<env>/base.txt records (:mod:`flashkit.plan.baselock`), so no apt runs in a build.
    """
    if spec.base.flavor == "cuda":
        py = f"python{spec.python}"
        return [f"{py}", f"{py}-dev", f"{py}-venv", "g++"], [py, f"{py}-venv"], UBUNTU_UNPINNED
    return [], [], None


ZIP_EPOCH_FLOOR = 315532800  # 1980-01-01T00:00:00Z


def _toolchain(spec: EnvSpec) -> tuple[str | None, str | None]:
    """CUDA_HOME of the spec's nvcc, and the C++ compiler of the extension where it is not the suite's g++."""
    if spec.compiler.source == "debian":
        gcc = compat.DEBIAN_SUITES[spec.base.suite].extension_gcc if spec.base.suite else None
        return "/usr", f"g++-{gcc}" if gcc else None
    if spec.compiler.source == "pypi":
        return f"/opt/venv/lib/python{spec.python}/site-packages/nvidia/cu{spec.accelerator.major}", None
    return ("/usr/local/cuda" if spec.base.flavor == "cuda" else None), None


def context(spec: EnvSpec, *, lock_text: str, build_lock_text: str, input_hash: str, host_mem_gib: int) -> dict:
    flavor = spec.base.flavor
    sizing = job_sizing(host_mem_gib)
    venv = flavor in ("debian", "cuda")
    apt_builder, apt_runtime, unpinned = _apt_packages(spec)
    py = "/opt/venv/bin/python" if venv else "python3"
    cuda_home, extension_cxx = _toolchain(spec)
    if spec.accelerator.kind == "cuda":
        arch_env, arch_value = "TORCH_CUDA_ARCH_LIST", ";".join(spec.gpu_targets)
    else:
        arch_env, arch_value = "PYTORCH_ROCM_ARCH", ";".join(spec.gpu_targets)
    # The image's own Python's set (the other Pythons' sets are production requirements, not image inputs).
    runtime_lock = f"{paths.LOCKFILES_DIR}/{spec.id}/py{spec.python}.txt"
    build_lock = f"{paths.LOCKFILES_DIR}/{spec.id}/build.txt"
    has_build_pins = bool(lock.parse(build_lock_text)[0])
    # buildah (1.28) keys a RUN step's layer cache on its text only, not on what a bind mount holds, so the
    # lock's digest goes into the mount's target: a changed lock is a changed step, never a stale layer.
    rt_mount = {"src": runtime_lock, "sha256": inputhash.sha256_text(lock_text)}
    build_mount = {"src": build_lock, "sha256": inputhash.sha256_text(build_lock_text)}
    if flavor in ("ngc", "rocm"):
        compiler_note = f"the {flavor} base image itself carries the compiler (torch lives in it)"
    else:
        compiler_note = "no compiler"
    return {
        "env_id": str(spec.id),
        "flavor": flavor,
        "torch": spec.torch,
        "python": spec.python,
        "cxx11_abi": spec.cxx11_abi,
        "accel_kind": spec.accelerator.kind,
        "accel_version": spec.accelerator.version,
        "accel_major": spec.accelerator.major,
        "accel_label": str(spec.accelerator),
        "gpu_targets": list(spec.gpu_targets),
        "backends": list(spec.backends),
        "base_ref": spec.base.ref,
        "base_digest": spec.base.digest,
        "base_image": spec.base.image,
        "runtime_image": spec.base.runtime_image,
        "runtime_ref": spec.base.runtime_ref or spec.base.ref,
        "runtime_digest": spec.base.runtime_digest if spec.base.runtime_ref else spec.base.digest,
        "apt_suite": spec.base.suite if flavor == "debian" else None,
        "apt_components": "main contrib non-free" if spec.compiler.source == "debian" else "main",
        "apt_mirror_default": APT_MIRROR_DEFAULT,
        "pip_index_default": PIP_INDEX_DEFAULT,
        "apt_builder": apt_builder,
        "apt_runtime": apt_runtime,
        "apt_unpinned_reason": unpinned,
        "venv": venv,
        "system_python": f"python{spec.python}",
        "py": py,
        "pip_env": "" if venv else "PIP_BREAK_SYSTEM_PACKAGES=1 ",
        "builder_locks": [rt_mount, build_mount] if has_build_pins else [rt_mount],
        "runtime_locks": [rt_mount],
        "torch_abi": spec.torch_abi,
        "pypi_nvcc": spec.compiler.source == "pypi",
        "cuda_home": cuda_home,
        "extension_cxx": extension_cxx,
        "arch_env": arch_env,
        "arch_value": arch_value,
        "build_cuda": 1 if "cuda" in spec.backends else 0,
        "kernel_source": spec.kernel_source,
        "max_jobs": sizing.max_jobs,
        "nvcc_threads": sizing.nvcc_threads,
        "host_mem_gib": host_mem_gib,
        "uid": RUNTIME_UID,
        "runtime_compiler_note": compiler_note,
        "lock_sha256": inputhash.sha256_text(lock_text),
        "build_lock_sha256": inputhash.sha256_text(build_lock_text),
        "input_hash": input_hash,
        "input_hash_short": input_hash.split("-", 1)[-1][:16],
        "source_date_epoch": source_date_epoch(spec),
    }


def source_date_epoch(spec: EnvSpec) -> int:
    """The instant the env's lock resolves at, as SOURCE_DATE_EPOCH for the wheel build.

    A spec input rather than the build time, so every build of one input hash stamps the same dates
    into the wheel; zip cannot store dates before 1980, hence the floor.
    """
    instant = datetime.datetime.fromisoformat(spec.lock_exclude_newer.replace("Z", "+00:00"))
    return max(int(instant.timestamp()), ZIP_EPOCH_FLOOR)


@functools.lru_cache(maxsize=4)
def _compile(template_text: str) -> jinja2.Template:
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # the output is a Dockerfile, not HTML; values are validated by flashkit.plan.specfile
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return env.from_string(template_text)


def render_dockerfile(plan: Plan, *, host_mem_gib: int) -> str:
    """The Dockerfile of ``plan``. Pure and deterministic: same plan and memory, same string."""
    ctx = context(
        plan.spec,
        lock_text=plan.locks.runtime,
        build_lock_text=plan.locks.build,
        input_hash=plan.input_hash,
        host_mem_gib=host_mem_gib,
    )
    src = plan.wheel_source
    ctx["wheel_from"] = (
        {
            "env": src.env_id,
            "input_hash": src.input_hash,
            # The default name a local build of the source gives its builder; `flashkit build` passes the
            # one it really has (another namespace) as a build argument, which is not in any image.
            "image": f"flashkit/{src.env_id}:{src.tag}-builder",
        }
        if src
        else None
    )
    try:
        text = _compile(plan.template).render(**ctx)
    except jinja2.TemplateSyntaxError as exc:
        raise SpecError(f"{paths.TEMPLATE}:{exc.lineno}: template syntax error: {exc.message}") from None
    except jinja2.TemplateError as exc:  # StrictUndefined: a name the template uses that flashkit does not set
        raise SpecError(
            f"{paths.TEMPLATE}: the template cannot be rendered for {plan.env_id}: {exc}",
            hint="use only the names flashkit.plan.render.context provides",
        ) from None
    # Tidy whitespace the template's conditionals leave behind; deterministic by construction.
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n") + "\n"
