"""Image ids carry no site name: the same inputs give the same ids whatever FLASHKIT_IMAGE_NAMESPACE says.

`.ci/run` builds its two envs on a fresh host, cold, under a namespace of its own (``flashkit-ci``). The
ledger in the checkout holds builds of the same input hashes made under another namespace (``flashkit``)
on another host. The ids the ledger names must be equal: both bases, the runtime image and the wheel. A
namespace that reaches any of them (a FROM name buildah writes into the history, a label, a build
argument) makes this fail, and with it the cross-host "applies" relations the ledger relies on.

The builder image is not compared: it is not reproducible even under one namespace (two cold builds of
cu130-torch211 at fk2-8fd0f8e9 on one host gave builders b6e42dbd and 851be20a, with the same runtime and
wheel), and no verdict judges it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kitsupport import not_built

from flashkit.core.errors import BuildError
from flashkit.images import buildah, repro
from flashkit.ledger import store

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
IDS = (
    ("runtime_id", "image_id"),
    ("base_image_id", "base_image_id"),
    ("runtime_base_id", "runtime_base_id"),
    ("wheel_sha256", "wheel_sha256"),
)


def _namespace(ref: str) -> str:
    return ref.partition("/")[0]


@pytest.mark.parametrize("env_id", ["cu130-torch211", "cu124-torch27"])
def test_ids_do_not_depend_on_the_image_namespace(built_env, env_id):
    res = built_env(env_id)
    here = _namespace(res.runtime_ref)
    others = [
        a
        for a in store.load(ROOT, env_id).artifacts(res.input_hash)
        if a.image_ref and _namespace(a.image_ref) != here and not a.image_ref.endswith("-check")
    ]
    if not others:
        not_built(
            f"{env_id}: the ledger has no build of {res.input_hash} under a namespace other than {here!r}; "
            f"build it with FLASHKIT_IMAGE_NAMESPACE=<another> `flashkit build {env_id}` (`.ci/run` does)"
        )
    for other in others:
        differ = {
            mine: (getattr(res, mine), getattr(other, theirs))
            for mine, theirs in IDS
            if getattr(res, mine) != getattr(other, theirs)
        }
        assert not differ, (
            f"{env_id} at {res.input_hash}: built as {res.runtime_ref} here and as {other.image_ref} "
            f"on {(other.builder or {}).get('host', 'another host')}, the ids differ: {differ}"
            + _layers_report(res, other)
        )


def _layers_report(res, other) -> str:
    """Which runtime layer differs and the step that made it, when both builds recorded their layers."""
    if res.runtime_id == other.image_id or not (res.runtime_layers and other.runtime_layers):
        return ""
    try:  # the steps come from this build's image, if buildah still holds it (`nox -s gc` may have dropped it)
        steps = repro.image_facts(buildah.find_buildah(None), res.runtime_id).steps
    except BuildError:
        steps = ("unknown",) * len(res.runtime_layers)
    mine = repro.ImageFacts(res.runtime_id, res.runtime_layers, steps)
    theirs = repro.ImageFacts(other.image_id, other.runtime_layers, steps)
    return "\n" + repro.compare_images(theirs, mine).report()
