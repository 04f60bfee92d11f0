"""Air-gapped Debian base images: debootstrap a suite, import it, pin the result locally.

The build host reaches Debian's package mirror but no container registry, so
the bases the Dockerfile starts FROM are made here: ``debootstrap
--variant=minbase`` into a directory, tidy the files that differ run to run,
tar it with a fixed order, owners and clamped mtimes, and ``docker import`` it
as ``flashkit/debian:<suite>``.

The filesystem layer is reproducible for a given mirror state (its digest is
recorded), but the image id is not: ``docker import`` stamps the creation time
into the image config. So the id is pinned in ``.work/bases.lock.json``, a
record of *this host's* engine, git-ignored on purpose. ``flashkit build``
checks the tag still points at the pinned id before it builds on it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import email.utils
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from flashkit.core.atomic import write_json_atomic
from flashkit.core.digests import sha256_file as sha256
from flashkit.core.errors import BaseImageError, UsageError
from flashkit.core.safeio import read_text
from flashkit.core.textcheck import check_site_url
from flashkit.images.engine import Engine

log = logging.getLogger(__name__)

SUITES = ("bookworm", "trixie")
IMAGE_REPO = "flashkit/debian"
RECORD_PATH = Path(".work/bases.lock.json")
# non-free carries Debian's nvidia-cuda-toolkit; contrib and non-free-firmware
# complete the set so an env spec never has to edit sources.list.
COMPONENTS = "main,contrib,non-free,non-free-firmware"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
RECORD_SCHEMA = 1

# Files that differ on every debootstrap run and that no image needs: apt's
# downloaded indexes and binary caches, logs, the per-machine id, ldconfig's
# auxiliary cache. Removing them makes the layer reproducible.
_VOLATILE = (
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/cache/ldconfig/aux-cache",
    "var/log",
    "debootstrap",
    "etc/machine-id",
    "var/lib/dbus/machine-id",
)


@dataclasses.dataclass(frozen=True)
class BaseRecord:
    suite: str
    tag: str
    image_id: str
    layer_digest: str
    mirror: str
    release_date: str
    debootstrap: str
    created: str
    seconds: float

    @property
    def pinned_tag(self) -> str:
        """A tag that names this exact image: BuildKit cannot start FROM a bare image id."""
        return f"{self.tag.rpartition(':')[0]}:{self.suite}-{self.image_id.removeprefix('sha256:')[:12]}"


def _debian_sources(root: Path) -> list[tuple[str, list[str]]]:
    """(uri, suites) pairs from one-line and deb822 apt sources under ``root``."""
    entries: list[tuple[str, list[str]]] = []
    files = [root / "sources.list", *sorted((root / "sources.list.d").glob("*"))]
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
                if "deb" in fields.get("types", "").split():
                    for uri in fields.get("uris", "").split():
                        entries.append((uri, fields.get("suites", "").split()))
        elif f.suffix == ".list" or f.name == "sources.list":
            for line in text.splitlines():
                m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m:
                    entries.append((m.group(1), [m.group(2)]))
    return entries


def host_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive the host's apt uses (not -security, not a third-party repo)."""
    for uri, suites in _debian_sources(apt_dir):
        if "security" in uri:
            continue
        # A Debian archive carries a plain codename suite such as "bookworm";
        # third-party repos (nodesource, cloud-sdk) use their own suite names.
        if any(s in SUITES or s in ("bullseye", "sid", "stable", "testing") for s in suites):
            return uri.rstrip("/")
    return DEFAULT_MIRROR


def resolve_mirror(cli_value: str | None) -> tuple[str, str]:
    """(mirror, where it came from): CLI flag, then FLASHKIT_DEBIAN_MIRROR, then the host's apt.

    The mirror lands in the base's /etc/apt/sources.list, a layer of every image built on it, so a
    mirror with credentials is refused (debootstrap has no other way to be given them).
    """
    for value, origin in (
        (cli_value, "--mirror"),
        (os.environ.get("FLASHKIT_DEBIAN_MIRROR"), "FLASHKIT_DEBIAN_MIRROR"),
    ):
        if value:
            why = check_site_url(value, origin)
            if why:
                raise UsageError(why)
            return value.rstrip("/"), origin
    return host_mirror(), "host apt sources"


def _release_date(rootfs: Path, suite: str) -> tuple[str, int]:
    """The suite's Release date from the indexes debootstrap fetched: the rootfs' clock."""
    lists = rootfs / "var/lib/apt/lists"
    for f in sorted(lists.glob("*_Release")) + sorted(lists.glob("*_InRelease")):
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith("Date:"):
                raw = line.split(":", 1)[1].strip()
                when = email.utils.parsedate_to_datetime(raw)
                return raw, int(when.timestamp())
    # debootstrap keeps no lists on some versions; fall back to a fixed epoch
    # rather than "now", which would make every layer differ.
    log.warning("no Release file in %s; clamping mtimes to SOURCE_DATE_EPOCH or 0", lists)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    return "unknown", epoch


def _tidy(rootfs: Path) -> None:
    for rel in _VOLATILE:
        p = rootfs / rel
        if p.is_dir() and not p.is_symlink():
            for child in p.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        elif p.name == "machine-id" and p.exists():
            # systemd treats an empty machine-id as "generate at first boot".
            p.write_text("")
        elif p.exists() or p.is_symlink():
            p.unlink()
    # apt expects these directories to exist.
    for rel in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/log/apt"):
        (rootfs / rel).mkdir(parents=True, exist_ok=True)


def _debootstrap_version() -> str:
    res = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "debootstrap"], capture_output=True, text=True)
    return res.stdout.strip() or "unknown"


def _run_logged(argv: list[str], logf) -> None:
    logf.write(f"$ {' '.join(argv)}\n".encode())
    logf.flush()
    res = subprocess.run(argv, stdout=logf, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        raise BaseImageError(
            f"`{' '.join(argv[:4])} ...` failed with exit {res.returncode}", hint=f"see the log {logf.name}"
        )


def create_base(
    engine: Engine,
    suite: str,
    *,
    mirror: str | None = None,
    workdir: Path = Path(".work/bases"),
    record_path: Path = RECORD_PATH,
    repo: str = IMAGE_REPO,
) -> BaseRecord:
    """debootstrap ``suite``, import it as ``<repo>:<suite>`` (default flashkit/debian) and pin its id."""
    _check_can_debootstrap(suite)
    mirror_url, origin = resolve_mirror(mirror)
    log.info("creating %s base from %s (%s)", suite, mirror_url, origin)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = Path(".work/logs") / f"base-{suite}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"{suite}-", dir=workdir) as tmp, open(log_path, "wb") as logf:
        rootfs = Path(tmp) / "rootfs"
        _run_logged(
            ["debootstrap", "--variant=minbase", f"--components={COMPONENTS}", suite, str(rootfs), mirror_url], logf
        )
        release_raw, epoch = _release_date(rootfs, suite)
        _tidy(rootfs)
        tar_path = Path(tmp) / "rootfs.tar"
        _tar_rootfs(rootfs, tar_path, epoch, logf)
        digest = "sha256:" + sha256(tar_path)
        tag = f"{repo}:{suite}"
        image = _import_layer(engine, tar_path, repo, suite, digest)
    rec = BaseRecord(
        suite=suite,
        tag=tag,
        image_id=image.id,
        layer_digest=digest,
        mirror=mirror_url,
        release_date=release_raw,
        debootstrap=_debootstrap_version(),
        created=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        seconds=round(time.monotonic() - start, 1),
    )
    _write_record(record_path, rec)
    log.info("%s = %s (layer %s) in %.0fs", tag, rec.image_id, digest, rec.seconds)
    return rec


def _check_can_debootstrap(suite: str) -> None:
    """Refuse early, before any work, what debootstrap would fail on later."""
    if suite not in SUITES:
        raise BaseImageError(f"unknown Debian suite {suite!r}", hint=f"choose one of: {', '.join(SUITES)}")
    if not shutil.which("debootstrap"):
        raise BaseImageError(
            "debootstrap is not installed", hint="apt-get install debootstrap (or `flashkit engine ensure --install`)"
        )
    if os.geteuid() != 0:
        raise BaseImageError("debootstrap needs root", hint="run `flashkit base create` as root")


def _tar_rootfs(rootfs: Path, tar_path: Path, epoch: int, logf) -> None:
    # Fixed member order, numeric owners, mtimes clamped to the archive's
    # date and no atime/ctime: the same packages give the same bytes.
    _run_logged(
        [
            "tar",
            "-C",
            str(rootfs),
            "--create",
            "--file",
            str(tar_path),
            "--sort=name",
            "--numeric-owner",
            f"--mtime=@{epoch}",
            "--clamp-mtime",
            "--format=posix",
            "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
            ".",
        ],
        logf,
    )


def _import_layer(engine: Engine, tar_path: Path, repo: str, suite: str, digest: str):
    """``docker import`` the tar as ``<repo>:<suite>`` (and a tag naming its id); the image, its layer checked."""
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        'CMD ["bash"]',
    ]
    sdk = engine.sdk()
    try:
        out = sdk.api.import_image(src=str(tar_path), repository=repo, tag=suite, changes=changes)
        image = sdk.images.get(f"{repo}:{suite}")
        image.tag(repo, f"{suite}-{image.id.removeprefix('sha256:')[:12]}")
    finally:
        sdk.close()
    log.debug("import answered %s", out)
    layers = image.attrs.get("RootFS", {}).get("Layers", [])
    if layers != [digest]:
        # The engine stores the stream it was given, so its diff id must be
        # the tar's digest; anything else means the import was altered.
        raise BaseImageError(f"imported layer {layers} differs from the tar's {digest}")
    return image


def load_records(record_path: Path = RECORD_PATH) -> dict[str, BaseRecord]:
    if not record_path.exists():
        return {}
    try:
        data = json.loads(read_text(record_path, what="base record", error=BaseImageError, max_bytes=1 << 20))
        return {k: BaseRecord(**v) for k, v in data["bases"].items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BaseImageError(
            f"{record_path} is not a valid base record: {exc}", hint="delete it and rerun `flashkit base create`"
        ) from exc


def _write_record(record_path: Path, rec: BaseRecord) -> None:
    records = load_records(record_path)
    records[rec.suite] = rec
    body = {
        "schema": RECORD_SCHEMA,
        "note": "local record of this host's engine; image ids differ per host (import time), not committed",
        "bases": {k: dataclasses.asdict(v) for k, v in sorted(records.items())},
    }
    write_json_atomic(record_path, body)


def pinned_base(engine: Engine, suite: str, record_path: Path = RECORD_PATH) -> BaseRecord:
    """The recorded base for ``suite``, after checking the engine still has exactly that image."""
    rec = load_records(record_path).get(suite)
    if rec is None:
        raise BaseImageError(f"no {suite} base recorded in {record_path}", hint=f"run `flashkit base create {suite}`")
    import docker.errors

    sdk = engine.sdk()
    try:
        image = sdk.images.get(rec.tag)
    except docker.errors.ImageNotFound:
        sdk.close()
        raise BaseImageError(
            f"{rec.tag} is recorded in {record_path} but missing from the engine",
            hint=f"run `flashkit base create {suite}`",
        ) from None
    try:
        if image.id != rec.image_id:
            raise BaseImageError(
                f"{rec.tag} is {image.id} but {record_path} pins {rec.image_id}",
                hint=f"something re-tagged it; run `flashkit base create {suite}` to re-pin",
            )
        repo, _, tag = rec.pinned_tag.rpartition(":")
        image.tag(repo, tag)
    finally:
        sdk.close()
    return rec
