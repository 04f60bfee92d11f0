"""Real-docker tests: skipped, with the reason, when no engine answers."""

from __future__ import annotations

import pytest
from kitsupport import not_built

from flashkit.images.engine import engine_available, ensure_engine


@pytest.fixture(scope="session")
def engine():
    ok, why = engine_available()
    if not ok:
        not_built(why)
    return ensure_engine(start=False)


@pytest.fixture(scope="session")
def built_env(engine):
    """``built_env(env_id, builder=False)``: the build result of an env at its current input hash.

    Skips, with the command that builds it, when ``flashkit build`` has not made
    that env's images (and wheel) at the current input hash in this checkout: the
    runtime image in the engine and, with ``builder=True``, the builder image in
    buildah's storage (where it is built; tests run it there, as a
    :class:`flashkit.images.buildah.WorkingContainer`).
    FLASHKIT_TEST_BUILT=newest takes the newest build whose images still exist
    instead, whatever its input hash: for developing tests while the sources
    move on; CI leaves it unset.
    """
    import json
    import os
    from pathlib import Path

    from kitsupport import input_hash

    from flashkit.images import build, buildah
    from flashkit.images.container import image_inspect

    root = Path(__file__).resolve().parents[2]

    def builder_there(res: build.BuildResult) -> bool:
        info = buildah.inspect(buildah.find_buildah(), res.builder_ref)
        return info is not None and info.image_id == res.builder_id

    def newest(env_id: str, builder: bool) -> build.BuildResult | None:
        found = []
        for p in build.result_path(root, env_id, "x").parent.glob(f"{env_id}-fk*.json"):
            res = build.BuildResult(**json.loads(p.read_text()))
            if res.env == env_id and image_inspect(engine, res.runtime_ref) and (not builder or builder_there(res)):
                found.append(res)
        return max(found, key=lambda r: r.date, default=None)

    def get(env_id: str, builder: bool = False) -> build.BuildResult:
        if os.environ.get("FLASHKIT_TEST_BUILT") == "newest":
            res = newest(env_id, builder)
        else:
            res = build.load_result(root, env_id, input_hash(root, env_id))
        how = f"run `flashkit build {env_id}`"
        if res is None:
            not_built(f"{env_id} is not built at its current input hash; {how}")
        if not res.runtime_ref or image_inspect(engine, res.runtime_ref) is None:
            not_built(f"{env_id}: image {res.runtime_ref} of the current input hash is gone; {how}")
        if builder and not builder_there(res):
            not_built(f"{env_id}: buildah's storage has no {res.builder_ref} of id {res.builder_id}; {how}")
        if not res.wheel_path or not Path(res.wheel_path).is_file():
            not_built(f"{env_id}: its exported wheel {res.wheel_path} is gone; {how}")
        return res

    return get


@pytest.fixture(scope="session")
def runtime_base(engine):
    """``runtime_base(env_id)``: that env's runtime base (plain Debian with its python3 and venv, no torch), in
    the engine under the name the build gives it (the bases are made in buildah's storage; the same id is
    copied into the engine). Skips, naming the command that makes it, when buildah's storage does not have it.
    """
    from pathlib import Path

    from flashkit.images import base, buildah
    from flashkit.plan import baselock
    from flashkit.plan.plan import load_plan

    def get(env_id: str) -> str:
        plan = load_plan(Path(__file__).resolve().parents[2], env_id)
        lock, _ = baselock.parse(plan.locks.base or "")
        assert lock is not None, f"{env_id}'s base lock does not parse"
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
            not_built(f"no {tag} in buildah's storage; run `flashkit base build {env_id}`")
        buildah.push_to_engine(bh, info.image_id, ref, engine)
        return ref

    return get


@pytest.fixture(scope="session")
def debian_base(runtime_base):
    """A small flashkit/debian image in the engine: the main job's (cu130-torch211's) runtime base."""
    return runtime_base("cu130-torch211")
