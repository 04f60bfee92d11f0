"""`flashkit publish`: push an env's verified image, pull it back by digest, tag it, record it."""

from __future__ import annotations

import os
from pathlib import Path

from flashkit.cli.common import plans, root, say
from flashkit.core import paths
from flashkit.images.build import image_ref
from flashkit.images.engine import ensure_engine
from flashkit.ledger import gate, store
from flashkit.publish.push import PublishRequest, publish_image, require_a_build
from flashkit.publish.registry import REGISTRY_ENV, parse_target


def cmd_publish(args) -> int:
    r = root(args)
    policy = gate.parse_policy(args.policy)
    target = parse_target(args.registry or os.environ.get(REGISTRY_ENV))
    (plan,) = plans(r, args)
    req = PublishRequest(
        root=r,
        env_id=plan.env_id,
        input_hash=plan.input_hash,
        immutable_tag=plan.tag,
        image_ref=image_ref(plan.env_id, plan.tag),
        policy=policy,
        target=target,
        tags=(plan.spec.id.card_tag, *plan.spec.publish_tags),
        signing_key=Path(args.signing_key) if args.signing_key else None,
        inputs=plan.manifest(),
        gpu_evidence=plan.spec.gpu_evidence,
    )
    require_a_build(req)
    out = publish_image(ensure_engine(), req, dry_run=args.dry_run, say=say)
    if isinstance(out, gate.GateDecision):
        print(f"{plan.env_id}: the gate passes ({', '.join(out.passed_tiers)} passed); dry run, nothing pushed")
        return 0
    print(f"{plan.env_id}: published {out.target}@{out.digest}")
    for t in out.tags:
        print(f"  {out.target}:{t}")
    print(f"  image {out.judged_image_id} (the judged image, unchanged)")
    if out.attestation:
        print(f"  attestation {out.target}:{out.attestation['tag']} signed by key {out.attestation['key_id'][:16]}")
    print(f"  recorded in {paths.rel(r, store.ledger_path(r, plan.env_id))}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("publish", help="push an env's verified image, pull it back by digest, tag it, record it")
    p.add_argument("env", help="env id, e.g. cu130-torch211")
    p.add_argument("--registry", help=f"HOST[:PORT]/REPOSITORY (default: ${REGISTRY_ENV})")
    p.add_argument("--policy", default=gate.DEFAULT_POLICY, help="full (default), no-gpu, or a list like build,abi,cpu")
    p.add_argument("--dry-run", action="store_true", help="run the gate only; touch no registry")
    p.add_argument(
        "--signing-key", help="ed25519 private key that signs the attestation (default: $FLASHKIT_SIGNING_KEY)"
    )
    p.set_defaults(run=cmd_publish)
