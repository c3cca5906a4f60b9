"""A mutual-TLS listener on real Envoy: the handshake refuses what the CA did not sign (or what
expired, or no certificate at all); a valid certificate with a disallowed identity gets 403;
TLS 1.1 and below are refused, 1.2 and 1.3 accepted; with ``min_version: "1.3"`` a TLS 1.2
client is refused too."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.envoy_process import free_port
from tests.integration.tls_support import (
    ALLOWED,
    Pki,
    TlsGateway,
    client_context,
    https_get,
    json_body,
    mint_pki,
    start_answering_backend,
)

pytestmark = pytest.mark.integration


@dataclass
class Mtls:
    gateway: TlsGateway
    pki: Pki
    port: int


@contextlib.asynccontextmanager
async def _mtls_gateway(tmp_path: Path, min_version: str | None = None) -> AsyncIterator[Mtls]:
    pki = mint_pki(tmp_path / "certs")
    version_line = "" if min_version is None else f'\n      min_version: "{min_version}"'
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
      allowed_identities: ["{ALLOWED}"]{version_line}
services:
  - name: model
    endpoints: ["127.0.0.1:{backend_port}"]
routes:
  - name: admin
    match: {{path: {{prefix: /admin}}}}
    backends: [{{service: model}}]
    access: {{allow: [{{identities: ["spiffe://inferway.local/ns/ops/sa/*"]}}]}}
  - name: limited
    match: {{path: {{prefix: /limited}}}}
    backends: [{{service: model}}]
    rate_limit: {{tokens: 1, fill_interval: 1m, burst: 1}}
  - name: all
    backends: [{{service: model}}]
"""
    )
    gateway = TlsGateway(policy)
    try:
        await gateway.start()
        yield Mtls(gateway, pki, port)
    finally:
        await gateway.stop()
        await runner.cleanup()


@pytest.fixture
async def mtls(tmp_path: Path) -> AsyncIterator[Mtls]:
    async with _mtls_gateway(tmp_path) as started:
        yield started


async def _refused(port: int, context: ssl.SSLContext) -> bool:
    """True when the connection fails (at the handshake, or, with TLS 1.3 where the server
    checks the client certificate after the client finished, on the first read)."""
    try:
        await https_get(port, context)
    except (ssl.SSLError, ConnectionError, OSError):
        return True
    return False


async def _wait_listening(mtls: Mtls) -> None:
    deadline = time.monotonic() + 10
    context = client_context(mtls.pki, mtls.pki.client)
    while True:
        try:
            if (await https_get(mtls.port, context)).status == 200:
                return
        except (ssl.SSLError, OSError):
            pass
        assert time.monotonic() < deadline, "the TLS listener never answered"
        await asyncio.sleep(0.05)


async def test_allowed_identity_gets_200_and_others_403(mtls: Mtls) -> None:
    await _wait_listening(mtls)
    answer = await https_get(mtls.port, client_context(mtls.pki, mtls.pki.client))
    assert answer.status == 200 and json_body(answer)["backend"] == "ok"

    denied = await https_get(mtls.port, client_context(mtls.pki, mtls.pki.intruder))
    assert denied.status == 403, denied
    body = json_body(denied)
    assert "spiffe://inferway.local/ns/default/sa/intruder" in body["error"]
    assert "not allowed on listener secure" in body["error"]


async def test_identity_access_and_rate_limit_refusals_each_get_their_own_body(
    mtls: Mtls,
) -> None:
    await _wait_listening(mtls)
    allowed = client_context(mtls.pki, mtls.pki.client)
    intruder = client_context(mtls.pki, mtls.pki.intruder)
    # The listener's identity check comes first, whatever route (a rate-limited one here).
    denied = await https_get(mtls.port, intruder, "/limited")
    assert denied.status == 403 and "not allowed on listener secure" in json_body(denied)["error"]
    # A route's access rules answer their own 403 body, naming the route.
    refused = await https_get(mtls.port, allowed, "/admin")
    assert refused.status == 403 and "route admin denies" in json_body(refused)["error"]
    # The rate limit's 429 (one token a minute) names the route too.
    statuses = [(await https_get(mtls.port, allowed, "/limited")) for _ in range(2)]
    assert [a.status for a in statuses] == [200, 429], statuses
    assert "rate limited: route limited" in json_body(statuses[1])["error"]


async def test_handshake_refuses_missing_foreign_and_expired_certificates(mtls: Mtls) -> None:
    await _wait_listening(mtls)
    prefix = "listener.secure.ssl."  # the listener's stat_prefix is its name
    before = await mtls.gateway.stats(prefix.replace(".", r"\."))

    assert await _refused(mtls.port, client_context(mtls.pki, None)), "no client cert"
    assert await _refused(mtls.port, client_context(mtls.pki, mtls.pki.foreign)), "other CA"
    assert await _refused(mtls.port, client_context(mtls.pki, mtls.pki.expired)), "expired"

    after = await mtls.gateway.stats(prefix.replace(".", r"\."))

    def grew(stat: str) -> int:
        return after.get(prefix + stat, 0) - before.get(prefix + stat, 0)

    # Envoy counts why: no certificate at all, and chain/expiry verification failures.
    assert grew("fail_verify_no_cert") == 1, after
    assert grew("fail_verify_error") == 2, after


async def test_tls_versions_below_1_2_refused_1_2_and_1_3_accepted(mtls: Mtls) -> None:
    await _wait_listening(mtls)
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        context = client_context(mtls.pki, mtls.pki.client, minimum=version, maximum=version)
        answer = await https_get(mtls.port, context)
        assert answer.status == 200
        assert answer.version == {"TLSv1_2": "TLSv1.2", "TLSv1_3": "TLSv1.3"}[version.name]

    # A client that offers at most TLS 1.1. A modern OpenSSL may refuse to even offer it (its
    # security level forbids TLS < 1.2); either way the handshake must fail.
    old = client_context(mtls.pki, mtls.pki.client)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    with contextlib.suppress(ssl.SSLError):
        old.set_ciphers("DEFAULT:@SECLEVEL=0")
    assert await _refused(mtls.port, old)


async def test_min_version_1_3_refuses_a_tls_1_2_client(tmp_path: Path) -> None:
    async with _mtls_gateway(tmp_path, min_version="1.3") as mtls:
        await _wait_listening(mtls)
        prefix = "listener.secure.ssl."
        before = await mtls.gateway.stats(prefix.replace(".", r"\."))
        tls12 = client_context(
            mtls.pki,
            mtls.pki.client,
            minimum=ssl.TLSVersion.TLSv1_2,
            maximum=ssl.TLSVersion.TLSv1_2,
        )
        assert await _refused(mtls.port, tls12), "a TLS 1.2 client got through min_version 1.3"
        after = await mtls.gateway.stats(prefix.replace(".", r"\."))
        assert after.get(prefix + "connection_error", 0) > before.get(
            prefix + "connection_error", 0
        )

        tls13 = client_context(mtls.pki, mtls.pki.client, minimum=ssl.TLSVersion.TLSv1_3)
        answer = await https_get(mtls.port, tls13)
        assert answer.status == 200 and answer.version == "TLSv1.3"
