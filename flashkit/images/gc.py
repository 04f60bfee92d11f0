"""``flashkit gc``: remove this checkout's stale images (and, on request, BuildKit's cache).

Every build of a new input hash adds a runtime and a builder image (5-11 GB each, and their layers are
not shared: a rebuild's layers differ), so a build host fills up in a day of work. Kept, by tag:

- ``flashkit/<env>:fk1-<hash>`` and ``…-builder`` for the *current* input hash of every env in envs/;
- ``latest-local`` and ``latest-local-builder``;
- ``flashkit/debian:<suite>`` and the pinned tag of each base in ``.work/bases.lock.json``.

Every other tag in the ``flashkit/`` repositories goes (older input hashes, ``-check`` rebuilds, old bases);
an image is deleted by the engine when its last tag goes. Tags of other repositories, including what
``flashkit publish`` pulled back from a registry, are never touched. ``--dry-run`` only prints the plan.
Images still used by a container are kept and reported. ``--build-cache`` also prunes BuildKit's cache
(the next build of each env starts cold).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from flashkit.core import paths

REPO_PREFIX = "flashkit/"


@dataclasses.dataclass(frozen=True)
class Plan:
    keep: tuple[str, ...]
    remove: tuple[str, ...]


def keep_tags(root: Path) -> set[str]:
    """The tags ``gc`` never removes for this checkout (pure: reads specs, locks and the base record)."""
    from flashkit.images.base import IMAGE_REPO as BASE_REPO
    from flashkit.images.base import RECORD_PATH, load_records
    from flashkit.images.build import image_ref
    from flashkit.plan.inputhash import input_hash, tag_suffix
    from flashkit.plan.spec import load_all

    keep: set[str] = set()
    for spec in load_all(root):
        env = str(spec.id)
        short = tag_suffix(input_hash(root, spec))
        keep |= {image_ref(env, t) for t in (short, f"{short}-builder", "latest-local", "latest-local-builder")}
    for suite, rec in load_records(root / RECORD_PATH).items():
        keep |= {f"{BASE_REPO}:{suite}", rec.pinned_tag}
    return keep


def plan(tags: list[str], keep: set[str], prefix: str = REPO_PREFIX) -> Plan:
    ours = sorted(t for t in tags if t.startswith(prefix))
    return Plan(keep=tuple(t for t in ours if t in keep), remove=tuple(t for t in ours if t not in keep))


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("gc", help="remove images of old input hashes and -check rebuilds (frees disk)")
    p.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    p.add_argument("--build-cache", action="store_true", help="also prune BuildKit's build cache")
    p.add_argument(
        "--prefix", default=REPO_PREFIX, help=f"repositories to collect (default {REPO_PREFIX}; tests use their own)"
    )
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    import docker.errors

    from flashkit.images.build import human_size
    from flashkit.images.engine import ensure_engine

    root = paths.root_of(args)
    engine = ensure_engine()
    sdk = engine.sdk()
    try:
        images = sdk.images.list()
        size_of = {t: img.attrs.get("Size", 0) for img in images for t in img.tags}
        p = plan(list(size_of), keep_tags(root), args.prefix)
        for tag in p.keep:
            print(f"keep    {tag}")
        removed, in_use = 0, []
        for tag in p.remove:
            print(f"{'would remove' if args.dry_run else 'remove'}  {tag}  ({human_size(size_of[tag])})")
            if args.dry_run:
                continue
            try:
                sdk.images.remove(tag)
                removed += 1
            except docker.errors.APIError as exc:  # a container still uses it: keep, and say so
                in_use.append(f"{tag}: {exc.explanation or exc}")
        for line in in_use:
            print(f"kept (in use) {line}")
        if args.build_cache and not args.dry_run:
            freed = sdk.api.prune_builds().get("SpaceReclaimed") or 0
            print(f"build cache: {human_size(freed)} reclaimed")
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {len(p.remove) if args.dry_run else removed} tag(s), kept {len(p.keep)}")
    finally:
        sdk.close()
    return 0
