"""Signed in-toto attestations of a published image: what they say, how they are signed and checked.

Two in-toto v1 statements name the image's manifest digest as their subject:

- SLSA provenance v1 (``https://slsa.dev/provenance/v1``): the input hash and every part of it (the spec's
  values, the lock hashes, the template and kernel-source hashes), the base image ids, the builder and tool
  versions, and every independent build the ledger holds for this image;
- a verification predicate (``VERIFICATION_TYPE``): each tier that decided the gate, with its verdict,
  counts, where it ran (host, GPU, driver, torch) and the ledger fact it comes from, and the policy.

Each statement is a DSSE envelope signed with an ed25519 key (``securesystemslib``: DSSE's
pre-authentication encoding, signing and verifying; ``cryptography``: the keys). The envelopes are the
layers of an OCI artifact manifest whose ``subject`` is the image (registries with the OCI referrers API
list it as a referrer); it is stored under the cosign-style tag ``sha256-<hex>.att`` of the same repository,
which is how flashkit finds it on every registry, including those without the referrers API.

Keys: ``flashkit key generate DIR`` writes ``DIR/flashkit.key`` (private, mode 0600) and
``DIR/flashkit.pub``, and refuses a folder inside the repository: a private key never enters the
repository or an image. Publishing reads the private key from ``--signing-key`` or
``FLASHKIT_SIGNING_KEY``; a key file readable by group or others is refused.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any

from flashkit.core.errors import AttestationInvalid, KeyFileError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
VERIFICATION_TYPE = "https://flashkit.invalid/attestation/verification/v1"
BUILD_TYPE = "https://flashkit.invalid/build/buildah-mmdebstrap/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
SIGNING_KEY_ENV = "FLASHKIT_SIGNING_KEY"
VERIFY_KEY_ENV = "FLASHKIT_VERIFY_KEY"
MAX_KEY_BYTES = 16 * 1024
MAX_ENVELOPE_BYTES = 4 * 1024 * 1024


def att_tag(digest: str) -> str:
    """The cosign-style tag an attestation of ``digest`` lives under: ``sha256-<hex>.att``."""
    return digest.replace(":", "-") + ".att"


# -- keys ---------------------------------------------------------------------------------------------------
def generate_keys(folder: Path, repo_root: Path | None) -> tuple[Path, Path]:
    """Write a new ed25519 key pair into ``folder`` (never inside ``repo_root``); the two paths."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder = folder.resolve()
    if repo_root is not None and (folder == repo_root.resolve() or repo_root.resolve() in folder.parents):
        raise KeyFileError(
            f"{folder} is inside the repository: a private key never goes there",
            hint="write it outside (e.g. ~/.config/flashkit) and give publishers FLASHKIT_SIGNING_KEY",
        )
    priv_path, pub_path = folder / "flashkit.key", folder / "flashkit.pub"
    # lexists: a symlink planted there (dangling or not) would have the key written wherever it points.
    for path in (priv_path, pub_path):
        if os.path.lexists(path):
            what = "is a symlink" if path.is_symlink() else "already exists"
            raise KeyFileError(f"{path} {what}; refusing to overwrite a key or write through a link")
    if folder.exists() and not folder.is_dir():
        raise KeyFileError(f"{folder} is not a folder", hint="name a folder for the key pair (it is created)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KeyFileError(f"{folder} cannot be created: {exc.strerror}", hint="name a folder you can write") from None
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    written: list[Path] = []
    try:
        for path, data, mode in ((priv_path, pem, 0o600), (pub_path, pub, 0o644)):
            # O_EXCL | O_NOFOLLOW: a file or link that appears after the check above is refused, not written through.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            written.append(path)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except OSError as exc:
        for path in written:  # half a pair is no use, and a stray private key is a risk
            path.unlink(missing_ok=True)
        raise KeyFileError(f"{exc.filename or folder} cannot be written: {exc.strerror}") from None
    return priv_path, pub_path


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{what} {path} is not a regular file")
        if st.st_size > MAX_KEY_BYTES:
            raise KeyFileError(f"{what} {path} is larger than a key file")
        return Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{what} {path} cannot be read: {exc.strerror}") from None


def load_signer(path: Path):
    """A securesystemslib signer for the ed25519 private key at ``path`` (mode must be 0600 or stricter)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from securesystemslib.signer import CryptoSigner

    data = _read_key_file(path, "signing key")
    if os.stat(path).st_mode & 0o077:
        raise KeyFileError(f"signing key {path} is readable by group or others", hint=f"chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"signing key {path} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"signing key {path} is a {type(key).__name__}, not an ed25519 key")
    return CryptoSigner(key)


def load_public_key(path: Path):
    """A securesystemslib key for the ed25519 public key (PEM) at ``path``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from securesystemslib.signer import SSlibKey

    data = _read_key_file(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"public key {path} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"public key {path} is a {type(key).__name__}, not an ed25519 key")
    return SSlibKey.from_crypto(key)


# -- statements and envelopes ----------------------------------------------------------------------------
def statement(subject_name: str, digest: str, predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def sign(signer, stmt: dict[str, Any]) -> bytes:
    """A DSSE envelope (JSON bytes) of ``stmt`` signed by ``signer``."""
    from securesystemslib.dsse import Envelope

    payload = json.dumps(stmt, sort_keys=True, separators=(",", ":")).encode()
    env = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    env.sign(signer)
    return json.dumps(env.to_dict(), sort_keys=True, separators=(",", ":")).encode()


def key_id(public_key) -> str:
    return str(public_key.keyid)


@dataclasses.dataclass(frozen=True)
class Checked:
    """A statement whose envelope verified with the key."""

    predicate_type: str
    statement: dict[str, Any]
    key_id: str


def open_envelope(blob: bytes, public_key, digest: str) -> Checked:
    """Verify one envelope's signature with ``public_key`` and that its statement names ``digest``."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    if len(blob) > MAX_ENVELOPE_BYTES:
        raise AttestationInvalid("an attestation layer is larger than any envelope flashkit writes")
    try:
        env = Envelope.from_dict(json.loads(blob))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AttestationInvalid(f"an attestation layer is not a DSSE envelope ({exc})") from None
    if env.payload_type != PAYLOAD_TYPE:
        raise AttestationInvalid(f"an envelope carries {env.payload_type!r}, not an in-toto statement")
    try:
        env.verify([public_key], 1)
    except VerificationError as exc:
        raise AttestationInvalid(
            f"the attestation's signature does not verify with key {key_id(public_key)[:16]}: {exc}",
            hint="the attestation was altered, or signed by another key: do not run this image",
        ) from None
    try:
        stmt = json.loads(env.payload)
        subjects = stmt["subject"]
        ptype = stmt["predicateType"]
    except (ValueError, KeyError, TypeError):
        raise AttestationInvalid("a signed payload is not an in-toto statement") from None
    if stmt.get("_type") != STATEMENT_TYPE or not isinstance(stmt.get("predicate"), dict):
        raise AttestationInvalid("a signed payload is not an in-toto v1 statement")
    hexes = [s.get("digest", {}).get("sha256") for s in subjects if isinstance(s, dict)]
    if digest.removeprefix("sha256:") not in hexes:
        raise AttestationInvalid(
            f"the signed statement ({ptype}) is about {', '.join(map(str, hexes)) or 'nothing'}, not {digest}",
            hint="an attestation of another image was attached to this one: do not run it",
        )
    return Checked(ptype, stmt, key_id(public_key))


# -- the OCI artifact ---------------------------------------------------------------------------------------
def write_layout(folder: Path, subject_digest: str, subject_size: int, envelopes: list[tuple[str, bytes]]) -> str:
    """An OCI layout in ``folder`` holding the attestation artifact (tag ``att``); its manifest digest."""
    import hashlib

    blobs = folder / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> dict[str, Any]:
        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        return {"digest": f"sha256:{h}", "size": len(data)}

    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": DSSE_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, **put(b"{}")},
        "layers": [
            {"mediaType": DSSE_MEDIA_TYPE, **put(env), "annotations": {PREDICATE_ANNOTATION: ptype}}
            for ptype, env in envelopes
        ],
        "subject": {"mediaType": MANIFEST_MEDIA_TYPE, "digest": subject_digest, "size": subject_size},
    }
    ref = put(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {"mediaType": MANIFEST_MEDIA_TYPE, **ref, "annotations": {"org.opencontainers.image.ref.name": "att"}}
        ],
    }
    (folder / "index.json").write_text(json.dumps(index))
    (folder / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return ref["digest"]


def read_artifact(manifest: bytes, blob_of, digest: str, public_key) -> dict[str, Checked]:
    """Check an attestation manifest fetched for image ``digest``: its subject, each envelope; by type."""
    try:
        m = json.loads(manifest)
        layers = m["layers"]
        subject = m.get("subject")
    except (ValueError, KeyError, TypeError):
        raise AttestationInvalid("the attestation is not an OCI manifest") from None
    if subject is not None and (not isinstance(subject, dict) or subject.get("digest") != digest):
        got = subject.get("digest") if isinstance(subject, dict) else subject
        raise AttestationInvalid(
            f"the attestation stored for {digest} refers to another image ({got})",
            hint="an attestation of another image was attached to this one: do not run it",
        )
    out: dict[str, Checked] = {}
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == DSSE_MEDIA_TYPE:
            checked = open_envelope(blob_of(layer.get("digest")), public_key, digest)
            out[checked.predicate_type] = checked
    missing = [t for t in (PROVENANCE_TYPE, VERIFICATION_TYPE) if t not in out]
    if missing:
        raise AttestationInvalid(f"the attestation lacks a signed {' and a signed '.join(missing)} statement")
    return out


def envelope_payload(envelope: bytes) -> dict[str, Any]:
    """The statement inside an envelope, unverified (for showing and for tests)."""
    return json.loads(base64.b64decode(json.loads(envelope)["payload"]))
