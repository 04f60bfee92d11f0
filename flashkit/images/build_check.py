"""``flashkit build --check ENV``: build again from a cold cache and compare with the build of record.

Nix's ``--check`` in image form. The first build is the one ``flashkit build`` made (or makes now) for
the current input hash; the second runs with no layer cache under its own ``-check`` tags, with the
same fixed ``SOURCE_DATE_EPOCH`` the template gives every build. The wheel must come out bit-identical
(exit 0, else 30); image layers are compared and each differing layer is named with the step that made
it, because BuildKit in Debian's Docker 20.10 stamps file times at build time and pip's .pyc files
are not byte-stable, so identical images are not yet expected. The report is written beside the
builds (``.work/repro/<env>-<input hash>.json``) and printed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flashkit.core.atomic import utc_now, write_json_atomic
from flashkit.images import repro
from flashkit.images.build import WORK, BuildOptions, BuildResult, build_plan
from flashkit.images.engine import Engine
from flashkit.plan.plan import Plan

# Why layers usually differ, said once in the report instead of guessed per layer.
LAYER_NOTE = (
    "image layers are not expected to match yet, only the wheel: the engine's built-in BuildKit "
    "(Docker 20.10) stamps per-build data into layers, even into a COPY of identical committed files "
    "(BuildKit >= 0.13 can rewrite layer times to SOURCE_DATE_EPOCH), and apt and pip write install "
    "times and .pyc files"
)


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
            "second_build_seconds": self.second.seconds,
            "note": LAYER_NOTE,
        }

    def text(self) -> str:
        return "\n".join(
            [
                f"{self.env} (input hash {self.input_hash}): cold rebuild in {self.second.seconds:.0f}s",
                self.wheel.report(),
                "runtime " + self.runtime.report(),
                "builder " + self.builder.report(),
                f"note: {LAYER_NOTE}",
            ]
        )


def report_path(root: Path, env_id: str, input_hash: str) -> Path:
    return root / WORK / "repro" / f"{env_id}-{input_hash}.json"


def check_plan(root: Path, plan: Plan, engine: Engine, opts: BuildOptions) -> CheckReport:
    """Build ``plan`` (or take its build of record), build it again cold, and compare the two."""
    first = build_plan(root, plan, engine, opts)
    second = build_plan(root, plan, engine, dataclasses.replace(opts, check=True))
    report = CheckReport(
        env=first.env,
        input_hash=first.input_hash,
        first=first,
        second=second,
        wheel=repro.compare_wheels(Path(first.wheel_path), Path(second.wheel_path)),
        runtime=repro.compare_images(
            repro.image_facts(engine, first.runtime_ref), repro.image_facts(engine, second.runtime_ref)
        ),
        builder=repro.compare_images(
            repro.image_facts(engine, first.builder_ref), repro.image_facts(engine, second.builder_ref)
        ),
        date=utc_now(),
    )
    write_json_atomic(report_path(root, first.env, first.input_hash), report.to_json())
    return report
