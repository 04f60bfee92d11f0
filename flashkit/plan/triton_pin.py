"""The triton the ``triton-aot`` tier compiles with: exactly the one the env pins. Pure.

An env whose torch comes from PyPI pins triton in its runtime lockfile (``py<X.Y>.txt``, every wheel's
hash); the tier installs that pin and nothing else. An env whose torch comes from its base image (ROCm,
NGC) has no triton in its lockfiles: the image brings its own build. For those, :data:`BASE_IMAGE_TRITON`
names the triton release the image's torch is built against, and ``lockfiles/<id>/triton-aot.txt``
(written by ``flashkit aot <env> --lock``, with uv, like every lockfile) pins that release from PyPI by hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.utils import canonicalize_name

from flashkit.core.errors import LockError
from flashkit.plan import lock
from flashkit.plan.spec import EnvSpec

AOT_LOCK = "triton-aot.txt"
# (accelerator kind, torch release of the base image) -> (triton release, why that one). AMD's
# pytorch-triton-rocm is built from the commit torch pins, which for torch 2.7 is triton's 3.3.1 release:
# PyPI's triton 3.3.1 carries the same AMD backend.
BASE_IMAGE_TRITON: dict[tuple[str, str], tuple[str, str]] = {
    ("rocm", "2.7.1"): ("3.3.1", "torch 2.7.1's ROCm build pins pytorch-triton-rocm 3.3.1, triton's 3.3.1 release"),
}


@dataclass(frozen=True)
class TritonPin:
    version: str
    requirements: str  # a requirements file: the pin with every hash, for pip --require-hashes --no-deps
    source: str  # the lockfile it comes from, and why, for the record


def base_image_triton(spec: EnvSpec) -> tuple[str, str] | None:
    return BASE_IMAGE_TRITON.get((spec.accelerator.kind, spec.torch))


def aot_lock_inputs(spec: EnvSpec) -> tuple[str, ...]:
    """What ``triton-aot.txt`` is resolved from: only base-image envs with a known triton have one."""
    known = base_image_triton(spec) if spec.torch_source == "base-image" else None
    return (f"triton=={known[0]}",) if known else ()


def aot_lock_header(spec: EnvSpec) -> str:
    why = base_image_triton(spec)
    return (
        f"{lock.HEADER_MARK} {spec.id} (triton for the triton-aot tier: {why[1] if why else '?'})\n"
        f"# regenerate: flashkit aot {spec.id} --lock\n"
        f"# resolver: uv {' '.join(lock.resolver_args(spec))}\n"
        f"# inputs: {' '.join(aot_lock_inputs(spec))}\n"
    )


def _pin_text(p: lock.Pin) -> str:
    return f"{p.name}=={p.version} \\\n" + " \\\n".join(f"    --hash={h}" for h in p.hashes) + "\n"


def from_lock_text(text: str, where: str, name: str = "triton") -> TritonPin | None:
    pins, _ = lock.parse(text)
    found = [p for p in pins if p.name == canonicalize_name(name)]
    if not found:
        return None
    return TritonPin(found[0].version, "".join(_pin_text(p) for p in pins), where)


def pin_for(spec: EnvSpec, runtime_lock: str, aot_lock: str | None) -> TritonPin:
    """The env's triton, hash-pinned; a LockError that says what to do when there is none."""
    env = str(spec.id)
    if spec.torch_source != "base-image":
        found = from_lock_text(runtime_lock, f"lockfiles/{env}/py{spec.python}.txt")
        if found is None:
            raise LockError(
                f"lockfiles/{env}/py{spec.python}.txt pins no triton: there is nothing the env would compile with",
                hint=f"torch {spec.torch} brings triton on Linux x86_64; re-run `flashkit lock {env}`",
            )
        # Only the triton pin: the tier needs the compiler, not the env's torch and CUDA wheels.
        return TritonPin(found.version, _only(found.requirements, "triton"), found.source)
    known = base_image_triton(spec)
    if known is None:
        raise LockError(
            f"{env}: torch comes from the base image {spec.base.ref}, and flashkit knows no triton release for it",
            hint="add the image's triton to flashkit.plan.triton_pin.BASE_IMAGE_TRITON, then "
            f"`flashkit aot {env} --lock`",
        )
    where = f"lockfiles/{env}/{AOT_LOCK}"
    if aot_lock is None:
        raise LockError(f"{where} is missing", hint=f"run `flashkit aot {env} --lock` (needs PyPI) and commit it")
    if not aot_lock.startswith(aot_lock_header(spec)):
        raise LockError(
            f"{where} was not resolved from {aot_lock_inputs(spec)[0]}", hint=f"run `flashkit aot {env} --lock`"
        )
    found = from_lock_text(aot_lock, where)
    if found is None or found.version != known[0]:
        raise LockError(f"{where} does not pin triton {known[0]}", hint=f"run `flashkit aot {env} --lock`")
    return TritonPin(found.version, found.requirements, f"{where} ({known[1]})")


def _only(requirements: str, name: str) -> str:
    pins, _ = lock.parse(requirements)
    return "".join(_pin_text(p) for p in pins if p.name == canonicalize_name(name))
