"""buildah: the builder that makes flashkit's images, reproducibly.

Why buildah and not the engine's BuildKit: an image can be bit-identical across builders only if every
file's mtime and every date in its config come from the inputs. ``buildah build --timestamp EPOCH``
(buildah >= 1.20; Debian 12 ships 1.28) does exactly that: it sets the config's ``created`` and history
dates and the mtime of every file it commits to EPOCH. BuildKit does it only from 0.13 on
(``rewrite-timestamp``), and the BuildKit built into Debian 12's Docker 20.10 engine has neither that
option nor an ``image`` exporter to pass it to (``exporter "image" could not be found``). With the OCI
image format (``--format oci``: the Docker format adds a random hostname and container id to the config)
and ``--layers``, two fresh storages give the same image id for the same Containerfile and context.

One :class:`Buildah` names one storage: ``FLASHKIT_BUILDAH_ROOT=DIR`` keeps images in ``DIR/storage``,
runtime state in ``DIR/run`` and temporary files and ``RUN --mount=type=cache`` folders in ``DIR/tmp``
(buildah puts cache mounts under ``$TMPDIR``), so a second storage shares nothing with the first: a
second, independent builder on the same host. Without it, buildah's own default storage is used.
The engine (docker) only runs what was built: ``push_to_engine`` copies an image into it unchanged
(the engine's image id is the same config digest).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

from flashkit.core import procs
from flashkit.core.errors import BuildError, ContainerError, ToolError

log = logging.getLogger(__name__)

ROOT_ENV = "FLASHKIT_BUILDAH_ROOT"
# A working container is named for the process that owns it, so that `flashkit gc` can tell one a killed
# run left behind (its pid is gone: the container and the layers it pins stay until removed) from one in use.
WORKING_PREFIX = "flashkit-wc-"
MIN_VERSION = Version("1.20")  # --timestamp
_SIZE = re.compile(r"([0-9.]+)\s*([kMGT]?B)")
_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


@dataclasses.dataclass(frozen=True)
class Buildah:
    path: str
    version: str
    driver: str
    graph_root: str
    root: str | None = None  # FLASHKIT_BUILDAH_ROOT, or None for buildah's default storage

    def argv(self, *args: str) -> list[str]:
        where = ["--root", f"{self.root}/storage", "--runroot", f"{self.root}/run"] if self.root else []
        return [self.path, *where, *args]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.root:
            env["TMPDIR"] = f"{self.root}/tmp"
        return env

    def describe(self) -> str:
        return f"buildah {self.version} ({self.driver} storage at {self.graph_root})"

    def identity(self) -> dict[str, str]:
        """What makes this builder independent of another: the tool and its storage."""
        return {"tool": f"buildah {self.version}", "storage": f"{self.driver}:{self.graph_root}"}

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        res = procs.run(
            self.argv(*args), timeout=timeout, error=BuildError, what=f"`buildah {' '.join(args[:3])}`",
            capture_output=True, text=True, env=self.env(),
        )  # fmt: skip
        if check and res.returncode != 0:
            what = f"`buildah {' '.join(args[:3])}`"
            raise no_space_error(self, what, res.stderr) or BuildError(
                f"{what} failed (exit {res.returncode})", detail=res.stderr[-2000:]
            )
        return res

    def tmpdir(self) -> str:
        """Where buildah writes a layer's blob while it commits it (as large as the layer)."""
        return self.env().get("TMPDIR") or "/var/tmp"


_NO_SPACE = "no space left on device"


def no_space_error(bh: Buildah, what: str, output: str, log_path: Path | None = None) -> BuildError | None:
    """The error for ``what`` when its ``output`` says the disk filled up, or None when it does not.

    Such a failure comes out of buildah as a screen of the step's command line; what a person needs instead
    is where space ran short, how much is free there now, and how to free more.
    """
    hits = [line.strip() for line in output.splitlines() if _NO_SPACE in line.lower()]
    if not hits:
        return None
    places = {bh.graph_root: "buildah's storage", bh.tmpdir(): "its temporary files"}
    free = "; ".join(f"{name} {path}: {_free_gb(path)} free now" for path, name in places.items())
    return BuildError(
        f"{what} failed: no space left on device ({free})",
        detail=hits[-1][-400:],
        hint="free space, then run the command again: `flashkit gc` removes the engine's images of old input "
        "hashes and the working containers killed runs left, `flashkit gc --runtime-copies` buildah's copies of runtime images the engine holds, "
        '`buildah rmi --prune` unused layers; an env needs 15-25 GB while it builds (README, "Disk")'
        + (f"; full log: {log_path}" if log_path else ""),
    )


def _free_gb(path: str) -> str:
    p = Path(path)
    while not p.exists() and p != p.parent:  # TMPDIR may not exist yet
        p = p.parent
    try:
        return f"{shutil.disk_usage(p).free / 1e9:.1f} GB"
    except OSError:
        return "unknown"


def find_buildah(root: str | None = None) -> Buildah:
    """The buildah on PATH with the storage ``root`` (default ``$FLASHKIT_BUILDAH_ROOT``), checked."""
    exe = shutil.which("buildah")
    if not exe:
        raise ToolError(
            "buildah is not installed",
            hint="apt-get install buildah (or `flashkit engine ensure --install`)",
        )
    root = root or os.environ.get(ROOT_ENV) or None
    if root:
        root = str(Path(root).resolve())
        for sub in ("storage", "run", "tmp"):
            Path(root, sub).mkdir(parents=True, exist_ok=True)
    probe = Buildah(exe, "?", "?", "?", root)
    res = probe.run("version", check=False, timeout=60)
    m = re.search(r"Version:\s*([0-9][^\s]*)", res.stdout)
    try:
        version = Version(m.group(1)) if m else None
    except InvalidVersion:
        version = None
    if version is None or version < MIN_VERSION:
        raise ToolError(
            f"buildah {m.group(1) if m else '(unknown version)'} is older than {MIN_VERSION}",
            hint="install Debian 12's buildah (1.28) or newer: --timestamp is needed",
        )
    info = probe.run("info", timeout=60)
    try:
        store = json.loads(info.stdout)["store"]
        driver, graph = store["GraphDriverName"], store["GraphRoot"]
    except (ValueError, KeyError, TypeError):
        raise ToolError("`buildah info` did not describe its storage", detail=info.stdout[:500]) from None
    return Buildah(exe, str(version), driver, graph, root)


def stream(bh: Buildah, args: list[str], log_path: Path, on_line: Callable[[str], None]) -> int:
    """Run ``buildah ARGS``, keep every line in ``log_path`` and hand each to ``on_line`` (progress)."""
    argv = bh.argv(*args)
    with open(log_path, "a", encoding="utf-8") as logf:
        logf.write(f"$ {' '.join(argv)}\n")
        logf.flush()
        proc = subprocess.Popen(
            argv,
            env=bh.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                logf.write(line)
                logf.flush()  # the log is what people tail during a long compile
                on_line(line)
            return proc.wait()
        except BaseException:
            # Ctrl-C reaches buildah through the terminal's process group, but a SIGTERM sent to flashkit
            # alone (kill, timeout, a CI job cancelled) does not: pass it on, or the build keeps compiling
            # after flashkit has exited.
            procs.stop(proc, STOP_GRACE_S)
            raise


STOP_GRACE_S = 30.0  # buildah removes its working containers on SIGTERM; a compile step may take a moment


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    image_id: str  # sha256 of the config: the same in every storage and in the engine
    layers: tuple[str, ...]  # rootfs diff ids, base first
    history: tuple[dict, ...]
    size: int  # bytes, as buildah reports them (rounded to its display unit)


def inspect(bh: Buildah, ref: str) -> ImageInfo | None:
    """The image ``ref`` in this storage, or None when there is none."""
    res = bh.run("inspect", "--type", "image", ref, check=False, timeout=120)
    if res.returncode != 0:
        return None
    try:
        data = json.loads(res.stdout)
        config = json.loads(data["Config"])
        image_id = "sha256:" + data["FromImageID"]
        layers = tuple(config["rootfs"]["diff_ids"])
        history = tuple(config.get("history") or ())
    except (ValueError, KeyError, TypeError):
        raise BuildError(f"`buildah inspect {ref}` answered something unreadable", detail=res.stdout[:500]) from None
    return ImageInfo(image_id, layers, history, _size(bh, ref))


def _size(bh: Buildah, ref: str) -> int:
    res = bh.run("images", "--json", ref, check=False, timeout=120)
    try:
        text = json.loads(res.stdout)[0]["size"]
    except (ValueError, KeyError, IndexError, TypeError):
        return 0
    m = _SIZE.fullmatch(str(text).strip())
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else 0


def push_to_engine(bh: Buildah, image_id: str, ref: str, engine) -> None:
    """Copy ``image_id`` into the docker engine as ``ref``; its engine id must be the same digest."""
    res = bh.run("push", image_id, f"docker-daemon:{ref}", check=False, timeout=1800)
    if res.returncode != 0:
        what = f"copying {image_id} into the engine as {ref}"
        raise no_space_error(bh, what, res.stderr) or BuildError(f"{what} failed", detail=res.stderr[-1500:])
    sdk = engine.sdk()
    try:
        got = sdk.images.get(ref).id
    finally:
        sdk.close()
    if got != image_id:
        raise BuildError(f"the engine stored {ref} as {got}, buildah built {image_id}")


class WorkingContainer:
    """A buildah working container of an image in this storage, removed when the ``with`` block ends: run
    commands in it and copy files in and out, like :class:`flashkit.images.container.Container`, but with no
    copy of the image in the engine. A builder image is 5-11 GB, and copying one into the engine writes it
    twice more for a while (a temporary archive, then the engine's layers); this reads it where it is."""

    def __init__(self, bh: Buildah, ref: str, *, mounts: Sequence = (), network: bool = False):
        self.bh, self.ref, self.mounts, self.network = bh, ref, tuple(mounts), network
        self.cid: str | None = None
        self._root: Path | None = None

    def __enter__(self) -> WorkingContainer:
        name = f"{WORKING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.cid = self.bh.run("from", "--pull=never", "--quiet", "--name", name, self.ref, timeout=300).stdout.strip()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._root is not None:
            with contextlib.suppress(BuildError):
                self.bh.run("umount", self.cid, timeout=120)
        self.bh.run("rm", self.cid, check=False, timeout=120)

    def root(self) -> Path:
        """The container's file system, mounted on the host (read and written directly)."""
        if self._root is None:
            self._root = Path(self.bh.run("mount", self.cid, timeout=120).stdout.strip())
        return self._root

    def exec(self, argv: Sequence[str], *, workdir: str | None = None, user: str = "", timeout: float = 3600):
        """Run ``argv`` in the container (its image's environment and user unless ``user``); stdout and
        stderr interleaved, as an :class:`~flashkit.images.container.ExecResult`."""
        from flashkit.images.container import ExecResult

        args = ["run", "--network", "host" if self.network else "none"]
        for m in self.mounts:
            args += ["--volume", f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}"]
        args += ["--workingdir", workdir] if workdir else []
        args += ["--user", user] if user else []
        res = procs.run(
            self.bh.argv(*args, self.cid, "--", *argv),
            timeout=timeout,
            error=ContainerError,
            what=f"`{' '.join(argv[:3])}` in the build container",
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=self.bh.env(),
        )
        return ExecResult(tuple(argv), res.returncode, res.stdout)

    def copy_into(self, src: Path, dest_dir: str) -> None:
        """Copy the host file or directory ``src`` into the container directory ``dest_dir``."""
        self.bh.run("copy", self.cid, str(src), f"{dest_dir.rstrip('/')}/{Path(src).name}", timeout=600)

    def copy_out(self, src: str, dest_dir: Path) -> Path:
        """Copy the container path ``src`` (file or directory, links kept as links) into host ``dest_dir``."""
        path = self.root() / src.lstrip("/")
        dest = Path(dest_dir) / path.name
        Path(dest_dir).mkdir(parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink():
            shutil.copytree(path, dest, symlinks=True)
        elif path.is_file() or path.is_symlink():
            shutil.copy2(path, dest, follow_symlinks=False)
        else:
            raise BuildError(f"{src} does not exist in {self.ref}")
        return dest


def copy_out(bh: Buildah, ref: str, folder: str, dest: Path) -> list[Path]:
    """Copy the regular files of ``folder`` in image ``ref`` into ``dest`` (created empty); their paths."""
    with WorkingContainer(bh, ref) as wc:
        src = wc.root() / folder.lstrip("/")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        out = []
        for f in sorted(src.iterdir()) if src.is_dir() else []:
            if f.is_file() and not f.is_symlink():
                shutil.copyfile(f, dest / f.name)
                out.append(dest / f.name)
        return out


def containers(bh: Buildah) -> list[dict]:
    """Every working container of this storage, as ``buildah containers --json`` describes it (id,
    containername, imagename, ...)."""
    res = bh.run("containers", "--json", timeout=120)
    try:
        rows = json.loads(res.stdout or "null") or []
    except ValueError:
        raise BuildError("`buildah containers --json` answered something unreadable", detail=res.stdout[:500]) from None
    return [r for r in rows if isinstance(r, dict)]


def remove(bh: Buildah, refs: list[str]) -> None:
    """Remove images by name or id (missing ones are not an error)."""
    for ref in refs:
        bh.run("rmi", "--force", ref, check=False, timeout=600)
