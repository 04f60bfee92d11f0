"""Verified wheels onto a package index server with a login, the kind a platform team runs on-premises.

Any server that speaks the upload API PyPI defined and serves a PEP 503 index: devpi (upload to
``http://host/USER/INDEX/``, index at ``http://host/USER/INDEX/+simple/``; the one the tests run), Artifactory,
Nexus, pypiserver, GitLab's package registry. The upload client is twine, PyPI's own: it reads the login from
``TWINE_USERNAME`` / ``TWINE_PASSWORD`` (or the keyring), never from flashkit's command line, so the
password appears in no process listing, log or file that flashkit writes. Reading the index back uses
the same login from the same variables.

Order, so that what users are told to install is never half there:

1. for each wheel, read the index's project page: a file of that name with the verified sha256 is kept
   as it is; one with other bytes refuses the whole publication (an index never changes a file);
2. upload the others with twine;
3. read the project page again and download every verified file back: its sha256 must be the one the
   ledger judged (the server stored what was sent);

and only then does the caller write the requirement files that name the index. A failure in any step
leaves those unwritten; a wheel uploaded before the failure is a verified wheel nobody is pointed at.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from flashkit.core import procs
from flashkit.core.errors import PullBackMismatch, PushFailed, RegistryAuthFailed, UsageError

USER_ENV, PASSWORD_ENV = "TWINE_USERNAME", "TWINE_PASSWORD"
MAX_PAGE_BYTES = 8 * 1024 * 1024
MAX_WHEEL_BYTES = 4 * 1024 * 1024 * 1024
TIMEOUT_S = 120
UPLOAD_TIMEOUT_S = 1800


class _Links(HTMLParser):
    """The anchors of a PEP 503 project page: file name -> (href, sha256 from the fragment or None)."""

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, tuple[str, str | None]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        href = dict(attrs).get("href") or ""
        path, _, fragment = href.partition("#")
        name = urlsplit(path).path.rsplit("/", 1)[-1]
        m = re.fullmatch(r"sha256=([0-9a-f]{64})", fragment)
        if name:
            self.files[name] = (href, m.group(1) if m else None)


def login() -> tuple[str, str]:
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if not user or not password:
        raise RegistryAuthFailed(
            f"the index server needs a login: set {USER_ENV} and {PASSWORD_ENV} (twine reads the same two)",
            hint="export them in the shell or the CI job's secrets; flashkit never takes a password as an argument",
        )
    return user, password


def _scrub(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


def _open(url: str, auth: tuple[str, str]):
    """The response at ``url``, read with the login (None: 404); the server's refusals as flashkit's errors."""
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}", "Accept": "text/html"})
    try:
        return urllib.request.urlopen(req, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        if exc.code in (401, 403):
            raise RegistryAuthFailed(f"{url}: the index server refused the login (HTTP {exc.code})") from None
        raise PushFailed(f"{url}: the index server answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PushFailed(f"{url}: the index server cannot be reached ({getattr(exc, 'reason', exc)})") from None


def _page(url: str, auth: tuple[str, str]) -> str | None:
    resp = _open(url, auth)
    if resp is None:
        return None
    with resp:
        body = resp.read(MAX_PAGE_BYTES + 1)
    if len(body) > MAX_PAGE_BYTES:
        raise PushFailed(f"{url}: the page is larger than {MAX_PAGE_BYTES} bytes")
    return body.decode("utf-8", "replace")


def _sha256_of(url: str, auth: tuple[str, str]) -> str:
    """The sha256 of the file the server serves at ``url``, read in chunks (a wheel can be large)."""
    resp = _open(url, auth)
    if resp is None:
        raise PullBackMismatch(f"{url}: listed by the index, but not served (404)")
    h, size = hashlib.sha256(), 0
    with resp:
        while chunk := resp.read(1 << 20):
            size += len(chunk)
            if size > MAX_WHEEL_BYTES:
                raise PullBackMismatch(f"{url}: larger than any wheel ({MAX_WHEEL_BYTES} bytes)")
            h.update(chunk)
    return h.hexdigest()


def served(index_url: str, project: str, auth: tuple[str, str]) -> dict[str, tuple[str, str | None]]:
    """The files the index lists for ``project``: name -> (absolute URL, sha256 of its fragment)."""
    page_url = f"{index_url}{project}/"
    body = _page(page_url, auth)
    if body is None:
        return {}
    links = _Links()
    links.feed(body)
    return {name: (urljoin(page_url, href.partition("#")[0]), sha) for name, (href, sha) in links.files.items()}


def _twine(repository_url: str, wheel: Path, password: str) -> None:
    argv = ["twine", "upload", "--non-interactive", "--disable-progress-bar", "--repository-url", repository_url]
    env = {**os.environ, "NO_COLOR": "1"}  # plain text: its messages are shown, and scrubbed of the password
    done = procs.run(
        [*argv, str(wheel)], timeout=UPLOAD_TIMEOUT_S, error=PushFailed, capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        said = _scrub((done.stdout + done.stderr).strip(), password)[-1500:]
        if re.search(r"\b(401|403)\b|Invalid or non-existent authentication", said):
            raise RegistryAuthFailed(f"twine: {repository_url} refused the login:\n{said}")
        raise PushFailed(f"twine could not upload {wheel.name} to {repository_url}:\n{said}")


def upload(
    repository_url: str,
    index_url: str,
    project: str,
    wheels: dict[str, tuple[Path, str]],
    say: Callable[[str], None] = lambda s: None,
) -> None:
    """Steps 1-3 of the module docstring for ``wheels`` (file name -> (path, verified sha256))."""
    if not urlsplit(repository_url).scheme.startswith("http"):
        raise UsageError(f"--index-server {repository_url!r}: give the server's upload URL (http or https)")
    auth = login()
    there = served(index_url, project, auth)
    todo = []
    for name, (path, sha) in sorted(wheels.items()):
        if name in there:
            got = there[name][1] or _sha256_of(there[name][0], auth)
            if got != sha:
                raise PushFailed(
                    f"{index_url}{project}/ already holds {name} with sha256 {got}, not the verified {sha}",
                    hint="an index never replaces a file; remove it on the server, or publish under a new version",
                )
            say(f"{name}: already on the index with the verified sha256")
            continue
        todo.append((name, path))
    for name, path in todo:
        say(f"uploading {name} to {repository_url} with twine")
        _twine(repository_url, path, auth[1])
    there = served(index_url, project, auth)
    for name, (_path, sha) in sorted(wheels.items()):
        if name not in there:
            raise PullBackMismatch(f"{index_url}{project}/ does not list {name} after the upload")
        got = _sha256_of(there[name][0], auth)
        if got != sha:
            raise PullBackMismatch(f"{there[name][0]} serves sha256 {got}, the verified wheel is {sha}")
        say(f"{name}: read back from the index, sha256 {sha[:16]}... as verified")
