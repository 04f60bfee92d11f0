"""Trust commands: `key generate` (the project's signing key pair) and `verify-image` (a user's check)."""

from __future__ import annotations

import os
from pathlib import Path

from flashkit.cli.common import root
from flashkit.core import outputs
from flashkit.core.errors import KeyFileError, SpecError
from flashkit.ledger import gate
from flashkit.publish import attest
from flashkit.publish.registry import Registry, access, parse_image_ref
from flashkit.publish.verify_image import verify_image


def cmd_key(args) -> int:
    try:
        repo = root(args)
    except SpecError:  # not inside a checkout: nothing to keep the key out of
        repo = None
    outputs.check_path(args.folder, flag="key generate", error=KeyFileError)
    priv, pub = attest.generate_keys(Path(args.folder), repo)
    print(f"private key {priv} (mode 0600): keep it out of the repository; publishers set {attest.SIGNING_KEY_ENV}")
    print(f"public key  {pub}: give it to users (`flashkit verify-image REF --key {pub.name}`)")
    return 0


def cmd_verify_image(args) -> int:
    target, reference = parse_image_ref(args.ref)
    key_path = args.key or os.environ.get(attest.VERIFY_KEY_ENV)
    if not key_path:
        raise KeyFileError(
            f"no public key: pass --key PUB or set {attest.VERIFY_KEY_ENV}",
            hint="the project's public key (flashkit.pub) is what the attestation must be signed with",
        )
    public_key = attest.load_public_key(Path(key_path))
    policy = gate.parse_policy(args.policy)
    with access(target) as acc:
        v = verify_image(target, reference, Registry(target, acc), public_key, policy)
    print(f"verified: {v.ref}")
    print(f"  digest    {v.digest}")
    print(f"  image id  {v.image_id}")
    print(f"  env       {v.env} @ {v.input_hash}")
    print(
        f"  signed by key {v.key_id[:16]}; attested policy {v.attested_policy}; asked {policy.name} ({policy.describe()})"
    )
    for t in v.tiers:
        counts = " ".join(f"{k}={n}" for k, n in sorted(t.get("counts", {}).items()))
        where = ", ".join(
            f"{k}={val}"
            for k, val in sorted(t.get("where", {}).items())
            if k in ("gpu", "driver", "torch", "cuda_runtime", "hostname", "host")
        )
        print(f"  {t.get('tier')}: passed ({counts}){' on ' + where if where else ''}")
        rel = t.get("relation")
        if isinstance(rel, dict) and rel.get("kind") == "device-code":
            print(
                f"    via device code {rel.get('device_code')}: run in wheel {rel.get('judged_wheel')} of "
                f"{rel.get('source_env')}; this image's wheel {rel.get('this_wheel')} carries the same cubins and PTX"
            )
            print(f"    covers {rel.get('covers')}")
        elif isinstance(rel, dict):
            print(f"    {rel.get('kind')}: the wheel {rel.get('judged_wheel')} of {rel.get('source_env')}")
    for b in v.builds:
        print(f"  built by {b.get('host')} with {b.get('tool')} ({b.get('storage')}) on {b.get('date')}")
    print(f"run it by digest (a tag can move after this check): docker run --rm {target}@{v.digest}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("key", help="make the ed25519 key pair that signs attestations")
    ksub = p.add_subparsers(dest="key_action", required=True)
    g = ksub.add_parser(
        "generate", help="write FOLDER/flashkit.key (0600) and FOLDER/flashkit.pub; never inside the repository"
    )
    g.add_argument("folder", help="where to write the pair, outside the repository (e.g. ~/.config/flashkit)")
    p.set_defaults(run=cmd_key)

    p = sub.add_parser("verify-image", help="check an image's signed attestation and policy before running it")
    p.add_argument("ref", help="HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:...")
    p.add_argument("--key", help=f"the project's public key, PEM (default: ${attest.VERIFY_KEY_ENV})")
    p.add_argument(
        "--policy", default=gate.DEFAULT_POLICY, help="tiers that must have passed: full (default), no-gpu, or a list"
    )
    p.set_defaults(run=cmd_verify_image)


__all__ = ["register"]
