"""gc's plan: what it keeps for this checkout and what it removes."""

from __future__ import annotations

from pathlib import Path

from flashkit.images import gc
from flashkit.images.build import image_ref
from flashkit.plan.plan import plan_of
from flashkit.plan.specfile import load_all

REPO = Path(__file__).resolve().parents[1]


PLANS = [plan_of(REPO, s) for s in load_all(REPO)]


def test_keeps_current_input_hash_and_latest_of_every_env():
    keep = gc.keep_tags(PLANS)
    for plan in PLANS:
        short, env = plan.tag, plan.env_id
        assert {image_ref(env, short), image_ref(env, f"{short}-builder"), image_ref(env, "latest-local")} <= keep


def test_plan_removes_old_hashes_and_check_rebuilds_only_under_the_prefix():
    current = next(p.tag for p in PLANS if p.env_id == "cu130-torch211")
    tags = [
        f"flashkit/cu130-torch211:{current}",
        f"flashkit/cu130-torch211:{current}-builder",
        f"flashkit/cu130-torch211:{current}-check",
        "flashkit/cu130-torch211:fk1-0123456789abcdef",
        "flashkit/cu124-torch27:latest-local-builder",
        "flashkit/debian:bookworm-0123456789ab",
        "127.0.0.1:5000/org/flash:torch2.11-cu13.0-py3.11",
        "debian:bookworm",
    ]
    p = gc.choose(tags, gc.keep_tags(PLANS))
    assert set(p.keep) == {tags[0], tags[1], tags[4]}
    assert set(p.remove) == {tags[2], tags[3], tags[5]}  # bases live in buildah's storage, not the engine's
    assert gc.choose(tags, set(), prefix="flashkit-gc-test/") == gc.Collection(keep=(), remove=())
