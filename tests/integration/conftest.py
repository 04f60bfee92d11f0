"""Real-docker tests: skipped, with the reason, when no engine answers."""

from __future__ import annotations

import pytest

from flashkit.images.engine import engine_available, ensure_engine


@pytest.fixture(scope="session")
def engine():
    ok, why = engine_available()
    if not ok:
        pytest.skip(why)
    return ensure_engine(start=False)


@pytest.fixture(scope="session")
def built_env(engine):
    """``built_env(env_id, builder=False)``: the build result of an env at its current input hash.

    Skips, with the command that builds it, when ``flashkit build`` has not made
    that env's images (and wheel) at the current input hash in this checkout.
    FLASHKIT_TEST_BUILT=newest takes the newest build whose images still exist
    instead, whatever its input hash: for developing tests while the sources
    move on; CI leaves it unset.
    """
    import json
    import os
    from pathlib import Path

    from kitsupport import input_hash

    from flashkit.images import build
    from flashkit.images.container import image_inspect

    root = Path(__file__).resolve().parents[2]

    def newest(env_id: str, builder: bool) -> build.BuildResult | None:
        found = []
        for p in build.result_path(root, env_id, "x").parent.glob(f"{env_id}-fk*.json"):
            res = build.BuildResult(**json.loads(p.read_text()))
            refs = [res.runtime_ref] + ([res.builder_ref] if builder else [])
            if res.env == env_id and all(r and image_inspect(engine, r) for r in refs):
                found.append(res)
        return max(found, key=lambda r: r.date, default=None)

    def get(env_id: str, builder: bool = False) -> build.BuildResult:
        if os.environ.get("FLASHKIT_TEST_BUILT") == "newest":
            res = newest(env_id, builder)
        else:
            res = build.load_result(root, env_id, input_hash(root, env_id))
        how = f"run `flashkit build {env_id}`"
        if res is None:
            pytest.skip(f"{env_id} is not built at its current input hash; {how}")
        if builder and image_inspect(engine, res.builder_ref) is None:
            _builder_into_engine(engine, res)
        refs = [res.runtime_ref] + ([res.builder_ref] if builder else [])
        for ref in refs:
            if not ref or image_inspect(engine, ref) is None:
                pytest.skip(f"{env_id}: image {ref} of the current input hash is gone; {how}")
        if not res.wheel_path or not Path(res.wheel_path).is_file():
            pytest.skip(f"{env_id}: its exported wheel {res.wheel_path} is gone; {how}")
        return res

    return get


def _builder_into_engine(engine, res) -> None:
    """Builder images live in buildah's storage; copy one into the engine (same id) for tests that run it."""
    from flashkit.images import buildah

    bh = buildah.find_buildah()
    info = buildah.inspect(bh, res.builder_ref)
    if info is not None and info.image_id == res.builder_id:
        buildah.push_to_engine(bh, info.image_id, res.builder_ref, engine)


@pytest.fixture(scope="session")
def debian_base(engine):
    """A small flashkit/debian image in the engine (the bases are made in buildah's storage, not the engine).

    The main job's (cu130-torch211's) runtime base, named as the build names it, is copied into the engine
    (same id); skips with the command that makes it when buildah's storage does not have it.
    """
    from pathlib import Path

    from flashkit.images import base, buildah
    from flashkit.plan import baselock
    from flashkit.plan.plan import load_plan

    plan = load_plan(Path(__file__).resolve().parents[2], "cu130-torch211")
    lock, _ = baselock.parse(plan.locks.base or "")
    assert lock is not None, "cu130-torch211's base lock does not parse"
    tag = base.base_tag(base.BASE_NAMESPACE, plan.spec, lock, "runtime")
    ref = tag.removeprefix("localhost/")
    sdk = engine.sdk()
    try:
        if any(ref in i.tags for i in sdk.images.list(name=ref.split(":")[0])):
            return ref
    finally:
        sdk.close()
    bh = buildah.find_buildah()
    info = buildah.inspect(bh, tag)
    if info is None:
        pytest.skip(f"no {tag} in buildah's storage; run `flashkit base build cu130-torch211`")
    buildah.push_to_engine(bh, info.image_id, ref, engine)
    return ref
