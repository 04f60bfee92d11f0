"""A real OCI registry on loopback for tests and CI: Debian's ``docker-registry`` (distribution 2.x).

``LocalRegistry`` writes a temporary config (filesystem storage on 127.0.0.1:PORT), starts
``docker-registry serve`` with its own log, and waits until ``/v2/`` answers. Plain HTTP by default;
with ``tls=(CERT, KEY)`` it serves HTTPS, and with ``htpasswd=FILE`` (bcrypt entries) it asks for a
login, like the registries users publish to.
"""

from __future__ import annotations

import logging
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from flashkit.core import procs
from flashkit.core.errors import EngineError

log = logging.getLogger(__name__)

_CONFIG = """\
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""
_TLS = """\
  tls:
    certificate: {cert}
    key: {key}
"""
_AUTH = """\
auth:
  htpasswd:
    realm: flashkit-test
    path: {htpasswd}
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRegistry:
    """``with LocalRegistry() as reg: ... reg.address`` -> "127.0.0.1:PORT"."""

    def __init__(
        self,
        *,
        port: int | None = None,
        storage: Path | None = None,
        log_path: Path | None = None,
        timeout_s: float = 30.0,
        tls: tuple[Path, Path] | None = None,
        htpasswd: Path | None = None,
        ca_file: Path | None = None,
    ) -> None:
        self.tls, self.htpasswd, self.ca_file = tls, htpasswd, ca_file
        self.port = port or free_port()
        self._own_storage = storage is None
        self.storage = Path(storage) if storage else Path(tempfile.mkdtemp(prefix="flashkit-registry-"))
        self.log_path = log_path or self.storage / "registry.log"
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen | None = None
        self._cfg: Path | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _answers(self) -> bool:
        scheme = "https" if self.tls else "http"
        ctx = ssl.create_default_context(cafile=str(self.ca_file)) if self.tls and self.ca_file else None
        try:
            with urllib.request.urlopen(f"{scheme}://{self.address}/v2/", timeout=2, context=ctx) as r:
                return r.status == 200
        except urllib.error.HTTPError as exc:
            return exc.code == 401 and self.htpasswd is not None  # it answers, and asks for a login
        except (urllib.error.URLError, OSError):
            return False

    def wait(self) -> None:
        """Block until the registry process ends (or the caller is interrupted)."""
        while self._proc is not None and self._proc.poll() is None:
            time.sleep(1)

    def start(self) -> LocalRegistry:
        exe = shutil.which("docker-registry")
        if not exe:
            raise EngineError(
                "docker-registry is not installed",
                hint="apt-get install docker-registry (Debian's distribution 2.8 package)",
            )
        self.storage.mkdir(parents=True, exist_ok=True)
        fd, cfg = tempfile.mkstemp(prefix="registry-", suffix=".yml")
        with open(fd, "w") as f:
            f.write(_CONFIG.format(root=self.storage / "data", port=self.port))
            if self.tls:
                f.write(_TLS.format(cert=self.tls[0], key=self.tls[1]))
            if self.htpasswd:
                f.write(_AUTH.format(htpasswd=self.htpasswd))
        self._cfg = Path(cfg)
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self._proc = subprocess.Popen(
            [exe, "serve", cfg], stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        logf.close()
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-1500:]
                self.stop()
                raise EngineError(f"docker-registry exited with {self._proc.returncode} on start", detail=tail)
            if self._answers():
                log.info("registry at %s (pid %d, storage %s)", self.address, self._proc.pid, self.storage)
                return self
            time.sleep(0.2)
        self.stop()
        raise EngineError(
            f"docker-registry did not answer on {self.address} within {self.timeout_s:.0f}s",
            hint=f"see {self.log_path}",
        )

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            procs.stop(self._proc, grace_s=10)
        self._proc = None
        if self._cfg is not None:
            self._cfg.unlink(missing_ok=True)
            self._cfg = None
        if self._own_storage:
            shutil.rmtree(self.storage, ignore_errors=True)

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
