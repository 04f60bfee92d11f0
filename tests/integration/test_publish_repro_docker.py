"""Two no-cache BuildKit builds of one Dockerfile: the comparison finds the one non-reproducible step."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from flashkit.images.container import image_inspect, image_remove
from flashkit.images.repro import compare_images, image_facts

pytestmark = pytest.mark.docker
BASE = "flashkit/debian:bookworm"


def test_rebuild_reports_the_layer_that_differs(engine, tmp_path):
    if image_inspect(engine, BASE) is None:
        pytest.skip(f"no {BASE}; run `flashkit base create bookworm`")
    (tmp_path / "fixed.txt").write_text("same bytes every time\n")
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE}\nCOPY fixed.txt /fixed.txt\nRUN date +%s%N > /stamp\nLABEL purpose=flashkit-test\n"
    )
    refs = [f"flashkit-repro-test:{uuid.uuid4().hex[:10]}" for _ in range(2)]
    client = engine.build_client
    try:
        for ref in refs:
            argv = [*client.build_argv(), "-q", "--no-cache", "-t", ref, str(tmp_path)]
            res = subprocess.run(argv, env=client.build_env(), capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, res.stderr
        c = compare_images(image_facts(engine, refs[0]), image_facts(engine, refs[1]))
    finally:
        image_remove(engine, refs, force=True)
    assert not c.identical
    assert [d.index for d in c.differing] == [c.layers - 1]
    assert c.differing[0].step == "RUN date +%s%N > /stamp"
    assert f"{c.layers - 1} of {c.layers} layers identical" in c.report()
