"""Route access rules through a real Envoy: allow by API-key header, deny by source IP, deny
wins over allow, X-Forwarded-For cannot fake a source address, and refusals are 403s with a
JSON body naming the route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from inferway.gateway.runtime import GatewayOptions, start_gateway
from inferway.xds.bootstrap import build_bootstrap
from tests.envoy_process import EnvoyProcess, free_port
from tests.security_helpers import EchoBackend, poll_until, start_echo_backend

pytestmark = pytest.mark.integration

API_KEY = "k-7f3a9"


def policy_text(listener_port: int, backend_port: int) -> str:
    return f"""
version: 1
listeners:
  - name: edge
    port: {listener_port}
services:
  - name: models
    endpoints: ["127.0.0.1:{backend_port}"]
routes:
  - name: keyed
    match: {{path: {{prefix: /keyed}}}}
    backends: [{{service: models}}]
    access:
      allow:
        - headers: [{{name: x-api-key, exact: {API_KEY}}}]
      deny:
        - headers: [{{name: x-banned, present: true}}]
  - name: no-loopback
    match: {{path: {{prefix: /no-loopback}}}}
    backends: [{{service: models}}]
    access:
      deny:
        - source_ips: [127.0.0.1/32]
  - name: internal-only
    match: {{path: {{prefix: /internal}}}}
    backends: [{{service: models}}]
    access:
      allow:
        - source_ips: [10.0.0.0/8]
  - name: open
    match: {{path: {{prefix: /}}}}
    backends: [{{service: models}}]
"""


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, EchoBackend]]:
    backend = await start_echo_backend()
    listener_port = free_port()
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(policy_text(listener_port, backend.port), encoding="utf-8")
    running = await start_gateway(
        GatewayOptions(policy_path=policy_path, xds_port=0, admin_port=0, with_envoy=False)
    )
    envoy = EnvoyProcess(
        build_bootstrap(node_id="rbac-node", xds_port=running.xds.port, admin_port=0)
    )
    try:
        await envoy.start()
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{listener_port}", timeout=5.0
        ) as client:

            async def open_route_answers() -> bool:
                try:
                    return (await client.get("/")).status_code == 200
                except httpx.HTTPError:
                    return False

            await poll_until(open_route_answers, timeout=15, what="Envoy listener serving /")
            yield client, backend
    finally:
        envoy.stop()
        await running.stop()
        await backend.stop()


async def test_api_key_header_allows_and_its_absence_is_refused_with_a_clear_403(
    gateway: tuple[httpx.AsyncClient, EchoBackend],
) -> None:
    client, backend = gateway
    allowed = await client.get("/keyed/infer", headers={"x-api-key": API_KEY})
    assert allowed.status_code == 200
    assert allowed.json() == {"path": "/keyed/infer"}

    before = len(backend.seen)
    for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": API_KEY.upper()}):
        refused = await client.get("/keyed/infer", headers=headers)
        assert refused.status_code == 403, headers
        assert refused.headers["content-type"].startswith("application/json")
        assert refused.json() == {"error": "forbidden: route keyed denies this client"}
    assert len(backend.seen) == before, "a refused request reached the backend"


async def test_deny_wins_over_allow(gateway: tuple[httpx.AsyncClient, EchoBackend]) -> None:
    client, _ = gateway
    response = await client.get("/keyed/x", headers={"x-api-key": API_KEY, "x-banned": "1"})
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden: route keyed denies this client"


async def test_deny_by_source_ip_refuses_loopback_clients(
    gateway: tuple[httpx.AsyncClient, EchoBackend],
) -> None:
    client, _ = gateway
    response = await client.get("/no-loopback")
    assert response.status_code == 403
    assert response.json() == {"error": "forbidden: route no-loopback denies this client"}
    assert (await client.get("/elsewhere")).status_code == 200


async def test_x_forwarded_for_cannot_fake_an_allowed_source_ip(
    gateway: tuple[httpx.AsyncClient, EchoBackend],
) -> None:
    client, _ = gateway
    spoofed = await client.get("/internal", headers={"x-forwarded-for": "10.1.2.3"})
    assert spoofed.status_code == 403
    assert spoofed.json() == {"error": "forbidden: route internal-only denies this client"}


async def test_identity_rule_on_a_mutual_tls_listener(tmp_path: Path) -> None:
    """The listener admits any certificate its CA signed; the route allows only ``client``."""
    from tests.integration.tls_support import (
        ALLOWED,
        TlsGateway,
        client_context,
        https_get,
        json_body,
        mint_pki,
        start_answering_backend,
    )

    pki = mint_pki(tmp_path / "certs")
    runner, backend_port = await start_answering_backend()
    port = free_port()
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"""
version: 1
listeners:
  - name: secure
    port: {port}
    tls:
      mode: mutual
      certificate: certs/server.pem
      private_key: certs/server-key.pem
      client_ca: certs/ca.pem
services:
  - name: model
    endpoints: ["127.0.0.1:{backend_port}"]
routes:
  - name: client-only
    backends: [{{service: model}}]
    access:
      allow:
        - identities: ["{ALLOWED}"]
"""
    )
    gateway = TlsGateway(policy)
    try:
        await gateway.start()
        allowed = client_context(pki, pki.client)

        async def answers() -> bool:
            try:
                return (await https_get(port, allowed)).status == 200
            except OSError:
                return False

        await poll_until(answers, timeout=10, what="the mutual-TLS listener to answer")
        denied = await https_get(port, client_context(pki, pki.intruder))
        assert denied.status == 403
        assert json_body(denied) == {"error": "forbidden: route client-only denies this client"}
    finally:
        await gateway.stop()
        await runner.cleanup()
