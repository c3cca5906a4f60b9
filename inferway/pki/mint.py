"""Mint a development certificate authority and the leaves it signs.

Why: mutual TLS needs a CA, a server certificate and client certificates carrying workload
identities (SPIFFE IDs in a URI SAN). The demo, the tests and first-time users need them in a
second, without openssl recipes. This is not a production PKI: keys are ECDSA P-256 held in
memory and written to disk only by :func:`inferway.pki.bundle_files.write_bundle`.

The ``build_*`` functions take the clock as ``now`` so tests can mint expired or
not-yet-valid certificates deterministically.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "DEFAULT_TRUST_DOMAIN",
    "CertBundle",
    "build_ca",
    "build_certificate",
    "spiffe_id_for",
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
