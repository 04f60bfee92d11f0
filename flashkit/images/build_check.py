"""``flashkit build --check ENV``: build again, cold, as a second builder would, and compare bit for bit.

Nix's ``--check`` in image form. The first build is the one ``flashkit build`` made (or makes now) for
the current input hash; the second runs in a buildah storage of its own (a fresh folder: no layers, no
cache mounts, no bases shared with the first), under ``-check`` tags: its mmdebstrap bases are made
again from the archive, its packages downloaded again. Then:

- the wheel must be bit-identical (which members differ, if not);
- the base, builder and runtime image ids must be equal; for each image that differs, every differing
  layer is named with the step that made it, and diffoscope names the files that differ in it.

Exit 0 when everything is identical, else 30. The report is written beside the builds
(``.work/repro/<env>-<input hash>.json``), diffoscope's reports beside it, and printed. The second
storage is removed afterwards unless asked to keep it.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from flashkit.core.atomic import utc_now, write_json_atomic
from flashkit.images import buildah, repro
from flashkit.images.build import WORK, BuildOptions, BuildResult, build_plan
from flashkit.images.container import image_remove
from flashkit.images.engine import Engine
from flashkit.plan.plan import Plan

# What makes images match, said once in the report.
LAYER_NOTE = (
    "images are built with buildah --timestamp SOURCE_DATE_EPOCH (file times and config dates from the "
    "inputs) on mmdebstrap bases at the locked Debian versions, so every layer is expected to match; "
    "a differing layer is explained by diffoscope (file contents and lists; folder metadata left out)"
)


@dataclasses.dataclass(frozen=True)
class Explained:
    image: str  # runtime | builder
    index: int
    step: str
    files: tuple[str, ...]
    report: str  # diffoscope's text report, or "" when it could not run


@dataclasses.dataclass(frozen=True)
class CheckReport:
    env: str
    input_hash: str
    first: BuildResult
    second: BuildResult
    wheel: repro.WheelComparison
    runtime: repro.ImageComparison
    builder: repro.ImageComparison
    date: str
    bases: dict[str, tuple[str | None, str | None]] = dataclasses.field(default_factory=dict)
    explained: tuple[Explained, ...] = ()

    @property
    def identical(self) -> bool:
        same_bases = all(a == b for a, b in self.bases.values())
        return self.wheel.identical and self.runtime.identical and self.builder.identical and same_bases

    def to_json(self) -> dict:
        def image(c: repro.ImageComparison) -> dict:
            return {
                "first": c.first_id,
                "second": c.second_id,
                "identical": c.identical,
                "layers": c.layers,
                "differing": [dataclasses.asdict(d) for d in c.differing],
            }

        return {
            "env": self.env,
            "input_hash": self.input_hash,
            "date": self.date,
            "wheel": {**dataclasses.asdict(self.wheel), "identical": self.wheel.identical},
            "runtime_image": image(self.runtime),
            "builder_image": image(self.builder),
            "bases": {k: {"first": a, "second": b, "identical": a == b} for k, (a, b) in self.bases.items()},
            "builders": {"first": self.first.builder, "second": self.second.builder},
            "first_build_seconds": self.first.seconds,
            "second_build_seconds": self.second.seconds,
            "identical": self.identical,
            "explained": [dataclasses.asdict(e) for e in self.explained],
            "note": LAYER_NOTE,
        }

    def text(self) -> str:
        lines = [
            f"{self.env} (input hash {self.input_hash}): cold rebuild in {self.second.seconds:.0f}s "
            f"by a second builder ({self.second.builder.get('storage', '?')})",
            *(
                f"{k} base {'reproducible: ' + str(a) if a == b else f'differs: {a} vs {b}'}"
                for k, (a, b) in self.bases.items()
            ),
            self.wheel.report(),
            "runtime " + self.runtime.report(),
            "builder " + self.builder.report(),
        ]
        for e in self.explained:
            lines.append(f"{e.image} layer {e.index} ({e.step}): {', '.join(e.files) or 'no file named'}")
            if e.report:
                lines.append(f"  diffoscope report: {e.report}")
        lines.append("everything is bit-identical" if self.identical else f"note: {LAYER_NOTE}")
        return "\n".join(lines)


def report_path(root: Path, env_id: str, input_hash: str) -> Path:
    return root / WORK / "repro" / f"{env_id}-{input_hash}.json"


def _explain(root: Path, env: str, bhs, which: str, comp: repro.ImageComparison) -> list[Explained]:
    out = []
    for d in comp.differing[:4]:
        dirs = [
            repro.layer_dir(bh.graph_root, digest) if digest else None
            for bh, digest in zip(bhs, (d.first, d.second), strict=True)
        ]
        if None in dirs:
            out.append(
                Explained(
                    which, d.index, d.step, ("(a layer folder was not found: diffoscope needs overlay storage)",), ""
                )
            )
            continue
        report = root / WORK / "repro" / f"{env}-{which}-layer{d.index}.diffoscope.txt"
        report.parent.mkdir(parents=True, exist_ok=True)
        files = repro.explain_layer(dirs[0], dirs[1], report)  # type: ignore[arg-type]
        out.append(Explained(which, d.index, d.step, files, str(report) if report.exists() else ""))
    return out


def check_plan(root: Path, plan: Plan, engine: Engine, opts: BuildOptions, *, keep: str | None = None) -> CheckReport:
    """Build ``plan`` (or take its build of record), build it again cold in a fresh storage, compare.

    ``keep``: a folder for the second storage, kept afterwards (default: a temporary one, removed)."""
    first = build_plan(root, plan, engine, opts)
    second_root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="flashkit-check-", dir="/var/tmp"))
    try:
        second = build_plan(root, plan, engine, dataclasses.replace(opts, check=True, buildah_root=str(second_root)))
        bhs = (buildah.find_buildah(opts.buildah_root), buildah.find_buildah(str(second_root)))
        runtime = repro.compare_images(
            repro.image_facts(bhs[0], first.runtime_ref), repro.image_facts(bhs[1], second.runtime_ref)
        )
        builder = repro.compare_images(
            repro.image_facts(bhs[0], first.builder_ref), repro.image_facts(bhs[1], second.builder_ref)
        )
        explained = _explain(root, first.env, bhs, "runtime", runtime) + _explain(
            root, first.env, bhs, "builder", builder
        )
        report = CheckReport(
            env=first.env,
            input_hash=first.input_hash,
            first=first,
            second=second,
            wheel=repro.compare_wheels(Path(first.wheel_path), Path(second.wheel_path)),
            runtime=runtime,
            builder=builder,
            date=utc_now(),
            bases={
                "builder": (first.base_image_id, second.base_image_id),
                "runtime": (first.runtime_base_id, second.runtime_base_id),
            },
            explained=tuple(explained),
        )
        image_remove(engine, [second.runtime_ref])  # the first build's tags keep an identical image
    finally:
        if not keep:
            _remove_storage(second_root)
    write_json_atomic(report_path(root, first.env, first.input_hash), report.to_json())
    return report


def _remove_storage(folder: Path) -> None:
    bh = buildah.find_buildah(str(folder))
    bh.run("rmi", "--all", "--force", check=False, timeout=1800)
    shutil.rmtree(folder, ignore_errors=True)
