"""A development certificate authority: mint a CA, server and client certificates.

Why: mutual TLS needs a CA, a server certificate and client certificates carrying workload
identities (SPIFFE IDs in a URI SAN). The demo, the tests and first-time users need them in a
second, without openssl recipes. This is not a production PKI: keys are ECDSA P-256 held in
memory and written to disk only by ``write_bundle`` (private keys with mode 0600).

The ``build_*`` functions take the clock as ``now`` so tests can mint expired or
not-yet-valid certificates deterministically.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "DEFAULT_TRUST_DOMAIN",
    "BundlePaths",
    "CertBundle",
    "build_ca",
    "build_certificate",
    "bundle_paths",
    "check_private_key_permissions",
    "key_matches_certificate",
    "load_bundle",
    "spiffe_id_for",
    "write_bundle",
]

DEFAULT_TRUST_DOMAIN = "inferway.local"
_BACKDATE = timedelta(minutes=5)  # tolerate small clock skew between processes


@dataclass(frozen=True)
class CertBundle:
    """A certificate and its private key, both PEM. ``repr`` never shows the key."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def serial_number(self) -> int:
        return self.certificate.serial_number

    def __repr__(self) -> str:
        cert = self.certificate
        return (
            f"CertBundle(subject={cert.subject.rfc4514_string()!r}, "
            f"serial={cert.serial_number:x}, key=<hidden>)"
        )


@dataclass(frozen=True)
class BundlePaths:
    """Where ``write_bundle`` put a bundle."""

    certificate: Path
    private_key: Path


def spiffe_id_for(
    name: str, *, trust_domain: str = DEFAULT_TRUST_DOMAIN, namespace: str = "default"
) -> str:
    """The Kubernetes-style SPIFFE ID of a workload: spiffe://<td>/ns/<ns>/sa/<name>."""
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{name}"


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _validity(
    now: datetime | None,
    days: int,
    not_before: datetime | None,
    not_after: datetime | None,
) -> tuple[datetime, datetime]:
    now = now or datetime.now(UTC)
    start = not_before if not_before is not None else now - _BACKDATE
    end = not_after if not_after is not None else now + timedelta(days=days)
    if end <= start:
        raise ValueError(f"certificate validity is empty: not_after {end} <= not_before {start}")
    return start, end


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Signatures only: a CA also signs certificates and CRLs, a leaf nothing else."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def build_ca(
    common_name: str = "inferway development CA",
    *,
    days: int = 365,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    now: datetime | None = None,
) -> CertBundle:
    """A self-signed CA certificate (path length 0: it signs leaves only)."""
    key = _new_key()
    start, end = _validity(now, days, not_before, not_after)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "inferway"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertBundle(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def build_certificate(
    ca: CertBundle,
    *,
    common_name: str | None = None,
    spiffe_id: str | None = None,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    server: bool = True,
    client: bool = False,
    days: int = 90,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    now: datetime | None = None,
) -> CertBundle:
    """A leaf certificate signed by ``ca``.

    ``spiffe_id`` goes into a URI SAN (the identity mTLS peers check); ``dns_names`` and
    ``ip_addresses`` into DNS/IP SANs (what a TLS client checks against the host it dialled).
    ``server``/``client`` set the extended key usages. ``not_before``/``not_after`` override
    the validity window (e.g. an expired certificate for tests).
    """
    dns = list(dns_names)
    ips = [ipaddress.ip_address(address) for address in ip_addresses]
    if not (spiffe_id or dns or ips):
        raise ValueError("a certificate needs at least one of spiffe_id, dns_names, ip_addresses")
    if not (server or client):
        raise ValueError("a certificate must be usable for server or client auth (or both)")
    if spiffe_id is not None and not spiffe_id.startswith("spiffe://"):
        raise ValueError(f"spiffe_id must start with spiffe://, got {spiffe_id!r}")
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError("the CA key must be ECDSA or RSA")
    key = _new_key()
    public = key.public_key()
    start, end = _validity(now, days, not_before, not_after)
    cn = common_name or (dns[0] if dns else spiffe_id.rsplit("/", 1)[-1] if spiffe_id else "ip")
    sans: list[x509.GeneralName] = []
    if spiffe_id:
        sans.append(x509.UniformResourceIdentifier(spiffe_id))
    sans.extend(x509.DNSName(name) for name in dns)
    sans.extend(x509.IPAddress(address) for address in ips)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "inferway"),
                    x509.NameAttribute(NameOID.COMMON_NAME, cn),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return CertBundle(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def bundle_paths(directory: Path, name: str) -> BundlePaths:
    """``<dir>/<name>.pem`` and ``<dir>/<name>-key.pem``."""
    return BundlePaths(directory / f"{name}.pem", directory / f"{name}-key.pem")


def write_bundle(directory: str | Path, name: str, bundle: CertBundle) -> BundlePaths:
    """Write ``<name>.pem`` (0644) and ``<name>-key.pem`` (0600) atomically into ``directory``.

    Each file is written to a temporary name and renamed over the old one, so a watcher never
    sees a half-written file and a rotation is one rename per file.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = bundle_paths(directory, name)
    _write_atomic(paths.private_key, bundle.key_pem, 0o600)
    _write_atomic(paths.certificate, bundle.cert_pem, 0o644)
    return paths


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is masked by umask and ignored for existing files
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_bundle(directory: str | Path, name: str) -> CertBundle:
    """Read back what ``write_bundle`` wrote (e.g. the CA, to issue more certificates)."""
    paths = bundle_paths(Path(directory), name)
    return CertBundle(paths.certificate.read_bytes(), paths.private_key.read_bytes())


def key_matches_certificate(certificate: x509.Certificate, private_key: object) -> bool:
    """Whether ``private_key`` (a loaded cryptography key) is the key of ``certificate``."""
    public = getattr(private_key, "public_key", None)
    if public is None:
        return False
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return bool(certificate.public_key().public_bytes(*fmt) == public().public_bytes(*fmt))


def check_private_key_permissions(path: Path) -> str | None:
    """A message when ``path`` is readable by its group or others (POSIX only), else None."""
    if os.name != "posix":
        return None
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return (
            f"private key {path} is accessible by group/others (mode {mode:04o}); "
            f"restrict it: chmod 600 {path}"
        )
    return None
