"""Reproducible Debian base images: mmdebstrap at the locked package versions, imported with buildah.

The build host reaches Debian's package mirror but no container registry, so the bases the images start
FROM are made here, two per debian-flavoured env (builder and runtime), from the env's committed base
lock (``lockfiles/<env>/base.txt``, :mod:`flashkit.plan.baselock`):

- ``flashkit base lock ENV`` runs ``mmdebstrap`` for each stage with the packages the spec asks for and
  records every installed package and version: a new lock is a new input hash.
- a build runs ``mmdebstrap --include=<every locked name=version>`` with ``SOURCE_DATE_EPOCH`` (the
  spec's lock date; mmdebstrap then clamps mtimes, drops logs and caches and writes a reproducible
  tarball), checks the installed set against the lock, and imports the tarball with ``buildah build
  --timestamp`` (``FROM scratch`` + ``ADD``). The same lock gives the same base image id on any host.
- when the archive no longer serves a locked version, apt fails and so does the build, with the
  packages named and the re-lock to run; nothing drifts silently.

The image's ``/etc/apt/sources.list`` names Debian's public archive whichever mirror was used (the mirror
is a site input, recorded in the build context, not identity).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from flashkit.core import procs
from flashkit.core.digests import sha256_file as sha256
from flashkit.core.errors import BaseImageError, UsageError
from flashkit.core.textcheck import check_site_url
from flashkit.images import buildah
from flashkit.images.buildah import Buildah
from flashkit.plan import baselock
from flashkit.plan.baselock import BaseLock
from flashkit.plan.render import source_date_epoch
from flashkit.plan.spec import EnvSpec

log = logging.getLogger(__name__)

SUITES = ("bookworm", "trixie")
# A base is a few hundred packages from the archive: minutes, never an hour unless the mirror hangs.
MMDEBSTRAP_TIMEOUT_S = 3600
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PUBLIC_ARCHIVE = DEFAULT_MIRROR  # what the image's sources.list names, whichever mirror built it
# dpkg's list of what is installed, written out of the chroot by a customize hook.
_LIST_HOOK = "chroot \"$1\" dpkg-query -W -f='${{Package}}=${{Version}}\\n' > {out}"
_NOT_FOUND = re.compile(r"Version '([^']+)' for '([^']+)' was not found")
BASE_CONTAINERFILE = """\
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["bash"]
"""


@dataclasses.dataclass(frozen=True)
class BaseImage:
    stage: str
    tag: str  # names exactly this image: derived from the locked packages and the epoch
    image_id: str
    rootfs_sha256: str | None  # the mmdebstrap tarball; None when the image was already in the storage
    seconds: float


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
    mirror with credentials is refused (mmdebstrap writes the URL it is given into its logs).
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


def _check_can_mmdebstrap() -> None:
    """Refuse early, before any work, what mmdebstrap would fail on later."""
    if not shutil.which("mmdebstrap"):
        raise BaseImageError(
            "mmdebstrap is not installed", hint="apt-get install mmdebstrap (or `flashkit engine ensure --install`)"
        )
    if os.geteuid() != 0:
        raise BaseImageError("mmdebstrap needs root here (it installs packages into a chroot)", hint="run as root")


def _mmdebstrap_argv(spec: EnvSpec, includes: tuple[str, ...], out: str, listing: Path, mirror: str) -> list[str]:
    sources = f"deb {PUBLIC_ARCHIVE} {spec.base.suite} {' '.join(baselock.components(spec))}"
    return [
        "mmdebstrap",
        f"--variant={baselock.VARIANT}",
        f"--components={','.join(baselock.components(spec))}",
        "--include=" + ",".join(includes),
        "--customize-hook=" + _LIST_HOOK.format(out=listing),
        f"--customize-hook=echo '{sources}' > \"$1/etc/apt/sources.list\"",
        spec.base.suite,
        out,
        mirror,
    ]


def _run_mmdebstrap(argv: list[str], epoch: int, log_path: Path, spec: EnvSpec) -> None:
    with open(log_path, "a", encoding="utf-8") as logf:
        logf.write(f"$ SOURCE_DATE_EPOCH={epoch} {' '.join(argv)}\n")
        logf.flush()
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
        res = procs.run(
            argv, timeout=MMDEBSTRAP_TIMEOUT_S, error=BaseImageError, what=f"mmdebstrap ({spec.id}'s base)",
            stdout=logf, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    if res.returncode == 0:
        return
    text = log_path.read_text(errors="replace")
    gone = sorted({f"{name}={version}" for version, name in _NOT_FOUND.findall(text)})
    if gone:
        raise BaseImageError(
            f"Debian's archive no longer serves {len(gone)} locked package version(s) of {spec.id}'s base: "
            + ", ".join(gone[:12])
            + (" ..." if len(gone) > 12 else ""),
            hint=f"re-lock with `flashkit base lock {spec.id}` and commit lockfiles/{spec.id}/base.txt: "
            "that is a new input hash, so the env is built and verified again",
        )
    raise BaseImageError(f"mmdebstrap failed with exit {res.returncode}", hint=f"see the log {log_path}")


def lock_bases(spec: EnvSpec, *, mirror: str | None = None, log_path: Path) -> BaseLock:
    """Resolve ``spec``'s bases against the archive now: every package and version each one gets."""
    _check_can_mmdebstrap()
    mirror_url, _origin = resolve_mirror(mirror)
    want = baselock.requested(spec)
    packages = {}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"# flashkit base lock {spec.id} from {mirror_url}\n")
    for stage in baselock.STAGES:
        with tempfile.TemporaryDirectory(prefix="flashkit-lock-") as tmp:
            listing = Path(tmp) / "installed.txt"
            argv = _mmdebstrap_argv(spec, want[stage], "/dev/null", listing, mirror_url)
            _run_mmdebstrap([*argv[:1], "--format=null", *argv[1:]], source_date_epoch(spec), log_path, spec)
            packages[stage] = baselock.parse_installed(listing.read_text())
        if not packages[stage]:
            raise BaseImageError(f"mmdebstrap listed no packages for the {stage} base", hint=f"see {log_path}")
    return BaseLock(spec.base.suite, baselock.components(spec), baselock.VARIANT, want, packages)


# Bases are named in one fixed namespace whatever FLASHKIT_IMAGE_NAMESPACE says: buildah writes the FROM
# name into the image's history, so a namespace in the base's name would make the same inputs give
# different image ids under different namespaces. Their names are content hashes, so sharing is safe.
BASE_NAMESPACE = "flashkit"


def base_tag(namespace: str, spec: EnvSpec, lock: BaseLock, stage: str) -> str:
    """A name for exactly one base: its suite, stage, and a hash of what makes it (pins, epoch, scheme)."""
    what = "\n".join([lock.suite, " ".join(lock.components), str(source_date_epoch(spec)), *lock.pins(stage)])
    return f"localhost/{namespace}/debian:{lock.suite}-{stage}-{hashlib.sha256(what.encode()).hexdigest()[:16]}"


def make_base(
    bh: Buildah, spec: EnvSpec, lock: BaseLock, stage: str, *, namespace: str, mirror: str | None, log_path: Path
) -> BaseImage:
    """The ``stage`` base of ``spec`` in ``bh``'s storage: reused when its tag is there, else made now."""
    tag = base_tag(namespace, spec, lock, stage)
    have = buildah.inspect(bh, tag)
    if have is not None:
        return BaseImage(stage, tag, have.image_id, None, 0.0)
    _check_can_mmdebstrap()
    mirror_url, origin = resolve_mirror(mirror)
    log.info("making the %s base of %s from %s (%s)", stage, spec.id, mirror_url, origin)
    start = time.monotonic()
    epoch = source_date_epoch(spec)
    with tempfile.TemporaryDirectory(prefix=f"flashkit-base-{stage}-", dir=bh.env().get("TMPDIR")) as tmp:
        ctx, listing = Path(tmp), Path(tmp) / "installed.txt"
        tar = ctx / "rootfs.tar"
        _run_mmdebstrap(_mmdebstrap_argv(spec, lock.pins(stage), str(tar), listing, mirror_url), epoch, log_path, spec)
        drift = baselock.drift(lock.packages[stage], baselock.parse_installed(listing.read_text()))
        if drift:
            raise BaseImageError(
                f"the {stage} base of {spec.id} does not hold exactly the locked packages:",
                detail="\n".join(drift[:40]),
                hint=f"re-lock with `flashkit base lock {spec.id}` and commit it (a new input hash)",
            )
        digest = "sha256:" + sha256(tar)
        listing.unlink()
        (ctx / "Containerfile").write_text(BASE_CONTAINERFILE)
        iid = ctx / "iid"
        args = ["build", "--timestamp", str(epoch), "--format", "oci", "--layers", "--iidfile", str(iid), "-t", tag]
        rc = buildah.stream(bh, [*args, "-f", str(ctx / "Containerfile"), str(ctx)], log_path, lambda line: None)
        if rc != 0:
            raise BaseImageError(f"importing the {stage} base into buildah failed (exit {rc})", hint=f"see {log_path}")
        image_id = iid.read_text().strip()
    seconds = time.monotonic() - start
    log.info("%s = %s (rootfs %s) in %.0fs", tag, image_id, digest, seconds)
    return BaseImage(stage, tag, image_id, digest, round(seconds, 1))
