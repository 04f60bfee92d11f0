"""Reproducibility: compare two builds of one env and say what differs and why.

This is the comparison half of ``flashkit build --check`` (a second, cold build in a storage of its
own, then compare with the first build). The rebuild itself belongs to ``flashkit.images.build``; here
are the judges, pure over plain values:

- ``compare_wheels``: equal sha256, or which archive members differ in content,
  in timestamp, in order, or exist in only one wheel (the usual culprits:
  embedded dates, RECORD, unordered file lists);
- ``compare_images``: the image ids, and each layer (rootfs diff id) that
  differs, with the Dockerfile step that produced it (from the image history).

``image_facts`` reads what ``compare_images`` needs from a buildah storage, and ``explain_layer`` asks
diffoscope which files of two differing layers differ.
"""

from __future__ import annotations

import dataclasses
import re
import zipfile
from pathlib import Path

from flashkit.core import procs
from flashkit.core.digests import sha256_file as sha256
from flashkit.core.errors import ToolError


@dataclasses.dataclass(frozen=True)
class WheelComparison:
    first_sha256: str
    second_sha256: str
    only_first: tuple[str, ...] = ()
    only_second: tuple[str, ...] = ()
    content: tuple[str, ...] = ()  # members whose bytes differ
    timestamps: tuple[str, ...] = ()  # members whose zip date_time differs
    order_differs: bool = False

    @property
    def identical(self) -> bool:
        return self.first_sha256 == self.second_sha256

    def report(self) -> str:
        if self.identical:
            return f"wheel reproducible: sha256 {self.first_sha256}"
        lines = [f"wheel differs: {self.first_sha256} vs {self.second_sha256}"]
        for label, items in (
            ("only in the first", self.only_first),
            ("only in the second", self.only_second),
            ("content differs", self.content),
            ("timestamp differs", self.timestamps),
        ):
            if items:
                lines.append(f"  {label}: {', '.join(items)}")
        if self.order_differs:
            lines.append("  member order differs")
        if not (self.only_first or self.only_second or self.content or self.timestamps or self.order_differs):
            lines.append("  members identical: the zip container itself differs (compression or metadata)")
        return "\n".join(lines)


def compare_wheels(first: Path, second: Path) -> WheelComparison:
    a_sha, b_sha = sha256(first), sha256(second)
    if a_sha == b_sha:
        return WheelComparison(a_sha, b_sha)
    with zipfile.ZipFile(first) as za, zipfile.ZipFile(second) as zb:
        a = {i.filename: i for i in za.infolist()}
        b = {i.filename: i for i in zb.infolist()}
        common = [n for n in a if n in b]
        content = tuple(sorted(n for n in common if za.read(n) != zb.read(n)))
        stamps = tuple(sorted(n for n in common if a[n].date_time != b[n].date_time))
        order = [n for n in a if n in b] != [n for n in b if n in a]
    return WheelComparison(
        a_sha,
        b_sha,
        only_first=tuple(sorted(set(a) - set(b))),
        only_second=tuple(sorted(set(b) - set(a))),
        content=content,
        timestamps=stamps,
        order_differs=order,
    )


@dataclasses.dataclass(frozen=True)
class ImageFacts:
    image_id: str
    layers: tuple[str, ...]  # rootfs diff ids, base first
    steps: tuple[str, ...]  # the step that produced each layer, or "unknown"


@dataclasses.dataclass(frozen=True)
class LayerDiff:
    index: int
    first: str | None
    second: str | None
    step: str


@dataclasses.dataclass(frozen=True)
class ImageComparison:
    first_id: str
    second_id: str
    layers: int
    differing: tuple[LayerDiff, ...]

    @property
    def identical(self) -> bool:
        return self.first_id == self.second_id

    def report(self) -> str:
        if self.identical:
            return f"image reproducible: {self.first_id}"
        same = self.layers - len(self.differing)
        lines = [f"image differs: {self.first_id} vs {self.second_id}; {same} of {self.layers} layers identical"]
        if not self.differing:
            lines.append("  every layer identical: only the config differs (dates, labels, history)")
        for d in self.differing:
            lines.append(f"  layer {d.index}: {d.first} vs {d.second}  <- {d.step}")
        return "\n".join(lines)


def _step_text(created_by: str) -> str:
    text = re.sub(r"\s*# buildkit$", "", created_by.strip())
    # BuildKit writes "RUN /bin/sh -c CMD", the legacy builder "/bin/sh -c #(nop) LABEL ..." or "/bin/sh -c CMD".
    return re.sub(r"^(RUN )?/bin/sh -c (#\(nop\)\s*)?", lambda m: m.group(1) or "", text) or "unknown"


LAYER_INSTRUCTIONS = frozenset({"RUN", "COPY", "ADD", "WORKDIR"})


def layer_steps(history: list[dict], n_layers: int) -> tuple[str, ...]:
    """Map engine history (newest first, as the API returns it) onto the rootfs layers (base first).

    Entries that made no layer report size 0; when the count of the others does not
    match the layers (a layer whose diff is empty also has size 0) the steps are "unknown".
    """
    steps = [_step_text(h.get("CreatedBy", "")) for h in reversed(history)]
    sizes = [h.get("Size", 0) for h in reversed(history)]
    # First guess: the instructions that write a filesystem diff (the base's entry has no text). An
    # empty-looking layer (WORKDIR of an existing folder) still counts, which sizes alone would miss.
    by_kind = [
        step if step != "unknown" else "base image"
        for step in steps
        if step == "unknown" or step.split(" ", 1)[0] in LAYER_INSTRUCTIONS
    ]
    if len(by_kind) == n_layers:
        return tuple(by_kind)
    by_size = [step for step, size in zip(steps, sizes, strict=True) if size > 0]
    return tuple(by_size) if len(by_size) == n_layers else ("unknown",) * n_layers


def compare_images(first: ImageFacts, second: ImageFacts) -> ImageComparison:
    n = max(len(first.layers), len(second.layers))
    diffs = []
    for i in range(n):
        a = first.layers[i] if i < len(first.layers) else None
        b = second.layers[i] if i < len(second.layers) else None
        if a != b:
            step = second.steps[i] if i < len(second.steps) else first.steps[i]
            diffs.append(LayerDiff(i, a, b, step))
    return ImageComparison(first.image_id, second.image_id, n, tuple(diffs))


def oci_history(history: list[dict], n_layers: int) -> tuple[str, ...]:
    """The step of each layer from an OCI config's history (entries with ``empty_layer`` made none)."""
    steps = []
    for h in history:
        if h.get("empty_layer"):
            continue
        raw = re.sub(r"^\|\d+ (?:\S+=\S* )*", "", h.get("created_by", ""))  # ARG values buildah prefixes
        text = _step_text(raw)
        if text.startswith("ADD file:"):
            text = "base image (ADD rootfs)"
        steps.append(text if "#(nop)" in raw or text == "unknown" else f"RUN {text}")
    return tuple(steps) if len(steps) == n_layers else ("unknown",) * n_layers


def image_facts(bh, ref: str) -> ImageFacts:
    """The id, layers and steps of image ``ref`` in the buildah storage ``bh``."""
    from flashkit.core.errors import BuildError
    from flashkit.images import buildah

    info = buildah.inspect(bh, ref)
    if info is None:
        raise BuildError(f"no image {ref} in {bh.describe()}")
    return ImageFacts(info.image_id, info.layers, oci_history(list(info.history), len(info.layers)))


def layer_dir(graph_root: str, diff_id: str) -> Path | None:
    """The folder holding the files of the layer ``diff_id`` in an overlay storage (None if not found)."""
    import json

    index = Path(graph_root) / "overlay-layers" / "layers.json"
    try:
        layers = json.loads(index.read_text())
    except (OSError, ValueError):
        return None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("diff-digest") == diff_id:
            d = Path(graph_root) / "overlay" / str(layer.get("id")) / "diff"
            return d if d.is_dir() else None
    return None


_TREE = re.compile(r"^[│ ]*├── (.+)$")
_NOT_FILES = ("file list", "stat {}", "filetype from file(1)", "zipinfo", "readelf", "objdump", "strings")


def differing_files(report_text: str, roots: tuple[str, ...] = (), limit: int = 60) -> tuple[str, ...]:
    """The file names a diffoscope text report lists, in order, relative to the compared ``roots``."""
    out: list[str] = []
    for line in report_text.splitlines():
        m = _TREE.match(line)
        if not m:
            continue
        name = m.group(1).removeprefix("+++ ")  # a folder comparison names each file as "+++ ROOT/path"
        for root in roots:
            name = name.removeprefix(root.rstrip("/") + "/")
        if not name.startswith(_NOT_FILES) and not name.startswith(("--- ", "+")) and name not in out:
            out.append(name)
    return tuple(out[:limit])


def explain_layer(first: Path, second: Path, out: Path, timeout_s: int = 900) -> tuple[str, ...]:
    """Run diffoscope on two layers' folders; write its text report to ``out``; the files it names.

    Folder metadata is left out (``--exclude-directory-metadata=yes``): the files of a layer on disk keep
    the times they were written with, and ``--timestamp`` sets them only in the layer's tar stream.
    """
    import shutil

    if not shutil.which("diffoscope"):
        return ("(diffoscope is not installed: apt-get install diffoscope-minimal)",)
    argv = ["diffoscope", "--text", str(out), "--exclude-directory-metadata=yes", "--max-report-size", str(4 << 20)]
    try:
        procs.run([*argv, str(first), str(second)], timeout=timeout_s, what="diffoscope", capture_output=True)
    except ToolError as exc:  # the report names what differs; diffoscope failing must not hide that they differ
        return (f"({exc}; partial report in {out})",)
    return differing_files(out.read_text(errors="replace"), (str(first), str(second))) if out.exists() else ()
