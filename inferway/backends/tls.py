"""TLS for the inference backend's own servers (HTTP and gRPC), optionally requiring client
certificates, so a backend can accept only Envoy (or other holders of a certificate from a
CA it trusts) even on a shared network.

Keys are read once at start; a private key readable by group/others is refused.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from inferway.pki.keys import check_private_key_permissions

__all__ = ["BackendTls", "build_grpc_server_credentials", "build_ssl_context"]


@dataclass(frozen=True)
class BackendTls:
    """Server certificate and key; ``client_ca`` + ``require_client_cert`` for mutual TLS."""

    certificate: Path
    private_key: Path
    client_ca: Path | None = None
    require_client_cert: bool = False

    def __post_init__(self) -> None:
        if self.require_client_cert and self.client_ca is None:
            raise ValueError("require_client_cert needs client_ca (the CA client certs chain to)")

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        problem = check_private_key_permissions(Path(self.private_key))
        if problem:
            raise PermissionError(problem)
        ca = Path(self.client_ca).read_bytes() if self.client_ca else None
        return Path(self.certificate).read_bytes(), Path(self.private_key).read_bytes(), ca


def build_ssl_context(tls: BackendTls) -> ssl.SSLContext:
    """Server-side context for aiohttp: TLS 1.2+, client certs verified against ``client_ca``
    (required when ``require_client_cert``)."""
    tls.read()  # the permission check, with the same message for both servers
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.certificate, tls.private_key)
    if tls.client_ca is not None:
        context.load_verify_locations(cafile=str(tls.client_ca))
        context.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
    context.set_alpn_protocols(["http/1.1"])
    return context


def build_grpc_server_credentials(tls: BackendTls) -> grpc.ServerCredentials:
    certificate, key, ca = tls.read()
    return grpc.ssl_server_credentials(
        [(key, certificate)],
        root_certificates=ca,
        require_client_auth=tls.require_client_cert,
    )
