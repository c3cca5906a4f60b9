"""Shared pieces of the TLS integration tests: a development PKI, a control plane whose
certificates come from watched files, a real Envoy, and blocking TLS clients run in threads
(the backends share the test's event loop, so clients must not block it)."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aiohttp import web
from cryptography import x509

from inferway.gateway.cert_watcher import CertificateSource
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.pki.bundle_files import BundlePaths, bundle_paths, write_bundle
from inferway.pki.mint import build_ca, build_certificate, spiffe_id_for
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from tests.aiohttp_sites import answer_every_path, start_site
from tests.envoy_process import EnvoyProcess

NODE_ID = "tls-node"
ALLOWED = spiffe_id_for("client")


@dataclass(frozen=True)
class Pki:
    """Everything a test presents or trusts, written under ``dir``."""

    dir: Path
    ca: Path
    server: BundlePaths
    client: BundlePaths  # allowed identity
    intruder: BundlePaths  # same CA, identity not allowed
    foreign: BundlePaths  # another CA
    expired: BundlePaths  # same CA, allowed identity, expired


def mint_pki(directory: Path) -> Pki:
    ca = build_ca("test CA", days=2)
    other_ca = build_ca("someone else's CA", days=2)
    now = datetime.now(UTC)
    write_bundle(directory, "ca", ca)
    server = build_certificate(
        ca,
        spiffe_id=spiffe_id_for("gateway"),
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
        server=True,
        client=True,
        days=2,
    )

    def client(authority, name: str, **kwargs):  # type: ignore[no-untyped-def]
        return build_certificate(
            authority, spiffe_id=spiffe_id_for(name), server=False, client=True, **kwargs
        )

    expired = client(
        ca, "client", not_before=now - timedelta(days=3), not_after=now - timedelta(days=1)
    )
    return Pki(
        dir=directory,
        ca=bundle_paths(directory, "ca").certificate,
        server=write_bundle(directory, "server", server),
        client=write_bundle(directory, "client", client(ca, "client", days=2)),
        intruder=write_bundle(directory, "intruder", client(ca, "intruder", days=2)),
        foreign=write_bundle(directory, "foreign", client(other_ca, "client", days=2)),
        expired=write_bundle(directory, "expired", expired),
    )


def client_context(
    pki: Pki,
    presenting: BundlePaths | None,
    *,
    minimum: ssl.TLSVersion | None = None,
    maximum: ssl.TLSVersion | None = None,
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if presenting is not None:
        context.load_cert_chain(presenting.certificate, presenting.private_key)
    if minimum is not None:
        context.minimum_version = minimum
    if maximum is not None:
        context.maximum_version = maximum
    return context


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    peer_serial: int
    version: str | None


def _https_get(port: int, context: ssl.SSLContext, path: str) -> Answer:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read().decode()
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        der = sock.getpeercert(binary_form=True)
        assert der is not None
        serial = x509.load_der_x509_certificate(der).serial_number
        return Answer(response.status, body, serial, sock.version())
    finally:
        conn.close()


async def https_get(port: int, context: ssl.SSLContext, path: str = "/") -> Answer:
    """One request on a fresh connection (a fresh handshake), off the event loop."""
    return await asyncio.to_thread(_https_get, port, context, path)


def serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


async def start_answering_backend(
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[web.AppRunner, int]:
    """Every path answers 200 ``{"backend": "ok", "peer": <client cert subject or null>}``."""

    async def answer(request: web.Request) -> web.Response:
        peer = None
        sslobj = request.transport.get_extra_info("ssl_object") if request.transport else None
        if sslobj is not None and sslobj.getpeercert():
            peer = dict(x[0] for x in sslobj.getpeercert()["subject"]).get("commonName")
        return web.json_response({"backend": "ok", "peer": peer})

    return await start_site(answer_every_path(answer), ssl_context=ssl_context)


class TlsGateway:
    """The gateway as the composition root builds it (``start_gateway``, as ``inferway run
    --no-envoy``: certificate files read and watched, the ADS server) and a real Envoy."""

    def __init__(self, policy_path: Path) -> None:
        self.policy_path = policy_path
        self.gateway: Gateway | None = None
        self.envoy: EnvoyProcess | None = None

    @property
    def plane(self) -> ControlPlane:
        assert self.gateway is not None
        return self.gateway.control_plane

    @property
    def cache(self) -> SnapshotCache:
        return self.plane.cache

    @property
    def certificates(self) -> CertificateSource:
        assert self.gateway is not None
        return self.gateway.certificates

    async def start(self) -> TlsGateway:
        self.gateway = await start_gateway(
            GatewayOptions(policy_path=self.policy_path, xds_port=0, admin_port=0, with_envoy=False)
        )
        bootstrap = build_bootstrap(node_id=NODE_ID, xds_port=self.gateway.xds.port, admin_port=0)
        self.envoy = await EnvoyProcess(bootstrap).start(wait="ready", timeout=20.0)
        await self.wait_acked()
        return self

    async def wait_acked(self, timeout: float = 10.0) -> None:
        version = self.plane.version
        assert version is not None
        acked = await self.cache.wait_for_acks(version, node_ids=[NODE_ID], timeout=timeout)
        assert acked, f"Envoy did not ACK {version}: {self.cache.node_status()}"

    async def stats(self, pattern: str) -> dict[str, int]:
        assert self.envoy is not None
        return await self.envoy.get_stats(pattern)

    async def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        if self.gateway is not None:
            await self.gateway.stop()


def json_body(answer: Answer) -> dict:
    return json.loads(answer.body)
