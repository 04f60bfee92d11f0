"""``flashkit verify-image REF``: may this image be run? The user's check, before ``docker run`` or in CI.

It needs no ledger and no checkout: only the registry, the project's public key and a policy.

1. Resolve REF (a tag, or a digest) to the manifest digest D the registry serves, checking the bytes hash
   to D.
2. Fetch the attestation stored for D (the cosign-style tag ``sha256-<hex>.att``); none is
   :class:`~flashkit.core.errors.AttestationMissing` (exit 28).
3. Check it: the artifact's subject is D; every envelope verifies with the public key; every statement
   names D; there is a provenance and a verification statement; the verification statement names the
   image id that D's config hashes to. Any failure is :class:`~flashkit.core.errors.AttestationInvalid`
   (exit 29).
4. Check the asked policy against the signed tiers: every requirement needs a tier the statement shows
   as passed. A weaker attestation than asked is :class:`~flashkit.core.errors.PolicyNotMet` (exit 31).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from flashkit.core.errors import AttestationInvalid, AttestationMissing, PolicyNotMet
from flashkit.ledger.gate import Policy
from flashkit.publish import attest
from flashkit.publish.registry import Registry, Target, layout_blob, layout_manifest


@dataclasses.dataclass(frozen=True)
class ImageVerdict:
    ref: str
    digest: str
    image_id: str
    key_id: str
    env: str
    input_hash: str
    attested_policy: str
    tiers: tuple[dict[str, Any], ...]
    builds: tuple[dict[str, Any], ...]


def _passed_tiers(verification: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tiers = verification.get("tiers")
    if not isinstance(tiers, list):
        raise AttestationInvalid("the verification statement lists no tiers")
    return {t["tier"]: t for t in tiers if isinstance(t, dict) and t.get("verdict") == "passed" and "tier" in t}


def check_policy(policy: Policy, verification: dict[str, Any]) -> list[str]:
    """The requirements of ``policy`` that the signed tiers do not meet (empty: all met)."""
    passed = _passed_tiers(verification)
    return [
        " or ".join(t.value for t in alts) + " did not pass"
        for alts in policy.requirements
        if not any(t.value in passed for t in alts)
    ]


def verify_image(target: Target, reference: str, reg: Registry, public_key, policy: Policy) -> ImageVerdict:
    """Steps 1-4 of the module docstring; returns what was verified, raises on the first failure."""
    found = reg.manifest(reference)
    if found is None:
        raise AttestationMissing(f"{target}:{reference} does not exist in the registry")
    _body, digest = found
    att_ref = attest.att_tag(digest)
    with tempfile.TemporaryDirectory(prefix="flashkit-verify-") as tmp:
        if reg.manifest(att_ref) is None:
            raise AttestationMissing(
                f"no attestation is attached to {target}@{digest} (looked for {target}:{att_ref})",
                hint="this image was not published by flashkit's gate, or its tag was moved to another image: do not run it",
            )
        layout = Path(tmp)
        reg.fetch(att_ref, layout, "att")
        manifest, _d = layout_manifest(layout, "att")
        checked = attest.read_artifact(manifest, lambda d: layout_blob(layout, d), digest, public_key)
    verification = checked[attest.VERIFICATION_TYPE].statement["predicate"]
    provenance = checked[attest.PROVENANCE_TYPE].statement["predicate"]
    _config, image_id = reg.config(digest)
    if verification.get("image_id") != image_id:
        raise AttestationInvalid(
            f"the signed verification is about image {verification.get('image_id')}, {target}@{digest} is image {image_id}"
        )
    unmet = check_policy(policy, verification)
    if unmet:
        attested = verification.get("policy", {})
        raise PolicyNotMet(
            f"{target}@{digest} was attested under policy {attested.get('name')} ({attested.get('requires')}); "
            f"asked {policy.name} ({policy.describe()}): " + "; ".join(unmet),
            hint="ask for a weaker policy only if you accept what it leaves unverified (--policy no-gpu)",
        )
    builds = provenance.get("builds") if isinstance(provenance.get("builds"), list) else []
    return ImageVerdict(
        ref=f"{target}:{reference}" if not reference.startswith("sha256:") else f"{target}@{reference}",
        digest=digest,
        image_id=image_id,
        key_id=checked[attest.VERIFICATION_TYPE].key_id,
        env=str(verification.get("env")),
        input_hash=str(verification.get("input_hash")),
        attested_policy=f"{verification.get('policy', {}).get('name')} ({verification.get('policy', {}).get('requires')})",
        tiers=tuple(_passed_tiers(verification).values()),
        builds=tuple(b for b in builds if isinstance(b, dict)),
    )
