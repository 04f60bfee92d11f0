"""wheel_from: an env that installs the stable-ABI wheel another env builds (one wheel, many envs).

The planner must tie the consumer's identity to the source's (input hash), render a builder stage that is
the source's builder image, and refuse a source whose wheel cannot serve the consumer, naming the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flashkit.core.errors import SpecError
from flashkit.plan import inputhash
from flashkit.plan.plan import load_plan, wheel_source_problems
from flashkit.plan.render import render_dockerfile
from flashkit.plan.specfile import load_env


def _edit(root: Path, env: str, old: str, new: str) -> None:
    p = root / "envs" / f"{env}.yaml"
    text = p.read_text()
    assert old in text, f"{old!r} not in {p}"
    p.write_text(text.replace(old, new))


def test_consumer_hash_follows_the_source(kit_repo: Path):
    before = load_plan(kit_repo, "cu130-torch213")
    assert before.wheel_source is not None and before.wheel_source.env_id == "cu130-torch211"
    assert before.manifest()["wheel_from"] == {"env": "cu130-torch211", "input_hash": before.wheel_source.input_hash}
    # A change that touches only the source (its lock date moves its SOURCE_DATE_EPOCH, so its wheel)
    # must move the consumer's input hash too: the consumer's image holds that wheel.
    _edit(kit_repo, "cu130-torch211", "publish_tags: [", 'publish_tags: ["extra", ')
    after = load_plan(kit_repo, "cu130-torch213")
    assert after.wheel_source.input_hash != before.wheel_source.input_hash
    assert after.input_hash != before.input_hash


def test_env_without_wheel_from_has_no_such_key(kit_repo: Path):
    plan = load_plan(kit_repo, "cu130-torch211")
    assert plan.wheel_source is None
    assert "wheel_from" not in plan.manifest() and "wheel_from" not in plan.spec.normalized()
    assert inputhash.digest(plan.manifest()) == plan.input_hash


def test_render_builds_from_the_source_builder(kit_repo: Path):
    plan = load_plan(kit_repo, "cu130-torch213")
    text = render_dockerfile(plan, host_mem_gib=8)
    src = plan.wheel_source
    assert f"ARG WHEEL_BUILDER_IMAGE=flashkit/cu130-torch211:{src.tag}-builder" in text
    assert "FROM ${WHEEL_BUILDER_IMAGE} AS builder" in text
    assert "pip wheel" not in text and "nvcc" not in text  # nothing is compiled for this env
    # The runtime's wheel step names this env's input hash, which covers the source's (buildah cache key).
    assert f"FLASHKIT_WHEEL_OF={plan.input_hash}" in text
    own = render_dockerfile(src, host_mem_gib=8)
    assert "FLASH_KERNELS_TORCH_ABI=stable" in own and "WHEEL_BUILDER_IMAGE" not in own


@pytest.mark.parametrize("namespace", [None, "flashkit", "site-a", "org.example_ns"])
def test_the_source_builder_is_named_the_same_under_any_namespace(kit_repo: Path, monkeypatch, namespace):
    """buildah writes the FROM name into the image history: a namespaced source name would change the ids."""
    from flashkit.images import build

    if namespace is None:
        monkeypatch.delenv(build.NAMESPACE_ENV, raising=False)
    else:
        monkeypatch.setenv(build.NAMESPACE_ENV, namespace)
    plan = load_plan(kit_repo, "cu130-torch213")
    src = plan.wheel_source
    builder_ref = build.image_ref(src.env_id, f"{src.tag}-builder")
    assert builder_ref.startswith(f"{namespace or 'flashkit'}/")
    name = build.shared_builder_name(builder_ref)
    assert f"ARG WHEEL_BUILDER_IMAGE={name}\n" in render_dockerfile(plan, host_mem_gib=8)


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (("cu130-torch213", 'gpu_targets: ["8.0", "9.0a"]', 'gpu_targets: ["9.0a"]'), "the archs its wheel carries"),
        (("cu130-torch211", 'torch: "2.11.0"', 'torch: "2.9.1"'), None),  # id and torch disagree: a spec error
        (("cu130-torch213", "wheel_from: cu130-torch211", "wheel_from: cu124-torch27"), "version ABI"),
        (("cu130-torch213", "wheel_from: cu130-torch211", "wheel_from: cu130-torch215"), "takes its own wheel"),
        (("cu130-torch213", "wheel_from: cu130-torch211", "wheel_from: cu130-torch299"), "cu130-torch299"),
    ],
)
def test_bad_sources_are_refused_with_the_field(kit_repo: Path, edit, why):
    _edit(kit_repo, *edit)
    with pytest.raises(SpecError) as err:
        load_plan(kit_repo, "cu130-torch213")
    text = str(err.value)
    assert "envs/cu130-torch21" in text
    if why:
        assert "wheel_from" in text and why in text


def test_wheel_from_itself_and_non_ids_are_spec_errors(kit_repo: Path):
    _edit(kit_repo, "cu130-torch213", "wheel_from: cu130-torch211", "wheel_from: cu130-torch213")
    with pytest.raises(SpecError, match=r"cu130-torch213\.yaml:\d+: wheel_from: names this env itself"):
        load_env(kit_repo, "cu130-torch213")
    _edit(kit_repo, "cu130-torch213", "wheel_from: cu130-torch213", "wheel_from: [cu130-torch211]")
    with pytest.raises(SpecError, match=r"wheel_from: .* expected the id of another env"):
        load_env(kit_repo, "cu130-torch213")


def test_rules_for_a_shared_wheel(kit_repo: Path):
    src = load_env(kit_repo, "cu130-torch211")
    ok = load_env(kit_repo, "cu130-torch215")
    assert wheel_source_problems(ok, src) == []
    old = load_env(kit_repo, "cu124-torch27")
    problems = " ".join(wheel_source_problems(old, src))
    assert "no stable ABI" in problems and "CUDA" in problems


def test_a_newer_debian_release_runs_the_wheel_an_older_one_built_but_not_the_reverse(kit_repo: Path):
    src = load_env(kit_repo, "cu130-torch211")  # bookworm (Debian 12)
    newer = load_env(kit_repo, "cu130-torch211-py313")  # trixie (Debian 13), Python 3.13
    assert wheel_source_problems(newer, src) == []
    assert load_plan(kit_repo, "cu130-torch211-py313").wheel_source.spec.id == src.id
    _edit(kit_repo, "cu130-torch211", "suite: bookworm", "suite: trixie")
    _edit(kit_repo, "cu130-torch211", 'python: "3.11"', 'python: "3.13"')
    built_on_trixie = load_env(kit_repo, "cu130-torch211")
    older = load_env(kit_repo, "cu130-torch212")  # bookworm
    problems = " ".join(wheel_source_problems(older, built_on_trixie))
    assert "debian/bookworm is not cu130-torch211's debian/trixie or a newer Debian release" in problems
