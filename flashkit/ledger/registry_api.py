"""The few OCI distribution (v2) calls publishing needs that the docker SDK has no verb for.

Manifest by digest, cross-repository mount, delete, tags. Every reply is treated as untrusted input:
bodies are size-capped, JSON is parsed defensively, a missing field or a wrong digest is a
:class:`~flashkit.core.errors.PushFailed` or :class:`~flashkit.core.errors.PullBackMismatch` naming the
call, never a traceback. Loopback registries are spoken to over plain HTTP (the engine treats
127.0.0.0/8 as insecure by default), others over HTTPS.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

from flashkit.core.errors import PullBackMismatch, PushFailed, UsageError
from flashkit.core.textcheck import NETRC_HINT

REGISTRY_ENV = "FLASHKIT_REGISTRY"
STAGING_SUFFIX = "-staging"
MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
)
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_CONFIG_BYTES = 16 * 1024 * 1024
# A repository path component, as the distribution spec defines it.
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9-]{1,63})*(?::[0-9]{1,5})?")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class Target:
    host: str  # host[:port]
    repository: str  # e.g. org/flash

    @property
    def base_url(self) -> str:
        hostname = self.host.rsplit(":", 1)[0] if self.host.count(":") == 1 else self.host
        loopback = hostname in ("localhost", "::1", "[::1]") or hostname.startswith("127.")
        return f"{'http' if loopback else 'https'}://{self.host}"

    @property
    def staging(self) -> str:
        return self.repository + STAGING_SUFFIX

    def ref(self, repository: str | None = None) -> str:
        return f"{self.host}/{repository or self.repository}"

    def __str__(self) -> str:
        return self.ref()


def parse_target(text: str | None) -> Target:
    """``HOST[:PORT]/REPO`` from --registry or $FLASHKIT_REGISTRY."""
    if not text:
        raise UsageError(
            f"no registry given: pass --registry HOST[:PORT]/REPOSITORY or set {REGISTRY_ENV} "
            "(e.g. 127.0.0.1:5000/org/flash; `flashkit registry` runs one on loopback)"
        )
    if "@" in text or "://" in text:
        raise UsageError(
            f"registry {text!r}: give HOST[:PORT]/REPOSITORY without a scheme or credentials; {NETRC_HINT}"
        )
    host, _, repo = text.partition("/")
    if not repo or not _HOST.fullmatch(host) or not ("." in host or ":" in host or host == "localhost"):
        raise UsageError(
            f"registry {text!r}: expected HOST[:PORT]/REPOSITORY with a registry host "
            "(a name with a dot or a port, or localhost), e.g. 127.0.0.1:5000/org/flash"
        )
    bad = [c for c in repo.split("/") if not _COMPONENT.fullmatch(c)]
    if bad:
        raise UsageError(
            f"registry {text!r}: repository component {bad[0]!r} is not allowed; "
            "use lowercase letters, digits and single separators (. _ -)"
        )
    return Target(host, repo)


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
        if not isinstance(d, str) or not _DIGEST.fullmatch(d):
            raise PullBackMismatch(f"{what}: {d!r} is not a sha256 digest")
    return config, layers


class RegistryAPI:
    def __init__(self, target: Target, timeout_s: float = 60.0) -> None:
        self.target = target
        self.timeout_s = timeout_s

    def _call(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None = None,
        headers: dict | None = None,
        limit: int = MAX_MANIFEST_BYTES,
    ):
        url = f"{self.target.base_url}/v2/{path}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                body = resp.read(limit + 1)
                status, reply_headers = resp.status, resp.headers
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read(64 * 1024)
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            raise PushFailed(
                f"registry {self.target.host} did not answer {method} {url}: {exc}",
                hint=f"check --registry / ${REGISTRY_ENV}; `flashkit registry --port N` runs one on loopback",
            ) from None
        if len(body) > limit:
            raise PushFailed(f"registry {self.target.host}: {method} {path} answered more than {limit >> 20} MiB")
        declared = reply_headers.get("Content-Length")
        if declared and declared.isdigit() and len(body) < int(declared):
            raise PushFailed(
                f"registry {self.target.host} did not answer {method} {path} whole: "
                f"{len(body)} of {declared} bytes before the connection closed"
            )
        return status, reply_headers, body

    def _ok(self, what: str, status: int, body: bytes, ok: Iterable[int]) -> None:
        if status not in ok:
            raise PushFailed(
                f"registry {self.target.host}: {what} answered HTTP {status}",
                detail=body[:800].decode(errors="replace"),
            )

    def tags(self, repository: str) -> list[str]:
        status, _h, body = self._call("GET", f"{repository}/tags/list")
        if status == 404:  # NAME_UNKNOWN: the repository has never received a manifest
            return []
        self._ok(f"tags of {repository}", status, body, (200,))
        tags = json_reply(f"tags of {repository}", body)
        listed = tags.get("tags") if isinstance(tags, dict) else None
        if listed is not None and not (isinstance(listed, list) and all(isinstance(t, str) for t in listed)):
            raise PushFailed(f"registry {self.target.host}: tags of {repository} is not a list of names")
        return sorted(listed or [])

    def manifest(self, repository: str, reference: str) -> tuple[bytes, str, str] | None:
        """(bytes, media type, digest) of a manifest, or None when there is none."""
        status, headers, body = self._call(
            "GET", f"{repository}/manifests/{reference}", headers={"Accept": ", ".join(MANIFEST_TYPES)}
        )
        if status == 404:
            return None
        self._ok(f"manifest {repository}:{reference}", status, body, (200,))
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        served = headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise PullBackMismatch(f"{repository}:{reference}: registry says digest {served}, bytes hash to {digest}")
        media = (headers.get("Content-Type") or MANIFEST_TYPES[0]).split(";")[0]
        if media not in MANIFEST_TYPES:
            raise PushFailed(f"{repository}:{reference}: a {media!r}, not a single-image manifest")
        return body, media, digest

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str:
        status, headers, text = self._call(
            "PUT", f"{repository}/manifests/{reference}", data=body, headers={"Content-Type": media_type}
        )
        self._ok(f"PUT manifest {repository}:{reference}", status, text, (201,))
        return headers.get("Docker-Content-Digest", "")

    def mount(self, repository: str, digest: str, source: str) -> None:
        status, _h, body = self._call("POST", f"{repository}/blobs/uploads/?mount={digest}&from={source}", data=b"")
        self._ok(f"mount {digest} from {source} into {repository}", status, body, (201,))

    def blob(self, repository: str, digest: str) -> bytes:
        status, _h, body = self._call("GET", f"{repository}/blobs/{digest}", limit=MAX_CONFIG_BYTES)
        self._ok(f"blob {repository}@{digest}", status, body, (200,))
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise PullBackMismatch(f"blob {repository}@{digest} does not hash to its digest")
        return body

    def config(self, repository: str, manifest_body: bytes) -> dict[str, Any]:
        """The image config a manifest names, parsed."""
        config_digest, _layers = manifest_parts(f"manifest in {repository}", manifest_body)
        config = json_reply(f"config {config_digest}", self.blob(repository, config_digest))
        if not isinstance(config, dict):
            raise PullBackMismatch(f"config {config_digest} is not a JSON object")
        return config

    def delete_manifest(self, repository: str, digest: str) -> None:
        status, _h, body = self._call("DELETE", f"{repository}/manifests/{digest}")
        self._ok(f"delete {repository}@{digest}", status, body, (202, 404))


def config_labels(config: dict[str, Any]) -> dict[str, str]:
    labels = (config.get("config") or {}).get("Labels") or {}
    return labels if isinstance(labels, dict) else {}
