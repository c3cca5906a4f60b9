"""``inferway run`` with mutual TLS between Envoy and the xDS server: files minted by
``inferway certs`` go through GatewayOptions into start_gateway; the supervised real Envoy
gets its config over mTLS and serves traffic, while a plaintext xDS client gets nothing.
Unusable files (missing, a key others can read, a certificate naming another node) refuse the
start with a message naming the file, before anything listens."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import httpx
import pytest
from typer.testing import CliRunner

from inferway._xds_protos.envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from inferway.cli.certs import app as certs_app
from inferway.cli.main import app as inferway_app
from inferway.gateway.runtime import GatewayOptions, start_gateway
from inferway.gateway.xds_mtls import XdsMtlsError, resolve_xds_mtls_files
from inferway.xds import type_urls
from tests.envoy_process import free_port
from tests.helpers import poll_until
from tests.integration.tls_support import start_answering_backend

pytestmark = pytest.mark.integration

NODE = "edge-1"
runner = CliRunner()


def mint(directory: Path, *, node_cert: bool = True) -> None:
    """What a person runs: ``inferway certs init`` (+ ``issue <node-id>``)."""
    result = runner.invoke(certs_app, ["init", "--dir", str(directory), "--days", "1"])
    assert result.exit_code == 0, result.output
    if node_cert:
        result = runner.invoke(certs_app, ["issue", NODE, "--dir", str(directory), "--days", "1"])
        assert result.exit_code == 0, result.output


def write_policy(directory: Path, listener_port: int, backend_port: int) -> Path:
    path = directory / "policy.yaml"
    path.write_text(
        f"""
listeners: [{{name: edge, port: {listener_port}}}]
services: [{{name: model, endpoints: ["127.0.0.1:{backend_port}"]}}]
routes: [{{name: all, backends: [{{service: model}}]}}]
"""
    )
    return path


def options(policy: Path, certs: Path, **overrides: object) -> GatewayOptions:
    files = resolve_xds_mtls_files(directory=certs, node_id=NODE)
    values: dict[str, object] = {
        "policy_path": policy,
        "xds_port": 0,
        "admin_port": 0,
        "envoy_admin_port": free_port(),
        "node_id": NODE,
        "workdir": policy.parent / "work",
        "xds_mtls": files,
    }
    values.update(overrides)
    return GatewayOptions(**values)  # type: ignore[arg-type]


async def test_envoy_gets_config_over_xds_mtls_and_serves_traffic(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    mint(certs)
    backend, backend_port = await start_answering_backend()
    listener_port = free_port()
    policy = write_policy(tmp_path, listener_port, backend_port)
    gateway = await start_gateway(options(policy, certs))
    try:
        assert gateway.supervisor is not None
        socket = gateway.supervisor.bootstrap["static_resources"]["clusters"][0]["transport_socket"]
        tls = socket["typed_config"]["common_tls_context"]
        (secret_config,) = tls["tls_certificate_sds_secret_configs"]
        sds_file = Path(secret_config["sds_config"]["path_config_source"]["path"])
        (secret,) = json.loads(sds_file.read_text())["resources"]
        assert secret["tls_certificate"]["certificate_chain"]["filename"] == str(
            (certs / f"{NODE}.pem").resolve()
        )
        version = gateway.control_plane.version
        assert version is not None
        assert await gateway.cache.wait_for_acks(version, node_ids=[NODE], timeout=20), (
            gateway.supervisor.stderr_tail()[-10:]
        )
        async with httpx.AsyncClient(timeout=5) as client:
            answer = await client.get(f"http://127.0.0.1:{listener_port}/v2/anything")
        assert answer.status_code == 200 and answer.json()["backend"] == "ok"
        assert gateway.xds.refusals.recent() == []

        # The same port refuses a client that does not do TLS: no configuration leaks.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.xds.port}") as channel:
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            request = discovery_pb2.DiscoveryRequest(type_url=type_urls.LISTENER)
            request.node.id = NODE
            call = stub.StreamAggregatedResources(iter([request]), timeout=3)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.read()
            assert refused.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
    finally:
        await gateway.stop()
        await backend.cleanup()


async def test_unusable_files_refuse_the_start_naming_the_file(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    mint(certs, node_cert=False)  # only client.pem, whose identity is "client"
    policy = write_policy(tmp_path, free_port(), 9)

    with pytest.raises(XdsMtlsError, match=r"client\.pem names .*/sa/client, not node 'edge-1'"):
        await start_gateway(options(policy, certs))
    # Same directory, node named like the certificate: accepted up to the key check below.
    (certs / "server-key.pem").chmod(0o644)
    with pytest.raises(XdsMtlsError, match=r"server-key\.pem is accessible by group/others"):
        await start_gateway(options(policy, certs, node_id="client"))
    (certs / "server-key.pem").chmod(0o600)
    os.remove(certs / "ca.pem")
    with pytest.raises(XdsMtlsError, match=r"cannot read the xDS client CA .*ca\.pem"):
        await start_gateway(options(policy, certs, node_id="client"))


def test_run_refuses_a_missing_mtls_dir_and_incomplete_options(tmp_path: Path) -> None:
    policy = write_policy(tmp_path, free_port(), 9)
    missing = tmp_path / "nowhere"
    result = runner.invoke(inferway_app, ["run", "-f", str(policy), "--xds-mtls-dir", str(missing)])
    assert result.exit_code == 2
    assert f"--xds-mtls-dir {missing} is not a directory" in result.output
    assert "inferway certs init" in result.output

    result = runner.invoke(
        inferway_app, ["run", "-f", str(policy), "--xds-tls-cert", str(tmp_path / "s.pem")]
    )
    assert result.exit_code == 2
    assert "--xds-tls-key, --xds-client-ca" in result.output


async def _xds_connections(admin_port: int) -> int:
    async with httpx.AsyncClient(timeout=5) as client:
        stats = await client.get(
            f"http://127.0.0.1:{admin_port}/stats",
            params={"filter": r"^cluster\.inferway_xds\.upstream_cx_total$"},
        )
    return int(stats.text.split(":")[1])


async def test_rotated_xds_certificates_apply_without_a_restart(tmp_path: Path) -> None:
    """Everything is replaced under a running gateway: a new CA, and the server's and the
    node's certificates it signs. Neither side restarts. Once the server's connection age has
    made Envoy reconnect, a policy edit is ACKed: that needs Envoy to present its new
    certificate and trust the new CA (file-based SDS), and the server to serve its new
    certificate and trust the new CA (reloaded before the handshake). Either side still on
    the old files would fail every handshake."""
    certs = tmp_path / "certs"
    mint(certs)
    backend, backend_port = await start_answering_backend()
    listener_port = free_port()
    policy = write_policy(tmp_path, listener_port, backend_port)
    gateway = await start_gateway(options(policy, certs, xds_max_connection_age_s=1.0))
    try:
        assert gateway.supervisor is not None
        admin_port = gateway.options.envoy_admin_port
        version = gateway.control_plane.version
        assert version is not None
        assert await gateway.cache.wait_for_acks(version, node_ids=[NODE], timeout=20)

        old_ca = (certs / "ca.pem").read_bytes()
        result = runner.invoke(certs_app, ["init", "--dir", str(certs), "--force"])
        assert result.exit_code == 0, result.output
        result = runner.invoke(certs_app, ["issue", NODE, "--dir", str(certs), "--force"])
        assert result.exit_code == 0, result.output
        assert (certs / "ca.pem").read_bytes() != old_ca
        rotated_at = await _xds_connections(admin_port)

        async def reconnected() -> bool:
            return await _xds_connections(admin_port) > rotated_at

        await poll_until(reconnected, timeout=15, what="Envoy's next xDS connection")
        policy.write_text(policy.read_text().replace("routes: [{name: all,", "routes: [{name: r2,"))

        def edited() -> str | None:
            current = gateway.control_plane.version
            return current if current != version else None

        edited_version = await poll_until(edited, timeout=10, what="the policy edit applied")
        acked = await gateway.cache.wait_for_acks(edited_version, node_ids=[NODE], timeout=20)
        assert acked, gateway.supervisor.stderr_tail()[-15:]
        async with httpx.AsyncClient(timeout=5) as client:
            answer = await client.get(f"http://127.0.0.1:{listener_port}/v2/anything")
        assert answer.status_code == 200
        assert gateway.xds.refusals.recent() == []
    finally:
        await gateway.stop()
        await backend.cleanup()
