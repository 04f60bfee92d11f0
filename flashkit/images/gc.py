"""``flashkit gc``: remove this checkout's stale images (and, on request, the engine's build cache).

Every build of a new input hash adds a runtime and a builder image (5-11 GB each, and their layers are
not shared: a rebuild's layers differ), so a build host fills up in a day of work. Kept, by tag:

- ``flashkit/<env>:fk2-<hash>`` and ``…-builder`` for the *current* input hash of every env in envs/;
- ``latest-local`` and ``latest-local-builder``.

(Bases and builder images live in buildah's storage, not the engine's.) Every other tag in the
``flashkit/`` repositories goes (older input hashes, ``-check`` rebuilds);
an image is deleted by the engine when its last tag goes. Tags of other repositories, including what
``flashkit publish`` pulled back from a registry, are never touched. ``--dry-run`` only prints the plan.
Images still used by a container are kept and reported. ``--build-cache`` also prunes the engine's build
cache, what ``docker builder prune`` frees: the cache of builds the engine ran itself (a ``docker build`` of a
rendered Dockerfile). flashkit's own builds run in buildah, whose layer cache is its images
(``--runtime-copies``).

A run killed mid-way (a timeout, Ctrl-C twice, an out-of-memory kill) leaves buildah working containers
behind, and each pins its image's layers: on the build host twelve of them held 14 GB. ``gc`` removes the
ones that are certainly stale: flashkit's own (``flashkit-wc-<pid>-…``) whose process is gone, and, while
no buildah process runs on the host, the stage containers of an interrupted ``buildah build`` and the
working containers of flashkit's images.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path

from flashkit.core.errors import UsageError
from flashkit.images.buildah import WORKING_PREFIX, containers
from flashkit.plan.plan import Plan

REPO_PREFIX = "flashkit/"


@dataclasses.dataclass(frozen=True)
class Collection:
    keep: tuple[str, ...]
    remove: tuple[str, ...]


def keep_tags(plans: list[Plan]) -> set[str]:
    """The tags ``gc`` never removes: every env's current input hash and latest-local."""
    from flashkit.images.build import image_ref

    keep: set[str] = set()
    for plan in plans:
        short = plan.tag
        keep |= {image_ref(plan.env_id, t) for t in (short, f"{short}-builder", "latest-local", "latest-local-builder")}
    return keep


# The namespace flashkit names its images in (``flashkit/``, or FLASHKIT_IMAGE_NAMESPACE's), with its slash.
_PREFIX_RE = re.compile(r"(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)+")
# One repository right under it (``<env>``, ``debian``) and a tag: what flashkit names, and nothing deeper.
_OURS_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def check_prefix(prefix: str) -> str:
    """``prefix`` when it is an image namespace ending in ``/``; UsageError otherwise. An empty prefix, or one
    with a newline or a space, would make every image of the engine look like flashkit's."""
    if not _PREFIX_RE.fullmatch(prefix):
        raise UsageError(
            f"--prefix {prefix!r} is not an image namespace: expected lower-case names separated and ended by "
            f"'/', such as {REPO_PREFIX!r}",
            hint="gc removes only the images flashkit names; give the namespace they are under",
        )
    return prefix


def is_ours(tag: str, prefix: str) -> bool:
    """Whether ``tag`` is ``<prefix><repository>:<tag>``, one repository deep: the form flashkit names."""
    return tag.startswith(prefix) and _OURS_RE.fullmatch(tag[len(prefix) :]) is not None


def choose(tags: list[str], keep: set[str], prefix: str = REPO_PREFIX) -> Collection:
    check_prefix(prefix)
    ours = sorted(t for t in tags if is_ours(t, prefix))
    return Collection(keep=tuple(t for t in ours if t in keep), remove=tuple(t for t in ours if t not in keep))


@dataclasses.dataclass
class Report:
    plan: Collection
    sizes: dict[str, int]
    removed: int = 0
    in_use: list[str] = dataclasses.field(default_factory=list)
    cache_freed: int | None = None


def collect(engine, keep: set[str], *, prefix: str, dry_run: bool, build_cache: bool) -> Report:
    """Remove (or with ``dry_run`` only list) the stale tags; an image a container uses is kept."""
    import docker.errors

    sdk = engine.sdk()
    try:
        sizes = {t: img.attrs.get("Size", 0) for img in sdk.images.list() for t in img.tags}
        report = Report(choose(list(sizes), keep, prefix), sizes)
        if dry_run:
            return report
        for tag in report.plan.remove:
            try:
                sdk.images.remove(tag)
                report.removed += 1
            except docker.errors.APIError as exc:  # a container still uses it: keep, and say so
                report.in_use.append(f"{tag}: {exc.explanation or exc}")
        if build_cache:
            report.cache_freed = sdk.api.prune_builds().get("SpaceReclaimed") or 0
        return report
    finally:
        sdk.close()


def drop_runtime_copies(engine, bh, plans: list[Plan], *, dry_run: bool) -> list[tuple[str, int]]:
    """Remove buildah's copy of each env's current runtime image where the engine holds the same image id.

    The engine's copy is the one the tiers run and ``publish`` reads; buildah's is only the layer cache of
    the runtime stage, so the next build of that stage starts from its base (minutes of pip, 5-7 GB less on
    disk per env). Builder images stay: they make the wheel and ``wheel_from`` envs build on them. Dangling
    layer images left by the removal are pruned with it. Returns (ref, size) of what went.
    """
    from flashkit.images import buildah
    from flashkit.images.build import image_ref
    from flashkit.images.container import image_inspect

    gone = []
    for plan in plans:
        for tag in (plan.tag, "latest-local"):
            ref = image_ref(plan.env_id, tag)
            info, attrs = buildah.inspect(bh, ref), image_inspect(engine, image_ref(plan.env_id, plan.tag))
            if info is None or attrs is None or attrs.get("Id") != info.image_id:
                continue
            gone.append((ref, info.size))
            if not dry_run:
                buildah.remove(bh, [ref])
    if gone and not dry_run:
        bh.run("rmi", "--prune", check=False, timeout=1800)
    return gone


_OWNED = re.compile(re.escape(WORKING_PREFIX) + r"(\d+)-[0-9a-f]+")
# buildah build names a stage's container after the 12-hex id of the image it starts from (or after the
# image's name, for flashkit's own images); an interrupted build leaves them.
_BUILD_STEP = re.compile(r"[0-9a-f]{12}-working-container(?:-\d+)?")
_NAMED_STEP = re.compile(r"[a-z0-9][a-z0-9._-]*-working-container(?:-\d+)?")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def buildah_running(proc: Path = Path("/proc")) -> bool:
    """Whether any buildah process runs on this host (a build may own containers that carry no pid)."""
    for comm in proc.glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == "buildah":
                return True
        except OSError:  # the process ended while we looked
            continue
    return False


def stale_containers(
    rows: list[dict], *, prefix: str, alive: Callable[[int], bool], building: bool
) -> list[tuple[str, str, str]]:
    """(id, name, why) of each working container that no running process can own, from ``buildah containers
    --json``'s rows. Containers of other names and images are never chosen."""
    out = []
    for r in rows:
        cid, name, image = str(r.get("id", "")), str(r.get("containername", "")), str(r.get("imagename") or "")
        owned = _OWNED.fullmatch(name)
        if owned:
            if not alive(int(owned.group(1))):
                out.append((cid, name, f"its process {owned.group(1)} is gone"))
            continue
        if building or not cid:
            continue
        ours = image.removeprefix("localhost/").startswith(prefix)
        if _BUILD_STEP.fullmatch(name) or (ours and _NAMED_STEP.fullmatch(name)):
            out.append((cid, name, "left by an interrupted run (no buildah process is running)"))
    return out


def sweep_containers(bh, *, prefix: str, dry_run: bool) -> list[tuple[str, str, str]]:
    """Remove (with ``dry_run`` only list) the stale working containers; what was chosen."""
    stale = stale_containers(containers(bh), prefix=prefix, alive=pid_alive, building=buildah_running())
    if stale and not dry_run:
        for cid, _name, _why in stale:
            bh.run("rm", cid, check=False, timeout=120)
    return stale
