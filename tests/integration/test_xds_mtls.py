"""The xDS server with mutual TLS against real Envoys: the node whose certificate names it gets
its configuration; a node presenting another node's certificate gets none (no ACK, no
listeners in its config dump) and the refusal is logged and recorded."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from inferway.gateway.control_plane import ControlPlane
from inferway.pki.bundle_files import write_bundle
from inferway.pki.mint import CertBundle, build_ca, build_certificate
from inferway.policies import load_policy_text
from inferway.xds import type_urls
from inferway.xds.auth import XdsClientTlsFiles, XdsTls, check_node_identity
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import XdsServer, start_xds_server
from tests.envoy_process import EnvoyProcess, free_port
from tests.security_helpers import poll_until

pytestmark = pytest.mark.integration

SPIFFE = "spiffe://inferway.local/ns/default/sa/"


@dataclass
class Plane:
    cache: SnapshotCache
    server: XdsServer
    ca: CertBundle
    tmp: Path

    def client_tls(self, cert_name: str, spiffe_name: str) -> XdsClientTlsFiles:
        issued = build_certificate(
            self.ca, spiffe_id=SPIFFE + spiffe_name, server=False, client=True
        )
        paths = write_bundle(self.tmp, cert_name, issued)
        return XdsClientTlsFiles(
            str(paths.certificate), str(paths.private_key), str(self.tmp / "ca.crt"), "xds.local"
        )

    def bootstrap(self, node_id: str, tls: XdsClientTlsFiles) -> dict:
        return build_bootstrap(
            node_id=node_id, xds_port=self.server.port, admin_port=0, xds_tls=tls
        )

    def acked(self, node_id: str) -> dict[str, str]:
        for status in self.cache.node_status():
            if status.node_id == node_id:
                return dict(status.acked)
        return {}


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    ca = build_ca("inferway test CA")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    server_cert = build_certificate(ca, dns_names=["xds.local"], ip_addresses=["127.0.0.1"])
    cache = SnapshotCache()
    policy = load_policy_text(
        f"""
listeners: [{{name: edge, port: {free_port()}}}]
services: [{{name: s, endpoints: ["127.0.0.1:9"]}}]
routes: [{{name: r, backends: [{{service: s}}]}}]
""",
        "p.yaml",
    )
    ControlPlane(cache).apply_policy(policy, "p.yaml")
    tls = XdsTls(server_cert.cert_pem, server_cert.key_pem, ca.cert_pem)
    server = await start_xds_server(cache, tls=tls)
    try:
        yield Plane(cache, server, ca, tmp_path)
    finally:
        await server.stop(0.2)


async def test_envoy_with_matching_certificate_gets_configuration(plane: Plane) -> None:
    tls = plane.client_tls("good", "edge-1")
    async with EnvoyProcess(plane.bootstrap("edge-1", tls)) as envoy:
        await poll_until(
            lambda: type_urls.LISTENER in plane.acked("edge-1"),
            timeout=15,
            what="edge-1 to ACK its listeners",
        )
        dump = await envoy.config_dump("dynamic_listeners")
        assert [c["name"] for c in dump["configs"]] == ["edge"]
    assert plane.server.refusals.recent() == []


async def test_envoy_presenting_another_nodes_identity_gets_nothing(
    plane: Plane, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="inferway.xds.auth")
    stolen = plane.client_tls("other", "edge-2")  # a certificate for edge-2 ...
    envoy = EnvoyProcess(plane.bootstrap("edge-1", stolen))  # ... used by a node claiming edge-1
    await envoy.start(wait="admin")
    try:
        await poll_until(
            lambda: len(plane.server.refusals.recent()) >= 2,
            timeout=20,
            what="the server to refuse the stream (and Envoy's retry)",
        )
        refusal = plane.server.refusals.recent()[0]
        assert refusal.node_id == "edge-1"
        assert SPIFFE + "edge-2" in refusal.identities
        assert "is not an identity of the client certificate" in refusal.reason
        assert any(
            "refused" in r.getMessage() and "edge-1" in r.getMessage() for r in caplog.records
        )

        assert plane.acked("edge-1") == {}
        assert all(s.node_id != "edge-1" for s in plane.cache.node_status())
        dump = await envoy.config_dump("dynamic_listeners")
        assert dump.get("configs", []) == []
        assert (await envoy.admin_get("/ready")).status_code != 200
    finally:
        envoy.stop()


async def test_envoy_without_a_client_certificate_cannot_connect(plane: Plane) -> None:
    bootstrap = plane.bootstrap("edge-1", plane.client_tls("unused", "edge-1"))
    socket = bootstrap["static_resources"]["clusters"][0]["transport_socket"]
    del socket["typed_config"]["common_tls_context"]["tls_certificates"]
    envoy = EnvoyProcess(bootstrap)
    await envoy.start(wait="admin")
    try:
        stats = await poll_until(
            lambda: _failed_connects(envoy),
            timeout=15,
            what="Envoy's xDS connection attempts to fail the handshake",
        )
        assert stats > 0
        assert plane.acked("edge-1") == {}
    finally:
        envoy.stop()


async def _failed_connects(envoy: EnvoyProcess) -> int:
    stats = await envoy.get_stats("cluster.inferway_xds.")
    return stats.get("cluster.inferway_xds.ssl.connection_error", 0) + stats.get(
        "cluster.inferway_xds.upstream_cx_connect_fail", 0
    )


def test_node_identity_rules() -> None:
    assert check_node_identity("edge-1", ["edge-1"])
    assert check_node_identity("edge-1", [SPIFFE + "edge-1"])
    assert check_node_identity(SPIFFE + "edge-1", [SPIFFE + "edge-1"])
    assert not check_node_identity("edge-1", [SPIFFE + "edge-10", "edge-2"])
    assert not check_node_identity("edge-1", [])
