"""Reproducibility judges: wheel and image comparisons say what differs and which step made it."""

from __future__ import annotations

import zipfile
from pathlib import Path

from flashkit.images.repro import ImageFacts, compare_images, compare_wheels, layer_steps


def zip_of(path: Path, members: list[tuple[str, bytes, tuple]]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data, stamp in members:
            z.writestr(zipfile.ZipInfo(name, date_time=stamp), data)
    return path


T0, T1 = (2020, 1, 1, 0, 0, 0), (2026, 11, 30, 10, 0, 0)


def test_identical_wheels(tmp_path):
    m = [("a.py", b"x", T0), ("pkg-1.dist-info/RECORD", b"r", T0)]
    c = compare_wheels(zip_of(tmp_path / "1.whl", m), zip_of(tmp_path / "2.whl", m))
    assert c.identical and "reproducible" in c.report()


def test_wheels_differing_by_timestamp_content_order_and_members(tmp_path):
    a = zip_of(tmp_path / "1.whl", [("a.py", b"x", T0), ("b.so", b"1", T0), ("gone.txt", b"", T0)])
    b = zip_of(tmp_path / "2.whl", [("b.so", b"2", T0), ("a.py", b"x", T1), ("new.txt", b"", T0)])
    c = compare_wheels(a, b)
    assert not c.identical
    assert c.content == ("b.so",) and c.timestamps == ("a.py",)
    assert c.only_first == ("gone.txt",) and c.only_second == ("new.txt",) and c.order_differs
    text = c.report()
    assert "content differs: b.so" in text and "timestamp differs: a.py" in text


def test_layer_steps_follow_the_engine_history():
    history = [  # newest first, as the engine's history API returns it
        {"CreatedBy": "LABEL x=y", "Size": 0},
        {"CreatedBy": "RUN /bin/sh -c date > /stamp # buildkit", "Size": 20},
        {"CreatedBy": "COPY fixed.txt /fixed.txt # buildkit", "Size": 6},
        {"CreatedBy": "", "Size": 116557261},
    ]
    assert layer_steps(history, 3) == ("base image", "COPY fixed.txt /fixed.txt", "RUN date > /stamp")
    assert layer_steps(history, 4) == ("unknown",) * 4  # counts disagree: no guessing


def test_an_empty_workdir_layer_keeps_the_mapping():
    # As BuildKit reports the runtime image: WORKDIR made a layer of 0 bytes; ENV/LABEL/ARG made none.
    history = [
        {"CreatedBy": "USER 10001:10001", "Size": 0},
        {"CreatedBy": "WORKDIR /home/flash", "Size": 0},
        {"CreatedBy": "ENV PATH=/opt/venv/bin", "Size": 0},
        {"CreatedBy": "RUN |2 A=b /bin/bash -o pipefail -c pip install x # buildkit", "Size": 7},
        {"CreatedBy": "ARG A=b", "Size": 0},
        {"CreatedBy": "", "Size": 117},
    ]
    steps = layer_steps(history, 3)
    assert steps[0] == "base image" and steps[1].startswith("RUN |2 A=b") and steps[2] == "WORKDIR /home/flash"


def test_compare_images_names_the_differing_layer_and_its_step():
    first = ImageFacts("sha256:a", ("l0", "l1", "l2"), ("base", "COPY x", "RUN date"))
    second = ImageFacts("sha256:b", ("l0", "l1", "l2b"), ("base", "COPY x", "RUN date"))
    c = compare_images(first, second)
    assert not c.identical and [d.index for d in c.differing] == [2]
    assert "2 of 3 layers identical" in c.report() and "<- RUN date" in c.report()
    same_layers = compare_images(first, ImageFacts("sha256:c", first.layers, first.steps))
    assert "only the config differs" in same_layers.report()
