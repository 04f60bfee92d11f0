"""Recording a build's device code, and reading it back for people.

The device code of a wheel (:mod:`flashkit.evidence.device_code`) is recorded once per wheel as a
``device-code`` fact that names the build it was read from. Every build records it as it is verified; a
build made before this existed gets it from ``flashkit ledger device-code ENV``, which reads the exported
wheel, checks that its sha256 is the one a build in the ledger produced, and appends the fact.

Recording it is what lets a GPU verdict follow the code: an artifact-gpu verdict on one wheel reaches
another env's build when that build's wheel carries the identical device-code digest and the env's spec
accepts such evidence (``gpu_evidence: [..., device-code]``); see :mod:`flashkit.ledger.record`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from flashkit.core import safeio
from flashkit.core.errors import FlashkitError, TierError, UnknownArtifact, UsageError
from flashkit.evidence import wheelzip
from flashkit.evidence.device_code import DeviceCodeError, of_wheel
from flashkit.ledger import record, store
from flashkit.ledger.model import Applies, Artifact, DeviceCodeFact, Fact
from flashkit.plan.spec import EnvSpec


def toolchain_of(spec: EnvSpec) -> dict[str, str]:
    """What made the code, as the spec declares it (the listing itself is the evidence; this is the label)."""
    return {
        "compiler": f"nvcc {spec.compiler.version or '(the base image’s)'} from {spec.compiler.source}",
        "accelerator": f"{spec.accelerator.kind} {spec.accelerator.version}",
        "gpu_targets": ",".join(spec.gpu_targets),
        "torch_binding": spec.torch_abi,
    }


MAX_WHEEL_BYTES = wheelzip.MAX_TOTAL_BYTES  # compressed, a wheel is never larger than what it holds


def record_for_build(root: Path, spec: EnvSpec, art: Artifact, wheel: Path) -> tuple[DeviceCodeFact | None, list[Fact]]:
    """Read ``wheel`` (the file ``art`` exported) and record its device code; (None, []) for a wheel with none
    (Triton-only). Returns the device-code fact that holds for the wheel and what was appended anywhere."""
    with _open_wheel(wheel, TierError) as fh:  # the build's own export: a tier that cannot run (15)
        return _record(root, spec, art, fh, wheel)


def _open_wheel(wheel: Path, error: type[FlashkitError]) -> BinaryIO:
    """The wheel opened for reading: a regular file of a wheel's size, or ``error`` naming it."""
    fh = safeio.open_regular(wheel, what="wheel", error=error)
    if os.fstat(fh.fileno()).st_size > MAX_WHEEL_BYTES:
        fh.close()
        raise error(f"{wheel}: larger than {MAX_WHEEL_BYTES >> 30} GiB; not a wheel a build exported")
    return fh


def _record(
    root: Path, spec: EnvSpec, art: Artifact, fh: BinaryIO, wheel: Path
) -> tuple[DeviceCodeFact | None, list[Fact]]:
    try:
        code = of_wheel(fh, str(wheel))
    except DeviceCodeError as exc:
        raise TierError(
            f"the device code of {wheel.name} cannot be read: {exc}",
            hint="the wheel is not a zip flashkit can read, or its extension not a CUDA fat binary it can list; "
            "rebuild it, or report the file",
        ) from None
    if not code.extensions:
        return None, []
    ledger, added = record.record_device_code(root, art, code, toolchain_of(spec))
    return ledger.device_codes(art.wheel_sha256)[0], added


def record_for_wheel(root: Path, spec: EnvSpec, wheel: Path) -> tuple[Artifact, DeviceCodeFact | None, list[Fact]]:
    """The device code of a wheel some build of ``spec``'s env exported (found by sha256; exit 25 otherwise). The
    file is opened once: the bytes hashed are the bytes read (exit 2 for one that is not a regular file)."""
    with _open_wheel(wheel, UsageError) as fh:  # a path the user named (--wheel): a usage error (2)
        try:
            sha = hashlib.file_digest(fh, "sha256").hexdigest()
        except OSError as exc:
            raise UsageError(f"{wheel}: cannot read the wheel: {exc.strerror}") from None
        ledger = store.load(root, str(spec.id))
        arts = [a for a in ledger.artifacts() if a.wheel_sha256 == sha]
        if not arts:
            known = sorted({a.wheel_sha256[:16] for a in ledger.artifacts()}) or ["none"]
            raise UnknownArtifact(
                f"{wheel}: sha256 {sha} is not a wheel any build of {spec.id} produced (wheels there: {', '.join(known)})",
                hint=f"pass the wheel `flashkit build {spec.id}` exported (.work/), or build it first",
            )
        art = max(arts, key=lambda a: a.date)
        fh.seek(0)
        fact, added = _record(root, spec, art, fh, wheel)
    return art, fact, added


def relations_naming(root: Path, digest: str) -> list[Applies]:
    """Every device-code relation, in any env's ledger, that rests on ``digest``."""
    return [a for ledger in record.ledgers_naming(root, {digest}) for a in ledger.applies() if a.device_code == digest]


def describe(fact: DeviceCodeFact) -> str:
    return f"device code {fact.digest} ({fact.summary()})"
