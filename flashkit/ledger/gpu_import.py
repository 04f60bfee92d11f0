"""Importing an artifact-gpu result made on a GPU host: checked before a line of it enters the ledger.

A result file is a claim made elsewhere. It is accepted only when all of this holds, each failure with
its own exit code (flashkit.core.errors) and a message naming the file and field:

- 22 the result is a complete, well-formed result file: every field present with the right type, a
  valid env id (no path tricks), an input hash, a wheel digest;
- 23 the JUnit report it names travels with it, hashes to the digest it records, and recounted gives
  the same counts and the same verdict (a "passed" with failures or with no test is refused);
- 24 it ran for this env, on the env's torch major.minor and CUDA major, on a GPU whose compute
  capability the env's gpu_targets cover;
- 25 the wheel it judged is a wheel that a build in this ledger produced at that input hash.

The imported verdict's counts are the recounted ones, and its evidence names the report's and the
result's sha256, so the ledger holds what can be checked again, not what was claimed. Envs whose images
install this env's wheel (``wheel_from``) get the verdict as a cross-env ``applies`` in their own ledgers
when the wheel is theirs too (:func:`flashkit.ledger.record.propagate`): the GPU host runs one torch, and
its verdict on the wheel is the one the other torches' envs inherit.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from pathlib import Path
from typing import Any

from packaging.version import Version

from flashkit.binary.fatbin import targets_cover
from flashkit.core import safeio
from flashkit.core.errors import (
    DeviceCodeMismatch,
    EnvMismatch,
    EvidenceMismatch,
    ResultMalformed,
    SpecError,
    UnknownArtifact,
)
from flashkit.core.names import Tier, Verdict
from flashkit.core.textcheck import control_characters
from flashkit.evidence.junit import JunitError, junit_counts, suite_verdict
from flashkit.ledger import store
from flashkit.ledger.model import VerdictFact, wheel_subject
from flashkit.ledger.record import append_with_applies, tidy_reasons
from flashkit.plan.envid import EnvId
from flashkit.plan.inputhash import is_input_hash
from flashkit.plan.spec import EnvSpec

MAX_RESULT_BYTES = 1 * safeio.MIB
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_REPORT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.xml")
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": int,
    "tier": str,
    "env": str,
    "input_hash": str,
    "wheel": str,
    "judged": dict,
    "host": dict,
    "verdict": str,
    "counts": dict,
    "reasons": list,
    "evidence": dict,
    "duration_s": (int, float),
    "date": str,
}


def _field(shown: str, name: str, why: str) -> ResultMalformed:
    return ResultMalformed(
        f"{shown}: field {name}: {why}",
        hint="import the result.json that `python -m flashkit.evidence.artifact_check` wrote, unedited",
    )


def read_result(path: Path) -> tuple[dict[str, Any], bytes]:
    """The result document, its shape checked (exit 22 on anything else), and the bytes it was read from."""
    shown = str(path)
    raw = safeio.read_bytes(path, what="GPU result", error=ResultMalformed, max_bytes=MAX_RESULT_BYTES)
    text = safeio.decode_utf8(raw, shown=shown, what="GPU result", error=ResultMalformed)
    data = safeio.parse_json(
        text, shown=shown, what="GPU result", error=ResultMalformed, hint="the file is truncated or not a result"
    )
    if not isinstance(data, dict):
        raise ResultMalformed(f"{shown}: a result is a JSON object, not {type(data).__name__}")
    for name, kind in _FIELDS.items():
        if name not in data:
            raise _field(shown, name, "missing")
        if not isinstance(data[name], kind) or isinstance(data[name], bool):
            raise _field(
                shown, name, f"expected {getattr(kind, '__name__', 'a number')}, got {type(data[name]).__name__}"
            )
    if data["schema"] != 2:
        raise _field(shown, "schema", f"{data['schema']} is not a result schema this flashkit reads (2)")
    if data["tier"] != Tier.ARTIFACT_GPU:
        raise _field(shown, "tier", f"{data['tier']!r}; only artifact-gpu results are imported")
    _check_values(shown, data)
    return data, raw


def _check_values(shown: str, data: dict[str, Any]) -> None:
    try:
        EnvId.parse(data["env"])
    except SpecError:
        raise _field(shown, "env", f"{data['env']!r} is not an env id") from None
    if not is_input_hash(data["input_hash"]):
        raise _field(shown, "input_hash", f"{data['input_hash']!r} is not a flashkit input hash (fk1-<64 hex>)")
    wheel = data["judged"].get("wheel_sha256")
    code = data["judged"].get("device_code")  # optional: older GPU hosts' results do not name it
    if (
        not set(data["judged"]) <= {"wheel_sha256", "device_code"}
        or not isinstance(wheel, str)
        or not _SHA256.fullmatch(wheel)
        or (code is not None and not (isinstance(code, str) and _DIGEST.fullmatch(code)))
    ):
        raise _field(shown, "judged", "must be {'wheel_sha256': <64 hex>[, 'device_code': 'sha256:<64 hex>']}")
    if data["verdict"] not in {v.value for v in Verdict}:
        raise _field(shown, "verdict", f"{data['verdict']!r} is not one of {', '.join(v.value for v in Verdict)}")
    for key, value in data["counts"].items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _field(shown, f"counts.{key}", "not a count")
    for name in ("host", "evidence"):
        if len(data[name]) > 64:
            raise _field(shown, name, "more than 64 entries")
        for key, value in data[name].items():
            if not _KEY.fullmatch(key):
                raise _field(shown, f"{name}", f"key {key[:40]!r} is not a plain name")
            if not isinstance(value, str) or control_characters(value):
                raise _field(shown, f"{name}.{key}", "not a one-line text value")
    if not all(isinstance(r, str) for r in data["reasons"]):
        raise _field(shown, "reasons", "not a list of texts")
    try:
        dt.datetime.fromisoformat(data["date"])
    except ValueError:
        raise _field(shown, "date", f"{data['date']!r} is not an ISO 8601 instant") from None


def _recount(path: Path, data: dict[str, Any], junit: Path | None) -> tuple[dict[str, int], str]:
    """The counts and verdict the JUnit report supports, checked against the result's claims (exit 23)."""
    shown = str(path)
    name = data["evidence"].get("junit")
    claimed = data["evidence"].get("junit_sha256")
    if junit is None:
        if not isinstance(name, str) or not _REPORT_NAME.fullmatch(name):
            raise EvidenceMismatch(
                f"{shown}: field evidence.junit: the result names no JUnit report beside it ({name!r})"
            )
        junit = path.parent / name
    try:
        raw = safeio.read_bytes(junit, what="JUnit report", error=EvidenceMismatch, max_bytes=64 * safeio.MIB)
    except EvidenceMismatch as exc:
        raise EvidenceMismatch(
            f"{shown}: field evidence.junit: {exc}", hint="copy the report that came with the result beside it"
        ) from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != claimed:
        raise EvidenceMismatch(f"{junit}: sha256 {digest}, but {shown} field evidence.junit_sha256 says {claimed}")
    try:
        counts = junit_counts(raw.decode("utf-8", errors="replace"))
    except JunitError as exc:
        raise EvidenceMismatch(f"{junit}: {exc}") from None
    verdict, why = suite_verdict(counts)
    differ = {k: (data["counts"].get(k), v) for k, v in counts.items() if data["counts"].get(k) != v}
    if differ:
        shown_diff = ", ".join(f"{k} {a} claimed, {b} in the report" for k, (a, b) in sorted(differ.items()))
        raise EvidenceMismatch(f"{shown}: field counts: {shown_diff} ({junit})")
    if data["verdict"] == "passed" and verdict != "passed":
        raise EvidenceMismatch(f"{shown}: field verdict: 'passed', but the report says {verdict}: {why}")
    return counts, data["verdict"] if data["verdict"] != "passed" else verdict


def check_env(shown: str, data: dict[str, Any], spec: EnvSpec) -> None:
    """The result ran for this env, on its torch, CUDA and a GPU its targets cover (exit 24)."""
    host = data["host"]
    if data["env"] != str(spec.id):
        raise EnvMismatch(f"{shown}: field env: the result is for {data['env']!r}, not {spec.id}")
    torch = host.get("torch", "")
    series = ".".join(torch.split("+")[0].split(".")[:2])
    if spec.torch_abi == "stable":
        # The env's wheel binds to torch's stable C ABI: a run under any torch at or after the env's judges it.
        if not re.fullmatch(r"[0-9]+\.[0-9]+", series) or Version(series) < Version(spec.torch_series):
            raise EnvMismatch(
                f"{shown}: field host.torch: {torch!r} is older than the env's torch {spec.torch_series}, "
                "the oldest its stable-ABI wheel serves"
            )
    elif series != spec.torch_series:
        raise EnvMismatch(f"{shown}: field host.torch: {torch!r} is not the env's torch {spec.torch_series}.x")
    if spec.accelerator.kind == "cuda":
        # The CUDA runtime the extension ran on: torch's own, or the env's runtime carried beside it.
        field, cuda = (
            ("cuda_runtime", host["cuda_runtime"])
            if host.get("cuda_runtime")
            else (
                "torch_cuda",
                host.get("torch_cuda", ""),
            )
        )
        if cuda.split(".")[0] != str(spec.accelerator.major):
            raise EnvMismatch(f"{shown}: field host.{field}: {cuda!r}; the env is CUDA {spec.accelerator.major}")
        cap = host.get("capability", "")
        if not re.fullmatch(r"[0-9]{1,2}\.[0-9]", cap) or not targets_cover(spec.gpu_targets, cap):
            raise EnvMismatch(
                f"{shown}: field host.capability: {cap!r} is not a GPU the env's gpu_targets "
                f"{list(spec.gpu_targets)} serve"
            )


def import_result(root: Path, spec: EnvSpec, path: Path, junit: Path | None = None) -> VerdictFact:
    """Check the result against its report, the env and the ledger, and append it as a verdict."""
    data, raw = read_result(path)
    shown = str(path)
    ran = data["verdict"] in ("passed", "failed")
    counts, verdict = _recount(path, data, junit) if ran else ({}, data["verdict"])
    if ran:
        check_env(shown, data, spec)
    elif data["env"] != str(spec.id):
        raise EnvMismatch(f"{shown}: field env: the result is for {data['env']!r}, not {spec.id}")
    ledger = store.load(root, str(spec.id))
    wheel = data["judged"]["wheel_sha256"]
    holders = [a for a in ledger.artifacts(data["input_hash"]) if a.wheel_sha256 == wheel]
    if not holders:
        known = sorted({a.wheel_sha256[:16] for a in ledger.artifacts(data["input_hash"])}) or ["none"]
        raise UnknownArtifact(
            f"{shown}: field judged.wheel_sha256: {wheel} is not a wheel any build of {spec.id} at "
            f"{data['input_hash'][:20]} produced (wheels there: {', '.join(known)})",
            hint=f"run the check on the wheel `flashkit build {spec.id}` exported, or build it first",
        )
    code = data["judged"].get("device_code")
    recorded = ledger.device_code_of(wheel)
    if code is not None and recorded is not None and code != recorded:
        raise DeviceCodeMismatch(
            f"{shown}: field judged.device_code: the GPU host read device code {code} from the installed wheel, "
            f"but this ledger records {recorded} for sha256:{wheel[:16]}…",
            hint="the wheel that ran is not the one recorded; run the check again on the exported wheel",
        )
    fact = VerdictFact(
        env=str(spec.id),
        input_hash=data["input_hash"],
        date=dt.datetime.fromisoformat(data["date"]).astimezone(dt.UTC).replace(microsecond=0).isoformat(),
        tier=Tier.ARTIFACT_GPU,
        verdict=Verdict(verdict),
        subject=wheel_subject(wheel),
        counts=counts,
        reasons=tidy_reasons(data["reasons"]),
        duration_s=float(data["duration_s"]),
        host={k: v[:200] for k, v in data["host"].items()},
        source="imported",
        context={"image_id": holders[0].image_id, "wheel_sha256": wheel, **({"device_code": code} if code else {})},
        evidence={
            "result_sha256": hashlib.sha256(raw).hexdigest(),
            **({"junit_sha256": data["evidence"]["junit_sha256"]} if ran else {}),
        },
    )
    append_with_applies(root, str(spec.id), [fact])  # and to the envs that install this wheel (wheel_from)
    return fact
