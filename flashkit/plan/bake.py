"""`flashkit bake`: a docker buildx bake file (JSON) for all or selected envs, to fan builds out.

The planner (``bake_file``) is pure: specs, rendered Dockerfiles and input
hashes in, one JSON document out, byte-identical for the same inputs. Each env
gives three targets that mirror ``flashkit build``:

- ``<env>-builder`` and ``<env>`` (the runtime stage), tagged like local builds
  (``flashkit/<env>:<input-hash tag>`` and ``-builder``) with the same
  ``org.flashkit.env`` / ``org.flashkit.input-hash`` labels;
- ``<env>-wheel``: the ``wheel`` stage exported as files to ``.work/wheels/<env>/bake``.

The Dockerfile travels inline (``dockerfile-inline``) and the context is the
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
the local base (``flashkit base create``); a remote builder needs that base
pushed to a registry it can reach and ``--set *.args.BASE_IMAGE=...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from flashkit.core.atomic import write_text_atomic

CA_VARIABLE = "FLASHKIT_CA_FILE"
CA_DEFAULT = "/etc/ssl/certs/ca-certificates.crt"
IMAGE_REPO = "flashkit"  # same namespace as flashkit.images.build's local image refs


def env_targets(env_id: str, input_hash: str, tag: str, dockerfile: str) -> dict[str, dict]:
    """The three bake targets of one env (pure)."""
    common = {
        "context": ".",
        "dockerfile-inline": dockerfile,
        "labels": {"org.flashkit.env": env_id, "org.flashkit.input-hash": input_hash},
        "secret": [f"id=ca,src=${{{CA_VARIABLE}}}"],
        "platforms": ["linux/amd64"],
    }
    return {
        f"{env_id}-builder": common | {"target": "builder", "tags": [f"{IMAGE_REPO}/{env_id}:{tag}-builder"]},
        env_id: common | {"target": "runtime", "tags": [f"{IMAGE_REPO}/{env_id}:{tag}"]},
        f"{env_id}-wheel": common
        | {"target": "wheel", "output": [f"type=local,dest=.work/wheels/{env_id}/bake"], "labels": {}},
    }


def bake_file(envs: Iterable[tuple[str, str, str, str]]) -> dict:
    """``envs``: (env id, input hash, tag, rendered Dockerfile). Groups: default (all), images, wheels."""
    targets: dict[str, dict] = {}
    ids = []
    for env_id, input_hash, tag, dockerfile in sorted(envs):
        ids.append(env_id)
        targets.update(env_targets(env_id, input_hash, tag, dockerfile))
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


def plan(root: Path, env_ids: list[str], host_mem_gib: int) -> tuple[dict, list[str]]:
    """Load, check and render the envs; returns the bake document and the rejected envs' reasons."""
    from flashkit.plan import inputhash
    from flashkit.plan import render
    from flashkit.plan import rules
    from flashkit.plan.spec import load_all, load_env

    specs = [load_env(root, e) for e in env_ids] if env_ids else load_all(root)
    rows, skipped = [], []
    for spec in specs:
        if env_ids:
            rules.require_accepted(spec)  # named explicitly: a rejection is an error, not a silent skip
        elif rules.rejections(spec):
            skipped.extend(rules.format_rejection(spec, v) for v in rules.rejections(spec))
            continue
        h = inputhash.input_hash(root, spec)
        dockerfile = render.render_env(root, spec, host_mem_gib=host_mem_gib)
        rows.append((str(spec.id), h, inputhash.tag_suffix(h), dockerfile))
    return bake_file(rows), skipped


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bake", help="write a docker buildx bake file (JSON) for all or selected envs")
    p.add_argument("envs", nargs="*", help="env ids (default: every env the rules accept)")
    p.add_argument("-o", "--output", metavar="PATH", help="write here (atomically) instead of stdout")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    from flashkit.core import hostinfo
    from flashkit.core import paths

    root = paths.root_of(args)
    mem = getattr(args, "host_mem_gib", None) or hostinfo.mem_gib()
    doc, skipped = plan(root, list(args.envs), mem)
    for line in skipped:
        print(f"left out: {line}", file=sys.stderr)
    text = dumps(doc)
    if args.output:
        write_text_atomic(Path(args.output), text)
        n = len(doc["group"]["wheels"]["targets"])
        print(f"wrote {args.output}: {n} envs; build with `docker buildx bake -f {args.output}`", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
