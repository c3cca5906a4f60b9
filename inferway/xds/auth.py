"""Mutual TLS for the xDS server: only an Envoy whose client certificate names its node gets
configuration.

The configuration a control plane serves is a map of the whole deployment (and carries TLS
keys over SDS), so with ``XdsTls`` the server requires a client certificate signed by the
given CA, and each stream's ``node.id`` must be one of the certificate's identities:

* its subject common name, or any URI / DNS subject alternative name, exactly; or
* the last path segment of a SPIFFE ID in a URI SAN (``spiffe://td/ns/default/sa/<node-id>``,
  the form ``inferway certs`` issues).

A stream whose node does not match is ended with ``PERMISSION_DENIED`` before the node is
registered, so it is sent nothing; the refusal is logged and kept for ``inferway status``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

__all__ = [
    "NodeIdentityError",
    "PeerRefusal",
    "PeerRefusals",
    "XdsClientTlsFiles",
    "XdsTls",
    "build_server_credentials",
    "check_node_identity",
    "peer_identities",
    "verified_requests",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class XdsTls:
    """PEM material for the xDS server: its certificate and key, and the CA that signs the
    Envoys' client certificates. ``repr`` never shows the key."""

    certificate_chain: bytes
    private_key: bytes = field(repr=False)
    client_ca: bytes

    @classmethod
    def from_files(cls, certificate: str | Path, key: str | Path, client_ca: str | Path) -> XdsTls:
        def read(path: str | Path, what: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as error:
                raise OSError(f"xDS TLS: cannot read the {what} {path}: {error}") from None

        return cls(
            read(certificate, "server certificate"),
            read(key, "server private key"),
            read(client_ca, "client CA"),
        )


@dataclass(frozen=True)
class XdsClientTlsFiles:
    """Where an Envoy finds its client certificate, key and the CA of the xDS server's
    certificate; written into its bootstrap (files, not inline PEM, so keys stay on disk)."""

    certificate: str
    private_key: str
    ca: str
    server_name: str | None = None
    """When set: the SNI sent and the DNS SAN the server's certificate must carry."""


def build_server_credentials(
    tls: XdsTls, reload: Callable[[], XdsTls | None] | None = None
) -> grpc.ServerCredentials:
    """Server TLS that requires (and verifies against ``client_ca``) a client certificate.

    With ``reload``, gRPC asks it before every new connection's handshake: it returns fresh
    material after a rotation (used from then on) or None to keep the current one. Streams
    already open keep the session they negotiated."""
    if reload is None:
        return grpc.ssl_server_credentials(
            [(tls.private_key, tls.certificate_chain)],
            root_certificates=tls.client_ca,
            require_client_auth=True,
        )

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        fresh = reload()
        return None if fresh is None else _certificate_configuration(fresh)

    return grpc.dynamic_ssl_server_credentials(
        _certificate_configuration(tls), fetch, require_client_authentication=True
    )


def _certificate_configuration(tls: XdsTls) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(tls.private_key, tls.certificate_chain)], root_certificates=tls.client_ca
    )


class NodeIdentityError(Exception):
    """The node a stream names is not the identity its client certificate proves."""


@dataclass(frozen=True)
class PeerRefusal:
    at: float
    node_id: str
    peer: str
    identities: tuple[str, ...]
    reason: str


class PeerRefusals:
    """The most recent refused streams (bounded), for logs and ``GET /status``."""

    def __init__(self, limit: int = 50, clock: Callable[[], float] = time.time) -> None:
        self._items: deque[PeerRefusal] = deque(maxlen=limit)
        self._clock = clock

    def record(self, node_id: str, peer: str, identities: Sequence[str], reason: str) -> None:
        refusal = PeerRefusal(self._clock(), node_id, peer, tuple(identities), reason)
        self._items.append(refusal)
        _log.warning("xDS stream from %s refused: %s", peer, reason)

    def recent(self) -> list[PeerRefusal]:
        return list(self._items)


def peer_identities(auth_context: Mapping[str, Sequence[bytes]]) -> list[str]:
    """The identities a verified client certificate proves: CN, URI and DNS SANs."""
    pems = auth_context.get("x509_pem_cert") or []
    if not pems:
        return []
    cert = x509.load_pem_x509_certificate(pems[0])
    names = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return names
    names += sans.get_values_for_type(x509.UniformResourceIdentifier)
    names += sans.get_values_for_type(x509.DNSName)
    return names


def check_node_identity(node_id: str, identities: Sequence[str]) -> bool:
    for identity in identities:
        if node_id == identity:
            return True
        if identity.startswith("spiffe://") and identity.rstrip("/").rsplit("/", 1)[-1] == node_id:
            return True
    return False


async def verified_requests(
    requests: AsyncIterator[Any],
    context: grpc.aio.ServicerContext,
    refusals: PeerRefusals,
) -> AsyncIterator[Any]:
    """Pass ``requests`` through once the first one's ``node.id`` matches the peer
    certificate; raise NodeIdentityError (recorded in ``refusals``) before yielding it if not."""
    first = await anext(aiter(requests), None)
    if first is None:
        return
    node_id = first.node.id
    identities = peer_identities(context.auth_context())
    if not check_node_identity(node_id, identities):
        reason = (
            f"node.id {node_id!r} is not an identity of the client certificate "
            f"({', '.join(identities) or 'no certificate'})"
        )
        refusals.record(node_id, context.peer(), identities, reason)
        raise NodeIdentityError(reason)
    yield first
    async for request in requests:
        yield request
