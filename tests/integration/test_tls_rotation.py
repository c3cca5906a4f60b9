"""Certificate rotation under steady load: the files are replaced, the control plane pushes the
new SDS secret, new handshakes present the new certificate, an established keep-alive
connection carries on with the old one, and not one request fails."""

from __future__ import annotations

import asyncio
import http.client
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509

from inferway.pki.bundle_files import load_bundle, write_bundle
from inferway.pki.mint import build_certificate, spiffe_id_for
from tests.envoy_process import free_port
from tests.integration.tls_support import (
    TlsGateway,
    client_context,
    https_get,
    mint_pki,
    serial_of,
    start_answering_backend,
)

pytestmark = pytest.mark.integration


@dataclass
class Load:
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    serials: list[int] = field(default_factory=list)


def _keep_alive(port: int, context: ssl.SSLContext, stop: threading.Event, load: Load) -> None:
    """Requests over ONE connection for as long as the test runs."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    try:
        while not stop.is_set():
            try:
                conn.request("GET", "/keep-alive")
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    load.failures.append(f"keep-alive status {response.status}")
                else:
                    load.ok += 1
                sock = conn.sock
                assert isinstance(sock, ssl.SSLSocket)
                der = sock.getpeercert(binary_form=True)
                assert der is not None
                serial = x509.load_der_x509_certificate(der).serial_number
                if not load.serials or load.serials[-1] != serial:
                    load.serials.append(serial)
            except Exception as exc:  # every failure is a test failure, recorded
                load.failures.append(
                    f"keep-alive at {time.monotonic():.2f} after {load.ok} ok: {exc!r}"
                )
                return
            time.sleep(0.002)
    finally:
        conn.close()


async def _new_connections(port: int, context: ssl.SSLContext, stop: asyncio.Event, load: Load):  # type: ignore[no-untyped-def]
    """One fresh TLS connection (a new handshake) per request."""
    while not stop.is_set():
        try:
            answer = await https_get(port, context, "/fresh")
        except Exception as exc:
            load.failures.append(f"fresh: {exc!r}")
            continue
        if answer.status != 200:
            load.failures.append(f"fresh status {answer.status}")
        else:
            load.ok += 1
            load.serials.append(answer.peer_serial)


async def test_rotation_under_load_zero_failures_new_cert_on_new_handshakes(
    tmp_path: Path,
) -> None:
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
  - name: all
    backends: [{{service: model}}]
"""
    )
    gateway = TlsGateway(policy)
    context = client_context(pki, pki.client)
    stop_thread = threading.Event()
    stop_fresh = asyncio.Event()
    kept, fresh = Load(), Load()
    rotated_at = 0.0
    thread: threading.Thread | None = None
    try:
        await gateway.start()
        old_serial = serial_of(pki.server.certificate)
        deadline = time.monotonic() + 10
        while True:  # the listener answers
            try:
                if (await https_get(port, context)).status == 200:
                    break
            except (ssl.SSLError, OSError):
                pass
            assert time.monotonic() < deadline, "the TLS listener never answered"
            await asyncio.sleep(0.05)

        thread = threading.Thread(target=_keep_alive, args=(port, context, stop_thread, kept))
        thread.start()
        fresh_task = asyncio.create_task(_new_connections(port, context, stop_fresh, fresh))
        await asyncio.sleep(0.5)
        assert kept.ok > 0 and fresh.ok > 0, "no steady load before the rotation"

        new = build_certificate(
            load_bundle(pki.dir, "ca"),
            spiffe_id=spiffe_id_for("gateway"),
            dns_names=["localhost"],
            ip_addresses=["127.0.0.1"],
            server=True,
            client=True,
            days=2,
        )
        rotated_at = time.monotonic()
        write_bundle(pki.dir, "server", new)  # key, then certificate: two atomic renames
        new_serial = new.serial_number
        assert new_serial != old_serial

        deadline = time.monotonic() + 10
        while new_serial not in fresh.serials:
            assert time.monotonic() < deadline, (
                f"no new handshake presented the new certificate; rotations="
                f"{gateway.certificates.rotations}, refused={gateway.plane.last_refused}"
            )
            await asyncio.sleep(0.05)
        seen_new_at = len(fresh.serials)
        await asyncio.sleep(0.5)  # keep the load on after the switch
        stop_fresh.set()
        await fresh_task
    finally:
        stopped_at = time.monotonic()
        stop_thread.set()
        if thread is not None:
            await asyncio.to_thread(thread.join, 10)  # the backend needs the loop meanwhile
        await gateway.stop()
        await runner.cleanup()

    assert kept.failures == [] and fresh.failures == [], (
        f"rotated at {rotated_at:.2f}, stopped at {stopped_at:.2f}",
        kept.failures,
        fresh.failures,
    )
    assert gateway.certificates.rotations >= 1
    # Fresh handshakes switched from the old certificate to the new one, and never back.
    assert fresh.serials[0] == old_serial
    assert set(fresh.serials[seen_new_at - 1 :]) == {new_serial}, fresh.serials[-20:]
    assert fresh.ok >= 20, fresh.ok
    # The established connection was not dropped: one connection, still the old certificate.
    assert kept.serials == [old_serial]
    assert kept.ok >= 20, kept.ok
