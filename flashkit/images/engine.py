"""Find, start and check the container engine that runs the images (tiers), and install the image tools.

This is the one place that knows how the build host gets its tools: a fresh host has none, so
``ensure_engine`` can install Debian's ``docker.io`` (the engine the tiers run containers in),
``mmdebstrap`` and ``buildah`` (reproducible bases and builds, :mod:`flashkit.images.buildah`),
``skopeo`` (the registry client), ``diffoscope-minimal`` (explaining differing layers) and
``docker-registry`` (a real registry for the publish tests), start ``dockerd`` in the background with its
own log file and wait for the socket. Builds do not go through the engine.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from packaging.version import InvalidVersion, Version

from flashkit.core import procs
from flashkit.core.errors import EngineError

log = logging.getLogger(__name__)

# 20.10: its API knows DeviceRequests (--gpus all) and loads OCI-built images with their config unchanged.
MIN_ENGINE_VERSION = Version("20.10")

DEFAULT_SOCKET = "/var/run/docker.sock"
# docker.io: the engine the tiers run in; mmdebstrap + buildah: reproducible bases and images; skopeo: the
# registry client (publish, verify-image); diffoscope-minimal: what differs between two layers;
# docker-registry: a real registry (TLS, htpasswd) for the publish tests.
APT_TIMEOUT_S = 1800  # apt-get update or install of the engine packages (about 300 MB)
APT_PACKAGES = ("docker.io", "mmdebstrap", "buildah", "skopeo", "diffoscope-minimal", "docker-registry")


@dataclasses.dataclass(frozen=True)
class Engine:
    """A running engine that passed the version check."""

    base_url: str
    server_version: str
    api_version: str
    storage_driver: str
    data_root: str

    def sdk(self):
        import docker

        return docker.DockerClient(base_url=self.base_url, timeout=600)


def _base_url() -> str:
    return os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"


def _ping(base_url: str) -> dict | None:
    """Return the engine's version info, or None when nothing answers."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.DockerClient(base_url=base_url, timeout=5)
        try:
            return client.version()
        finally:
            client.close()
    except (DockerException, OSError) as exc:
        log.debug("no engine at %s: %s", base_url, exc)
        return None


def _check_version(info: dict) -> None:
    raw = info.get("Version", "")
    try:
        # Debian spells it "20.10.24+dfsg1"; the local part is irrelevant here.
        have = Version(raw.split("+")[0].split("-")[0])
    except InvalidVersion as exc:
        raise EngineError(f"cannot parse the engine version {raw!r}") from exc
    if have < MIN_ENGINE_VERSION:
        raise EngineError(
            f"docker engine {raw} is older than the minimum {MIN_ENGINE_VERSION}",
            hint="upgrade the engine (Debian's docker.io in bookworm is 20.10.24)",
        )


def _missing_packages() -> list[str]:
    missing = []
    for pkg in APT_PACKAGES:
        res = procs.run(
            ["dpkg-query", "-W", "-f", "${Status}", pkg], timeout=60, error=EngineError, capture_output=True, text=True
        )
        if "install ok installed" not in res.stdout:
            missing.append(pkg)
    return missing


def _install_packages() -> None:
    missing = _missing_packages()
    if not missing:
        return
    if os.geteuid() != 0:
        raise EngineError("installing docker.io needs root", hint="run as root or install docker.io yourself")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log.info("installing %s with apt-get", " ".join(missing))
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        # An install fetches from the archive: long, but not forever on a mirror that stopped answering.
        res = procs.run(argv, timeout=APT_TIMEOUT_S, error=EngineError, capture_output=True, text=True, env=env)
        if res.returncode != 0:
            raise EngineError(f"`{' '.join(argv)}` failed (exit {res.returncode})", detail=res.stderr[-2000:])


def _start_dockerd(log_path: Path, timeout_s: float) -> None:
    dockerd = shutil.which("dockerd")
    if not dockerd:
        raise EngineError("dockerd is not installed", hint="rerun with --install, or `apt-get install docker.io`")
    if os.geteuid() != 0:
        raise EngineError("starting dockerd needs root", hint="start the engine yourself or run as root")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logf = open(log_path, "ab")  # noqa: SIM115 - handed to the daemon, which outlives us
    # A new session so the daemon survives this process and its terminal.
    proc = subprocess.Popen(
        [dockerd], stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    log.info("started dockerd (pid %d), log %s", proc.pid, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise EngineError(f"dockerd exited with {proc.returncode} while starting", detail=tail)
        if _ping(_base_url()):
            return
        time.sleep(0.5)
    raise EngineError(f"dockerd did not answer within {timeout_s:.0f}s", hint=f"see {log_path}")


def ensure_engine(
    *,
    start: bool = True,
    install: bool = False,
    log_path: Path = Path(".work/logs/dockerd.log"),
    timeout_s: float = 60.0,
) -> Engine:
    """Return a running, recent-enough engine, starting (and installing) it if asked."""
    base_url = _base_url()
    # CI and `nox -s test-<env>` on a fresh host set this instead of threading a flag through.
    if install or os.environ.get("FLASHKIT_INSTALL_ENGINE") == "1":
        _install_packages()
    info = _ping(base_url)
    if info is None:
        if not start:
            raise EngineError(
                f"no docker engine answers at {base_url}",
                hint="run `flashkit engine ensure` (add --install on a fresh host)",
            )
        _start_dockerd(log_path, timeout_s)
        info = _ping(base_url)
        if info is None:
            raise EngineError(f"dockerd started but {base_url} does not answer")
    _check_version(info)
    import docker

    sdk = docker.DockerClient(base_url=base_url, timeout=30)
    try:
        sysinfo = sdk.info()
    finally:
        sdk.close()
    engine = Engine(
        base_url=base_url,
        server_version=info.get("Version", "?"),
        api_version=info.get("ApiVersion", "?"),
        storage_driver=sysinfo.get("Driver", "?"),
        data_root=sysinfo.get("DockerRootDir", "?"),
    )
    log.info(
        "engine %s (API %s, %s, %s) at %s",
        engine.server_version,
        engine.api_version,
        engine.storage_driver,
        engine.data_root,
        base_url,
    )
    return engine


def engine_available() -> tuple[bool, str]:
    """For tests: is an engine answering right now? Never starts one."""
    info = _ping(_base_url())
    if info is None:
        return False, f"no docker engine answers at {_base_url()} (run `flashkit engine ensure --install`)"
    return True, f"engine {info.get('Version')}"
