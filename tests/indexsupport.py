"""Real servers for the publication tests, on loopback: devpi (a package index server with a login) and nginx
(a web server, as a site is served). Each start returns once the server answers, and a stop that ends it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

DEVPI_USER, DEVPI_PASSWORD = "publisher", "s3cret-Index-Login"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, log: Path, limit_s: float = 180) -> None:
    """Until ``url`` answers (any HTTP status), or fail with the server's log."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"{url} did not answer within {limit_s:g} s: {log.read_text()[-2000:]}")


@dataclasses.dataclass
class Server:
    url: str
    stop: Callable[[], None]
    upload: str = ""  # devpi: the index's upload URL
    index: str = ""  # devpi: the index's PEP 503 URL


def _stopper(proc: subprocess.Popen, log) -> Callable[[], None]:
    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

    return stop


def have_devpi() -> bool:
    return all(shutil.which(t) for t in ("devpi-server", "devpi-init", "devpi"))


def start_devpi(folder: Path) -> Server:
    """devpi-server (offline: no mirror of PyPI) with a user and a non-volatile index, which never replaces a
    file it holds; uploads need the login, reads do not."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["devpi-init", "--serverdir", str(folder / "srv"), "--root-passwd", "root-pw"], check=True,
                   capture_output=True)  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = folder / "server.log"
    log = open(log_path, "w")  # noqa: SIM115 (open for the server's lifetime)
    proc = subprocess.Popen(
        ["devpi-server", "--serverdir", str(folder / "srv"), "--host", "127.0.0.1", "--port", str(port), "--offline-mode"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    _wait(f"{url}/+api", proc, log_path)
    env = {**os.environ, "DEVPI_CLIENTDIR": str(folder / "client")}
    for argv in (
        ["devpi", "use", url],
        ["devpi", "user", "-c", DEVPI_USER, f"password={DEVPI_PASSWORD}"],
        ["devpi", "login", DEVPI_USER, "--password", DEVPI_PASSWORD],
        ["devpi", "index", "-c", f"{DEVPI_USER}/flash", "bases=", "volatile=False"],
    ):
        subprocess.run(argv, check=True, capture_output=True, env=env)
    return Server(url, _stopper(proc, log), f"{url}/{DEVPI_USER}/flash/", f"{url}/{DEVPI_USER}/flash/+simple/")


NGINX_CONF = """\
daemon off;
user root;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log;
events {{ worker_connections 64; }}
http {{
    types {{ text/html html; text/plain txt; application/json json; application/octet-stream whl; }}
    access_log {folder}/access.log;
    client_body_temp_path {folder}/tmp;
    proxy_temp_path {folder}/tmp;
    fastcgi_temp_path {folder}/tmp;
    uwsgi_temp_path {folder}/tmp;
    scgi_temp_path {folder}/tmp;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ autoindex off; try_files $uri $uri/index.html =404; }}
    }}
}}
"""


def nginx() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def start_nginx(folder: Path, root: Path, port: int) -> Server:
    """nginx serving ``root`` at http://127.0.0.1:PORT/ (a directory's index.html for its URL, as Pages does)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tmp").mkdir(exist_ok=True)
    conf = folder / "nginx.conf"
    conf.write_text(NGINX_CONF.format(folder=folder, root=root, port=port))
    log_path = folder / "stderr.log"
    log = open(log_path, "w")  # noqa: SIM115 (open for the server's lifetime)
    exe = nginx()
    assert exe, "nginx is not installed (apt-get install nginx-light)"
    proc = subprocess.Popen([exe, "-c", str(conf), "-p", str(folder)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    _wait(url, proc, log_path)
    return Server(url, _stopper(proc, log))
