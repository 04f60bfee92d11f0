"""Two cold builds in two buildah storages: identical steps give identical layers, and the one
step that records the clock is the one layer that differs, explained by diffoscope."""

from __future__ import annotations

from pathlib import Path

import pytest
from kitsupport import not_built

from flashkit.images import base, buildah
from flashkit.images.repro import compare_images, explain_layer, image_facts, layer_dir
from flashkit.plan import baselock
from flashkit.plan.plan import load_plan

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def _runtime_base(tmp_path: Path):
    """The runtime base of cu130-torch211, made in the default storage by the main job (else skip)."""
    plan = load_plan(ROOT, "cu130-torch211")
    lock, _p = baselock.parse(plan.locks.base)
    tag = base.base_tag(base.BASE_NAMESPACE, plan.spec, lock, "runtime")
    bh = buildah.find_buildah()
    if buildah.inspect(bh, tag) is None:
        not_built(f"no {tag} in buildah's storage; run `flashkit build cu130-torch211`")
    return bh, tag


def test_second_storage_gives_identical_layers_but_the_clock_step(tmp_path):
    bh0, tag = _runtime_base(tmp_path)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "fixed.txt").write_text("same bytes every time\n")
    (ctx / "Containerfile").write_text(
        f"FROM {tag}\nCOPY fixed.txt /fixed.txt\nRUN python3 -c 'print(1)' > /same\nRUN date +%s%N > /stamp\n"
    )
    storages = [buildah.find_buildah(str(tmp_path / f"s{i}")) for i in (1, 2)]
    layout = f"oci:{tmp_path}/base-layout:b"
    bh0.run("push", tag, layout, timeout=600)  # the base travels as an OCI layout, as to a second host
    try:
        for bh in storages:
            pulled = bh.run("pull", "--quiet", layout, timeout=600).stdout.strip().splitlines()[-1]
            bh.run("tag", pulled, tag)
            bh.run("build", "--timestamp", "1795996800", "--format", "oci", "--layers", "-t", "flashkit-test/repro:1",
                   "-f", str(ctx / "Containerfile"), str(ctx), timeout=600)  # fmt: skip
        a, b = (image_facts(bh, "flashkit-test/repro:1") for bh in storages)
        c = compare_images(a, b)
        assert not c.identical
        assert [d.index for d in c.differing] == [c.layers - 1]
        assert c.differing[0].step == "RUN date +%s%N > /stamp"
        assert f"{c.layers - 1} of {c.layers} layers identical" in c.report()
        dirs = [
            layer_dir(bh.graph_root, digest) for bh, digest in zip(storages, (a.layers[-1], b.layers[-1]), strict=True)
        ]
        files = explain_layer(dirs[0], dirs[1], tmp_path / "report.txt")
        assert "stamp" in " ".join(files), (tmp_path / "report.txt").read_text()[:2000]
    finally:
        for bh in storages:
            bh.run("rmi", "--all", "--force", check=False)
