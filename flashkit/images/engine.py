"""Find, start and check the container engine, and pick a BuildKit-capable client.

This is the one place that knows how the build host gets a Docker engine:
a fresh host has none, so ``ensure_engine`` can install Debian's ``docker.io``
(with ``debootstrap`` for the air-gapped bases), start ``dockerd`` in the
background with its own log file and wait for the socket.

Builds go through a docker CLI because the SDK has no BuildKit support. Which
CLI is probed, not guessed from its path: the first ``docker`` on PATH may be a
newer client that refuses ``DOCKER_BUILDKIT=1`` without the buildx plugin, while
an older one on the same PATH builds with BuildKit built in (Debian 12: the docker.io 20.10 client).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from packaging.version import InvalidVersion, Version

from flashkit.core.errors import EngineError

log = logging.getLogger(__name__)

# 20.10 is the first engine whose built-in BuildKit frontend handles
# RUN --mount=type=secret|cache without a "# syntax=" line (which would pull a
# frontend image from Docker Hub, unreachable here) and whose API knows
# DeviceRequests (--gpus all).
MIN_ENGINE_VERSION = Version("20.10")

DEFAULT_SOCKET = "/var/run/docker.sock"
# docker.io: engine + a 20.10 client with built-in BuildKit; debootstrap: the air-gapped bases;
# docker-registry: the loopback registry the publish tests push to.
APT_PACKAGES = ("docker.io", "debootstrap", "docker-registry")


@dataclasses.dataclass(frozen=True)
class BuildClient:
    """A docker CLI that can run a BuildKit build, and how to invoke it."""

    path: str
    version: str
    # "buildx": `docker buildx build --load`; "builtin": `DOCKER_BUILDKIT=1 docker build`.
    mode: str

    def build_argv(self) -> list[str]:
        if self.mode == "buildx":
            return [self.path, "buildx", "build", "--load"]
        return [self.path, "build"]

    def build_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["DOCKER_BUILDKIT"] = "1"
        return env

    def describe(self) -> str:
        how = "buildx plugin" if self.mode == "buildx" else "built-in BuildKit (DOCKER_BUILDKIT=1)"
        return f"{self.path} (client {self.version}, {how})"


@dataclasses.dataclass(frozen=True)
class Engine:
    """A running engine that passed the version check, plus the client used for builds."""

    base_url: str
    server_version: str
    api_version: str
    storage_driver: str
    data_root: str
    build_client: BuildClient

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


def _candidate_clients() -> list[str]:
    """Every distinct docker executable: FLASHKIT_DOCKER_CLI first, then PATH order."""
    seen: set[str] = set()
    found: list[str] = []
    override = os.environ.get("FLASHKIT_DOCKER_CLI")
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    paths = ([override] if override else []) + [os.path.join(d, "docker") for d in dirs if d]
    for p in paths:
        if not (os.path.isfile(p) and os.access(p, os.X_OK)):
            continue
        real = os.path.realpath(p)
        if real in seen:
            continue
        seen.add(real)
        found.append(p)
    return found


def _client_version(path: str) -> str:
    out = subprocess.run(
        [path, "version", "--format", "{{.Client.Version}}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    # The client prints its own version even when the server part fails.
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"


def _probe_buildkit(path: str, env: dict[str, str]) -> tuple[str | None, str]:
    """Return (mode, detail): the way this CLI runs a BuildKit build with secrets, or None.

    The probe is a real build of a one-file scratch image that passes a
    --secret: the legacy builder rejects --secret, and a client that needs a
    missing buildx plugin fails, so success means secrets and BuildKit work.
    """
    with tempfile.TemporaryDirectory(prefix="flashkit-probe-") as tmp:
        ctx = Path(tmp)
        (ctx / "probe").write_text("flashkit buildkit probe\n")
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY probe /probe\n")
        secret = ctx / "secret"
        secret.write_text("probe\n")
        attempts = []
        bx = subprocess.run([path, "buildx", "version"], capture_output=True, text=True, timeout=30, env=env)
        if bx.returncode == 0:
            attempts.append(("buildx", [path, "buildx", "build", "--load"]))
        attempts.append(("builtin", [path, "build"]))
        details = []
        # A tag of its own: two flashkit processes probing at once must not remove each other's image.
        tag = f"flashkit-probe:{uuid.uuid4().hex[:12]}"
        for mode, argv in attempts:
            cmd = [*argv, "-q", "--secret", f"id=probe,src={secret}", "-t", tag, str(ctx)]
            penv = dict(env, DOCKER_BUILDKIT="1")
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=penv)
            if res.returncode == 0:
                subprocess.run([path, "image", "rm", "-f", tag], capture_output=True, timeout=60)
                return mode, "ok"
            lines = [ln.strip() for ln in (res.stderr or res.stdout).splitlines() if ln.strip()]
            # The first line carries the reason ("ERROR: BuildKit is enabled but the buildx
            # component is missing or broken."); later ones are links and usage.
            details.append(f"{mode}: {lines[0] if lines else f'exit {res.returncode}'}")
        return None, "; ".join(details)


def pick_build_client() -> BuildClient:
    """Probe every docker CLI on PATH and return the first that builds with BuildKit."""
    candidates = _candidate_clients()
    if not candidates:
        raise EngineError(
            "no docker CLI found on PATH",
            hint="install Debian's docker.io (`flashkit engine ensure --install`) or set FLASHKIT_DOCKER_CLI",
        )
    refused = []
    for path in candidates:
        mode, detail = _probe_buildkit(path, dict(os.environ))
        version = _client_version(path)
        if mode:
            client = BuildClient(path=path, version=version, mode=mode)
            log.info("build client: %s", client.describe())
            return client
        log.info("build client %s (client %s) refused: %s", path, version, detail)
        refused.append(f"{path} ({version}): {detail}")
    raise EngineError(
        "no docker CLI on PATH can run a BuildKit build with --secret",
        detail="\n".join(refused),
        hint="install the buildx plugin, or Debian's docker.io whose 20.10 client has BuildKit built in",
    )


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
        res = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", pkg], capture_output=True, text=True)
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
        res = subprocess.run(argv, capture_output=True, text=True, env=env)
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
        build_client=pick_build_client(),
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
