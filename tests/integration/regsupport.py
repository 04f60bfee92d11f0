"""A registry as users have them, for the integration tests: Debian's docker-registry over TLS (a CA made
for the test) with an htpasswd login, and throwaway ed25519 keys. Nothing here is a stand-in: the
registry, skopeo and the engine are the real programs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
from pathlib import Path

from flashkit.publish.local_registry import LocalRegistry

USER = "flash-publisher"
PASSWORD = "s3cret-Pa55word-for-tests"


def make_ca_and_cert(folder: Path) -> tuple[Path, Path, Path]:
    """(CA cert, server cert, server key) for 127.0.0.1, valid for one day, written as PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flashkit test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def write_htpasswd(path: Path, user: str = USER, password: str = PASSWORD) -> Path:
    import bcrypt

    path.write_text(f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6)).decode()}\n")
    return path


@dataclasses.dataclass
class SecureRegistry:
    registry: LocalRegistry
    ca: Path

    @property
    def address(self) -> str:
        return self.registry.address


def start_secure_registry(folder: Path, port: int | None = None) -> SecureRegistry:
    ca, cert, key = make_ca_and_cert(folder / "tls")
    htpasswd = write_htpasswd(folder / "htpasswd")
    reg = LocalRegistry(port=port, storage=folder / "registry", tls=(cert, key), htpasswd=htpasswd, ca_file=ca).start()
    return SecureRegistry(reg, ca)
