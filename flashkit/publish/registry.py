"""The registry, spoken to through ``skopeo`` (Debian's package): publishing, pulling back, verifying.

skopeo (containers/image) speaks the OCI distribution protocol with the logins users already have, so
flashkit carries no HTTP client of its own. What it is given:

- **Credentials**, first found wins: ``FLASHKIT_REGISTRY_USER`` with ``FLASHKIT_REGISTRY_PASSWORD`` (written
  to a private temporary auth file, never put on a command line); ``REGISTRY_AUTH_FILE``; the docker
  config (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``, credential helpers included), which
  skopeo reads itself; else none. A credential never reaches a log, an error message, the ledger or an
  image: only where it came from is said ("FLASHKIT_REGISTRY_USER/PASSWORD", "REGISTRY_AUTH_FILE", ...).
- **TLS**: the system's trust store, plus ``FLASHKIT_REGISTRY_CA`` (a PEM file: a registry with its own
  CA). Only a loopback registry without such a CA is spoken to without TLS verification.

Every reply is untrusted input: a manifest is checked to hash to the digest it was asked by, and skopeo
checks every blob against its digest when it copies.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flashkit.core import procs
from flashkit.core.errors import PullBackMismatch, PushFailed, RegistryAuthFailed, ToolError, UsageError
from flashkit.core.textcheck import NETRC_HINT

REGISTRY_ENV = "FLASHKIT_REGISTRY"
USER_ENV, PASSWORD_ENV = "FLASHKIT_REGISTRY_USER", "FLASHKIT_REGISTRY_PASSWORD"
CA_ENV = "FLASHKIT_REGISTRY_CA"
AUTH_FILE_ENV = "REGISTRY_AUTH_FILE"
SKOPEO_TIMEOUT_S = 3600  # a push or pull of a whole image
# One manifest, config, tag list or tag: a registry that accepted the connection but has not answered by then
# will not (skopeo itself waits for an answer without a limit).
REQUEST_TIMEOUT_S = 120
REQUEST_TIMEOUT_ENV = "FLASHKIT_REGISTRY_TIMEOUT"
# A repository path component, as the distribution spec defines it.
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9-]{1,63})*(?::[0-9]{1,5})?")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_AUTH_WORDS = ("unauthorized", "authentication required", "denied", "invalid username/password")
# A status code as a word of its own: "401" must not match inside a port (127.0.0.1:41401), an upload id or a
# digest, where a registry that died mid-push made a broken pipe read as a refused login.
_AUTH_STATUS = re.compile(r"(?<![\w:./%=-])(?:401|403)(?![\w./%-])")


def auth_refused(message: str) -> bool:
    """Whether a registry tool's error says the registry refused the credentials."""
    low = message.lower()
    return any(w in low for w in _AUTH_WORDS) or _AUTH_STATUS.search(low) is not None


@dataclasses.dataclass(frozen=True)
class Target:
    host: str  # host[:port]
    repository: str  # e.g. org/flash

    @property
    def loopback(self) -> bool:
        hostname = self.host.rsplit(":", 1)[0] if self.host.count(":") == 1 else self.host
        return hostname in ("localhost", "::1", "[::1]") or hostname.startswith("127.")

    def ref(self, reference: str | None = None) -> str:
        """``docker://host/repo`` with ``:tag`` or ``@sha256:...`` when given."""
        base = f"docker://{self.host}/{self.repository}"
        if reference is None:
            return base
        return f"{base}@{reference}" if DIGEST_RE.fullmatch(reference) else f"{base}:{reference}"

    def __str__(self) -> str:
        return f"{self.host}/{self.repository}"


def parse_target(text: str | None) -> Target:
    """``HOST[:PORT]/REPO`` from --registry or $FLASHKIT_REGISTRY."""
    if not text:
        raise UsageError(
            f"no registry given: pass --registry HOST[:PORT]/REPOSITORY or set {REGISTRY_ENV} "
            "(e.g. ghcr.io/org/flash; `flashkit registry` runs one on loopback)"
        )
    if "@" in text or "://" in text:
        raise UsageError(
            f"registry {text!r}: give HOST[:PORT]/REPOSITORY without a scheme or credentials; "
            f"credentials come from {USER_ENV}/{PASSWORD_ENV}, {AUTH_FILE_ENV} or the docker config ({NETRC_HINT})"
        )
    host, _, repo = text.partition("/")
    if not repo or not _HOST.fullmatch(host) or not ("." in host or ":" in host or host == "localhost"):
        raise UsageError(
            f"registry {text!r}: expected HOST[:PORT]/REPOSITORY with a registry host "
            "(a name with a dot or a port, or localhost), e.g. ghcr.io/org/flash or 127.0.0.1:5000/org/flash"
        )
    bad = [c for c in repo.split("/") if not _COMPONENT.fullmatch(c)]
    if bad:
        raise UsageError(
            f"registry {text!r}: repository component {bad[0]!r} is not allowed; "
            "use lowercase letters, digits and single separators (. _ -)"
        )
    return Target(host, repo)


def parse_image_ref(text: str) -> tuple[Target, str]:
    """``HOST[:PORT]/REPO:TAG`` or ``HOST[:PORT]/REPO@sha256:...`` -> (target, tag or digest)."""
    if "@" in text:
        name, _, reference = text.partition("@")
        if not DIGEST_RE.fullmatch(reference):
            raise UsageError(f"{text!r}: after @ comes a digest, sha256:<64 hex>")
    else:
        slash = text.rfind("/")
        colon = text.rfind(":")
        if colon <= slash:
            raise UsageError(
                f"{text!r}: name a tag (REPO:TAG) or a digest (REPO@sha256:...), e.g. ghcr.io/org/flash:torch2.11-cu13.0"
            )
        name, reference = text[:colon], text[colon + 1 :]
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", reference):
            raise UsageError(f"{text!r}: {reference!r} is not a valid tag")
    return parse_target(name), reference


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def json_reply(what: str, body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise PushFailed(
            f"{what}: the registry answered something that is not JSON", detail=body[:300].decode(errors="replace")
        ) from None


def manifest_parts(what: str, body: bytes) -> tuple[str, list[str]]:
    """(config digest, layer digests) of an image manifest, checked."""
    m = json_reply(what, body)
    try:
        config = m["config"]["digest"]
        layers = [layer["digest"] for layer in m["layers"]]
    except (KeyError, TypeError):
        raise PullBackMismatch(f"{what}: not an image manifest (no config or layers)") from None
    for d in (config, *layers):
        if not isinstance(d, str) or not DIGEST_RE.fullmatch(d):
            raise PullBackMismatch(f"{what}: {d!r} is not a sha256 digest")
    return config, layers


@dataclasses.dataclass(frozen=True)
class Access:
    """How to reach one registry: an auth file (or skopeo's own lookup), a CA folder, TLS on or off."""

    auth_file: str | None
    cert_dir: str | None
    tls_verify: bool
    credentials_from: str  # where the login came from, for messages; never the login itself
    secrets: tuple[str, ...] = ()  # values to blank out of anything skopeo prints

    def flags(self, role: str = "") -> list[str]:
        """skopeo flags for a command (``role`` "src"/"dest" for copy's two sides)."""
        pre = f"--{role}-" if role else "--"
        out = [f"{pre}tls-verify={'true' if self.tls_verify else 'false'}"]
        if self.cert_dir:
            out.append(f"{pre}cert-dir={self.cert_dir}")
        if self.auth_file:
            out.append(f"{pre}authfile={self.auth_file}")
        return out

    def redact(self, text: str) -> str:
        for s in self.secrets:
            if s:
                text = text.replace(s, "***")
        return text


def _docker_config() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


@contextlib.contextmanager
def access(target: Target, environ: dict[str, str] | None = None) -> Iterator[Access]:
    """The :class:`Access` for ``target`` from the environment; temporary files removed afterwards."""
    env = dict(os.environ if environ is None else environ)
    user, password = env.get(USER_ENV), env.get(PASSWORD_ENV)
    if bool(user) != bool(password):
        raise UsageError(f"set both {USER_ENV} and {PASSWORD_ENV}, or neither")
    ca = env.get(CA_ENV)
    if ca and not Path(ca).is_file():
        raise UsageError(f"{CA_ENV}={ca!r} is not a readable file (a PEM CA certificate)")
    with tempfile.TemporaryDirectory(prefix="flashkit-registry-") as tmp:
        os.chmod(tmp, 0o700)
        cert_dir = None
        if ca:
            cert_dir = os.path.join(tmp, "certs")
            os.mkdir(cert_dir)
            shutil.copyfile(ca, os.path.join(cert_dir, "ca.crt"))
        secrets: tuple[str, ...] = ()
        if user and password:
            auth_file, source = os.path.join(tmp, "auth.json"), f"{USER_ENV}/{PASSWORD_ENV}"
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            fd = os.open(auth_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"auths": {target.host: {"auth": token}}}, f)
            secrets = (password, token)
        elif env.get(AUTH_FILE_ENV):
            auth_file, source = env[AUTH_FILE_ENV], AUTH_FILE_ENV
        else:
            auth_file, source = None, f"the docker config ({_docker_config()})" if _docker_config().exists() else "none"
        yield Access(auth_file, cert_dir, bool(ca) or not target.loopback, source, secrets)


def request_timeout() -> float:
    """The limit on one registry request: ``$FLASHKIT_REGISTRY_TIMEOUT`` seconds, else REQUEST_TIMEOUT_S."""
    text = os.environ.get(REQUEST_TIMEOUT_ENV, "").strip()
    if not text:
        return REQUEST_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= SKOPEO_TIMEOUT_S:
        raise UsageError(f"{REQUEST_TIMEOUT_ENV}={text!r}: give seconds, more than 0 and at most {SKOPEO_TIMEOUT_S}")
    return value


class Registry:
    """One repository of one registry, through skopeo."""

    def __init__(self, target: Target, acc: Access) -> None:
        if not shutil.which("skopeo"):
            raise ToolError(
                "skopeo is not installed", hint="apt-get install skopeo (or `flashkit engine ensure --install`)"
            )
        self.target = target
        self.access = acc

    def _run(
        self, what: str, argv: list[str], *, missing_ok: bool = False, transfer: bool = False
    ) -> subprocess.CompletedProcess | None:
        """``transfer``: a whole image moves (push, pull), under the long limit; else one request's limit."""
        limit = SKOPEO_TIMEOUT_S if transfer else request_timeout()

        def timed_out(message: str) -> PushFailed:
            hint = f"check that the registry is up and reachable; for a slow one set {REQUEST_TIMEOUT_ENV} (seconds)"
            return PushFailed(message, hint=hint)

        res = procs.run(
            ["skopeo", *argv], timeout=limit, what=f"{what}: skopeo", timeout_error=timed_out,
            timeout_message=f"{what}: {self.target.host} did not answer within {limit:g}s", capture_output=True,
        )  # fmt: skip
        if res.returncode == 0:
            return res
        err = self.access.redact(res.stderr.decode(errors="replace")).strip()
        low = err.lower()
        if missing_ok and ("manifest unknown" in low or "name unknown" in low or "not found" in low):
            return None
        if auth_refused(low):
            raise RegistryAuthFailed(
                f"{what}: {self.target.host} refused the login (credentials from {self.access.credentials_from})",
                detail=err[-600:],
                hint=f"set {USER_ENV} and {PASSWORD_ENV}, or log in so that {AUTH_FILE_ENV} or the docker "
                "config holds credentials for this registry",
            )
        if "certificate" in low or "x509" in low or "tls" in low:
            raise PushFailed(
                f"{what}: TLS with {self.target.host} failed",
                detail=err[-600:],
                hint=f"set {CA_ENV} to the registry's CA",
            )
        raise PushFailed(f"{what}: skopeo failed (exit {res.returncode})", detail=err[-800:])

    def manifest(self, reference: str) -> tuple[bytes, str] | None:
        """(bytes, digest) of the manifest ``reference`` names (tag or digest), None when there is none."""
        what = f"manifest {self.target}:{reference}"
        res = self._run(what, ["inspect", "--raw", *self.access.flags(), self.target.ref(reference)], missing_ok=True)
        if res is None:
            return None
        digest = sha256_digest(res.stdout)
        if DIGEST_RE.fullmatch(reference) and digest != reference:
            raise PullBackMismatch(f"{what}: the registry served bytes hashing to {digest}")
        return res.stdout, digest

    def config(self, reference: str) -> tuple[bytes, str]:
        """(bytes, sha256 digest) of the image config ``reference`` names: the digest is the image id."""
        res = self._run(
            f"config of {self.target}:{reference}",
            ["inspect", "--raw", "--config", *self.access.flags(), self.target.ref(reference)],
        )
        assert res is not None
        return res.stdout, sha256_digest(res.stdout)

    def tags(self) -> list[str]:
        res = self._run(
            f"tags of {self.target}", ["list-tags", *self.access.flags(), self.target.ref()], missing_ok=True
        )
        if res is None:
            return []
        listed = json_reply(f"tags of {self.target}", res.stdout).get("Tags") or []
        return sorted(t for t in listed if isinstance(t, str))

    def push(self, layout: Path, name: str, reference: str) -> None:
        """Copy ``oci:layout:name`` to ``reference`` (a digest: no tag is made) unchanged."""
        argv = ["copy", "--quiet", "--preserve-digests", *self.access.flags("dest")]
        self._run(
            f"push to {self.target}:{reference}",
            [*argv, f"oci:{layout}:{name}", self.target.ref(reference)],
            transfer=True,
        )

    def fetch(self, reference: str, layout: Path, name: str = "image") -> None:
        """Copy ``reference`` from the registry into ``oci:layout:name`` unchanged (blobs checked)."""
        argv = ["copy", "--quiet", "--preserve-digests", *self.access.flags("src")]
        self._run(
            f"pull {self.target}:{reference}",
            [*argv, self.target.ref(reference), f"oci:{layout}:{name}"],
            transfer=True,
        )

    def tag(self, digest: str, tag: str) -> None:
        """Point ``tag`` at the manifest ``digest`` (same bytes: the tag's digest is ``digest``)."""
        argv = ["copy", "--quiet", "--preserve-digests", *self.access.flags("src"), *self.access.flags("dest")]
        self._run(f"tag {self.target}:{tag}", [*argv, self.target.ref(digest), self.target.ref(tag)])
        got = self.manifest(tag)
        if got is None or got[1] != digest:
            raise PushFailed(f"{self.target}:{tag} names {got[1] if got else 'nothing'} after tagging, not {digest}")


def engine_to_layout(image_id: str, layout: Path, name: str = "image") -> None:
    """Copy the engine's image ``image_id`` into ``oci:layout:name`` (layers gzip-compressed, config unchanged)."""
    res = procs.run(
        ["skopeo", "copy", "--quiet", f"docker-daemon:{image_id}", f"oci:{layout}:{name}"],
        timeout=SKOPEO_TIMEOUT_S,
        error=PushFailed,
        what=f"reading image {image_id} out of the engine",
        capture_output=True,
    )
    if res.returncode != 0:
        raise PushFailed(f"reading image {image_id} out of the engine failed", detail=res.stderr.decode()[-800:])


def layout_manifest(layout: Path, name: str = "image") -> tuple[bytes, str]:
    """(bytes, digest) of the manifest ``name`` in an OCI layout folder, checked against its blob name."""
    try:
        index = json.loads((layout / "index.json").read_text())
        entry = next(
            m
            for m in index["manifests"]
            if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == name
        )
        digest = entry["digest"]
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        raise PullBackMismatch(f"{layout}: no manifest named {name!r} in the OCI layout") from None
    body = layout_blob(layout, digest)
    return body, digest


def layout_blob(layout: Path, digest: str) -> bytes:
    if not DIGEST_RE.fullmatch(str(digest)):
        raise PullBackMismatch(f"{digest!r} is not a sha256 digest")
    body = (layout / "blobs" / "sha256" / digest[7:]).read_bytes()
    if sha256_digest(body) != digest:
        raise PullBackMismatch(f"blob {digest} in {layout} does not hash to its name")
    return body
