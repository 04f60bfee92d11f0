"""build --check: the fixed SOURCE_DATE_EPOCH every build gets, and the report it prints and writes."""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path

from kitsupport import dockerfile

from flashkit.core.errors import EXIT_CODES
from flashkit.images.build import BuildResult
from flashkit.images.build_check import LAYER_NOTE, CheckReport
from flashkit.images.repro import ImageComparison, LayerDiff, WheelComparison
from flashkit.plan import render
from flashkit.plan.specfile import load_env

REPO = Path(__file__).resolve().parents[1]


def test_wheel_step_gets_the_lock_date_as_source_date_epoch():
    spec = load_env(REPO, "cu130-torch211")
    text = dockerfile(REPO, "cu130-torch211", 24)
    want = int(datetime.datetime.fromisoformat(spec.lock_exclude_newer.replace("Z", "+00:00")).timestamp())
    assert f"ARG SOURCE_DATE_EPOCH={want}\n" in text
    wheel_step = re.search(r"^RUN .*?pip wheel .*?$", text, re.M | re.S).group(0)
    assert 'SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH}"' in wheel_step
    # Host memory sizes the jobs, never the dates: the epoch line is the same for any host.
    assert f"ARG SOURCE_DATE_EPOCH={want}\n" in dockerfile(REPO, "cu130-torch211", 256)


def test_epoch_is_floored_at_the_first_date_zip_can_store():
    spec = dataclasses.replace(load_env(REPO, "cu130-torch211"), lock_exclude_newer="1970-01-02T00:00:00Z")
    assert render.source_date_epoch(spec) == render.ZIP_EPOCH_FLOOR


def _result(tag: str, wheel: str, seconds: float) -> BuildResult:
    return BuildResult(
        env="cu130-torch211",
        input_hash="fk1-abc",
        runtime_ref=f"flashkit/cu130-torch211:{tag}",
        runtime_id=f"sha256:{tag}",
        builder_ref=f"flashkit/cu130-torch211:{tag}-builder",
        builder_id=f"sha256:{tag}b",
        runtime_size=1,
        builder_size=1,
        wheel_path=wheel,
        wheel_sha256="x",
        lock_sha256="l",
        base_image_id=None,
        built=True,
        seconds=seconds,
        log_path="log",
        context={},
        date="d",
    )


def test_report_names_wheel_verdict_and_each_differing_layer_with_its_step():
    same = WheelComparison("aa", "aa")
    runtime = ImageComparison("sha256:1", "sha256:2", 9, (LayerDiff(7, "sha256:l1", "sha256:l2", "RUN pip install x"),))
    builder = ImageComparison("sha256:3", "sha256:3", 8, ())
    rep = CheckReport(
        "cu130-torch211",
        "fk1-abc",
        _result("t", "a.whl", 10),
        _result("t-check", "b.whl", 612.4),
        same,
        runtime,
        builder,
        "2026-11-30T00:00:00+00:00",
    )
    text = rep.text()
    assert "wheel reproducible: sha256 aa" in text
    assert "cold rebuild in 612s" in text
    assert "layer 7: sha256:l1 vs sha256:l2  <- RUN pip install x" in text
    assert "8 of 9 layers identical" in text and "builder image reproducible" in text
    data = rep.to_json()
    assert data["wheel"]["identical"] is True and data["runtime_image"]["differing"][0]["index"] == 7
    assert data["builder_image"]["identical"] is True and data["note"] == LAYER_NOTE


def test_not_reproducible_exit_code_is_documented():
    from flashkit.core.errors import NotReproducible

    assert NotReproducible.exit_code == 30
    row = dict(EXIT_CODES)["30"]
    assert "--check" in row and "image" in row
    assert "| 30 |" in (REPO / "README.md").read_text()
