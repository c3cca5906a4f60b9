"""The stats push under xDS mutual TLS: an Envoy's OTLP export must name the node its client
certificate proves (the ADS stream's rule). Real certificates (inferway.pki), a real xDS
server with the receiver on it, two real Envoys: the honest one's reports are kept; one whose
certificate is edge-2's but whose stats claim to be edge-1 is refused every time, counted and
recorded, and never becomes, or overwrites, edge-1's evidence."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.fleet.envoy_reports import NODE_HEADER, EnvoyReports
from inferway.pki.bundle_files import write_bundle
from inferway.pki.mint import build_ca, build_certificate
from inferway.policies import load_policy_text
from inferway.xds.auth import XdsClientTlsFiles, XdsTls
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import start_xds_server
from tests.envoy_process import EnvoyProcess, free_port
from tests.security_helpers import poll_until

pytestmark = pytest.mark.integration

SPIFFE = "spiffe://inferway.local/ns/default/sa/"


async def test_a_stats_export_for_another_node_is_refused_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="inferway.xds.auth")
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
    reports = EnvoyReports(verify_identity=True)
    server = await start_xds_server(
        cache,
        tls=XdsTls(server_cert.cert_pem, server_cert.key_pem, ca.cert_pem),
        services=[reports.register],
        refusals=reports.refusals,
    )

    def client_tls(name: str) -> XdsClientTlsFiles:
        issued = build_certificate(ca, spiffe_id=SPIFFE + name, server=False, client=True)
        paths = write_bundle(tmp_path, name, issued)
        return XdsClientTlsFiles(
            str(paths.certificate), str(paths.private_key), str(tmp_path / "ca.crt"), "xds.local"
        )

    def bootstrap(node_id: str, claims: str) -> dict:
        built = build_bootstrap(
            node_id=node_id,
            xds_port=server.port,
            admin_port=0,
            xds_tls=client_tls(node_id),
            stats_push_s=0.2,
        )
        sink = built["stats_sinks"][0]["typed_config"]["grpc_service"]
        sink["initial_metadata"] = [{"key": NODE_HEADER, "value": claims}]
        return built

    honest = EnvoyProcess(bootstrap("edge-1", claims="edge-1"))
    liar = EnvoyProcess(bootstrap("edge-2", claims="edge-1"))  # ADS as edge-2, stats as edge-1
    try:
        await honest.start(wait="ready", timeout=30)
        await poll_until(lambda: "edge-1" in reports.reports(), timeout=15, what="edge-1 reports")
        honest.stop()
        kept = reports.reports()["edge-1"]
        await liar.start(wait="ready", timeout=30)  # its ADS stream is its own: allowed
        await poll_until(
            lambda: reports.refused_identity >= 3, timeout=15, what="the liar's exports refused"
        )
        assert reports.reports()["edge-1"] == kept  # nothing of the liar's was recorded
        assert set(reports.reports()) == {"edge-1"}
        refusal = reports.refusals.recent()[-1]
        assert refusal.node_id == "edge-1"
        assert SPIFFE + "edge-2" in refusal.identities
        assert "stats export for node 'edge-1' refused" in refusal.reason
        assert server.refusals.recent()[-1] == refusal  # shown with the xDS refusals in status
        assert reports.refused == reports.refused_identity
        assert any("stats export" in r.getMessage() for r in caplog.records)
    finally:
        honest.stop()
        liar.stop()
        await server.stop(0.2)
