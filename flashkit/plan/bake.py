"""`flashkit bake`: a docker buildx bake file (JSON) for all or selected envs, to fan builds out.

The planner (``bake_file``) is pure: specs, rendered Dockerfiles and input
hashes in, one JSON document out, byte-identical for the same inputs. Each env
gives three targets that mirror ``flashkit build``:

- ``<env>-builder`` and ``<env>`` (the runtime stage), tagged like local builds
  (``flashkit/<env>:<input-hash tag>`` and ``-builder``) with the same
  ``io.flashkit.env`` / ``io.flashkit.input-hash`` labels;
- ``<env>-wheel``: the ``wheel`` stage exported as files to ``.work/wheels/<env>/bake``.

The Dockerfile travels inline (``dockerfile-inline``, escaped: bake reads strings as HCL templates, and
``docker buildx bake --print`` gives back the rendered bytes) and the context is the
repository root, whose layout (``lockfiles/``, ``flash_kernels/``) is what the
rendered Dockerfile copies. In a fresh checkout (CI) that is exactly the hashed
input; in a working tree with local build outputs under ``flash_kernels/``
(``build/``, ``*.so``, ``*.egg-info``) a ``.dockerignore`` must exclude them, as
``flashkit build`` does when it assembles its context. Site inputs stay out of the file's identity: the
proxy CA is a secret read from ``${FLASHKIT_CA_FILE}`` (a bake variable, default
the Debian/Ubuntu system bundle; the Dockerfile uses it only when non-empty),
and ``DEBIAN_MIRROR`` / ``PIP_INDEX_URL`` are left to ``--set *.args.X=...``.

Envs a compatibility rule rejects are left out and listed on stderr; naming a
rejected env explicitly is an error (exit 4). Debian-flavoured envs start from
their two local bases (``flashkit base build ENV``); a remote builder needs them
pushed to a registry it can reach and ``--set *.args.BASE_IMAGE=...`` and
``RUNTIME_IMAGE=...``. A bake build uses BuildKit, whose images are not the
reproducible ones ``flashkit build`` makes with buildah (same inputs, other ids
unless that BuildKit rewrites timestamps); without the ``build-jobs`` secret the
wheel compiles with one job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from flashkit.core.names import label
from flashkit.plan.plan import Plan, keep_accepted
from flashkit.plan.render import render_dockerfile

CA_VARIABLE = "FLASHKIT_CA_FILE"
CA_DEFAULT = "/etc/ssl/certs/ca-certificates.crt"
IMAGE_REPO = "flashkit"  # same namespace as flashkit.images.build's local image refs


def literal(text: str) -> str:
    """``text`` as a bake string that means itself: bake reads every string as an HCL template, so the
    Dockerfile's own shell expansions (``${index:-…}``) and ``%{`` are escaped (``$${``, ``%%{``)."""
    return text.replace("${", "$${").replace("%{", "%%{")


def env_targets(
    env_id: str, input_hash: str, tag: str, dockerfile: str, wheel_builder: tuple[str, str] | None = None
) -> dict[str, dict]:
    """The three bake targets of one env (pure). ``wheel_builder``: (image ref, source env) of a
    ``wheel_from`` env, whose builder stage starts from that env's builder target."""
    common = {
        "context": ".",
        "dockerfile-inline": literal(dockerfile),
        "labels": {label("env"): env_id, label("input-hash"): input_hash},
        "secret": [f"id=ca,src=${{{CA_VARIABLE}}}"],
        "platforms": ["linux/amd64"],
    }
    if wheel_builder is not None:
        # A named context: the FROM of that image ref is the source env's builder target, built first.
        common["contexts"] = {wheel_builder[0]: f"target:{wheel_builder[1]}-builder"}
    return {
        f"{env_id}-builder": common | {"target": "builder", "tags": [f"{IMAGE_REPO}/{env_id}:{tag}-builder"]},
        env_id: common | {"target": "runtime", "tags": [f"{IMAGE_REPO}/{env_id}:{tag}"]},
        f"{env_id}-wheel": common
        | {"target": "wheel", "output": [f"type=local,dest=.work/wheels/{env_id}/bake"], "labels": {}},
    }


def bake_file(envs: Iterable[tuple]) -> dict:
    """``envs``: (env id, input hash, tag, rendered Dockerfile[, wheel builder]). Groups: default (all),
    wheels."""
    targets: dict[str, dict] = {}
    ids = []
    for env_id, input_hash, tag, dockerfile, *wheel_builder in sorted(envs, key=lambda e: e[0]):
        ids.append(env_id)
        targets.update(env_targets(env_id, input_hash, tag, dockerfile, *(w for w in wheel_builder if w)))
    return {
        "variable": {CA_VARIABLE: {"default": CA_DEFAULT}},
        "group": {
            "default": {"targets": [t for e in ids for t in (f"{e}-builder", e)]},
            "wheels": {"targets": [f"{e}-wheel" for e in ids]},
        },
        "target": targets,
    }


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def select(plans: list[Plan], named: bool, host_mem_gib: int) -> tuple[dict, list[str]]:
    """The bake document of the accepted ``plans`` and why the others were left out."""
    kept, skipped = keep_accepted(plans, named)
    rows = []
    for plan in kept:
        plan.require_consistent_locks()
        src = plan.wheel_source
        wheel_builder = (f"{IMAGE_REPO}/{src.env_id}:{src.tag}-builder", src.env_id) if src is not None else None
        dockerfile = render_dockerfile(plan, host_mem_gib=host_mem_gib)
        rows.append((plan.env_id, plan.input_hash, plan.tag, dockerfile, wheel_builder))
    return bake_file(rows), skipped
