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
    assert "| 30 |" in (REPO / "docs" / "exit-codes.md").read_text()


def test_oci_history_names_the_step_of_each_layer():
    from flashkit.images.repro import oci_history

    history = [
        {"created_by": "/bin/sh -c #(nop) ADD file:3d99 in / "},
        {"created_by": "/bin/sh -c #(nop) ENV PATH=/usr/bin", "empty_layer": True},
        {"created_by": "|1 SOURCE_DATE_EPOCH=1795996800 /bin/sh -c useradd flash"},
        {"created_by": "/bin/sh -c #(nop) COPY dir:ab12 in /src/ "},
        {"created_by": "/bin/sh -c #(nop) LABEL a=b", "empty_layer": True},
    ]
    assert oci_history(history, 3) == ("base image (ADD rootfs)", "RUN useradd flash", "COPY dir:ab12 in /src/")
    assert oci_history(history, 4) == ("unknown",) * 4


def test_diffoscope_file_names_are_read_from_its_report():
    from flashkit.images.repro import differing_files

    report = (
        "--- /a/diff\n+++ /b/diff\n├── file list\n│ @@ -1 +1 @@\n├── stamp\n│ @@ -1 +1 @@\n"
        "│ -1795996801\n│ +1795996802\n├── usr/lib/x.pyc\n│ ├── stat {}\n"
    )
    assert differing_files(report) == ("stamp", "usr/lib/x.pyc")
    folders = "--- /s1/diff\n+++ /s2/diff\n│   --- /s1/diff/stamp\n├── +++ /s2/diff/stamp\n│ @@ -1 +1 @@\n"
    assert differing_files(folders, ("/s1/diff", "/s2/diff")) == ("stamp",)


def test_a_differing_base_makes_the_check_fail_and_is_said():
    same = WheelComparison("aa", "aa")
    img = ImageComparison("sha256:1", "sha256:1", 3, ())
    rep = CheckReport(
        "cu130-torch211", "fk2-abc", _result("t", "a.whl", 1), _result("t-check", "b.whl", 2), same, img, img,
        "2026-12-01T00:00:00+00:00", bases={"runtime": ("sha256:r1", "sha256:r2"), "builder": ("sha256:b", "sha256:b")},
    )  # fmt: skip
    assert not rep.identical
    assert "runtime base differs: sha256:r1 vs sha256:r2" in rep.text()
    assert "builder base reproducible: sha256:b" in rep.text()
    assert rep.to_json()["bases"]["runtime"]["identical"] is False
