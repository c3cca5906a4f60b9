"""protocol/accept_all.py on uvloop and real sockets: every waiting connection is taken in one
pass of the loop (uvloop's own accept takes one a pass), a flood at most ``ACCEPT_PER_PASS`` a
pass, TLS is the server's, a failed handshake is the client's, running out of descriptors
pauses accepting (no spinning) and it resumes, and ``close`` stops it."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

from inferway.backends.protocol import accept_all
from inferway.backends.protocol.accept_all import AcceptAll
from tests.integration.tls_support import client_context, mint_pki


class _Counted(asyncio.Protocol):
    """Records in which pass of the loop each connection was made; answers b"ok"."""

    made: list[int]
    passes: list[int]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(self.passes[0])
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._transport.write(b"ok")  # type: ignore[attr-defined]


async def _serve(
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[asyncio.Server, AcceptAll, list[int], list[int]]:
    loop = asyncio.get_running_loop()
    made: list[int] = []
    passes = [0]

    def factory() -> _Counted:
        protocol = _Counted()
        protocol.made, protocol.passes = made, passes
        return protocol

    server = await loop.create_server(
        factory, "127.0.0.1", 0, backlog=1024, start_serving=False, ssl=ssl_context
    )
    acceptor = AcceptAll(loop, server.sockets, factory, ssl_context=ssl_context, backlog=1024)
    return server, acceptor, made, passes


def _count_passes(passes: list[int], until: int) -> None:
    loop = asyncio.get_running_loop()

    def tick() -> None:
        passes[0] += 1
        if passes[0] < until:
            loop.call_soon(tick)  # runs once a pass: after the pass's I/O

    loop.call_soon(tick)


def _port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


async def _waiting_then_taken(clients: int, *, passes: int) -> tuple[Counter[int], int]:
    """``clients`` connections wait before the loop looks; how many were made in which pass
    (counted for ``passes`` passes), and how many the acceptor took."""
    server, acceptor, made, counter = await _serve()
    waiting = [socket.create_connection(("127.0.0.1", _port(server))) for _ in range(clients)]
    _count_passes(counter, passes)
    await asyncio.sleep(0.3)
    for client in waiting:
        client.close()
    acceptor.close()
    server.close()
    return Counter(made), acceptor.accepted


@pytest.mark.parametrize("run", [uvloop.run, asyncio.run], ids=["uvloop", "asyncio"])
def test_every_waiting_connection_is_taken_in_one_pass(run: Callable[..., Any]) -> None:
    per_pass, accepted = run(_waiting_then_taken(100, passes=50))
    assert accepted == 100
    assert sum(per_pass.values()) == 100
    assert len(per_pass) <= 2, f"connections made over {len(per_pass)} passes: {per_pass}"


def test_a_flood_is_taken_at_most_accept_per_pass_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accept_all, "ACCEPT_PER_PASS", 10)

    per_pass, _accepted = uvloop.run(_waiting_then_taken(45, passes=100))
    assert sum(per_pass.values()) == 45
    assert max(per_pass.values()) <= 10
    assert len(per_pass) >= 5


def test_tls_is_the_servers_and_a_failed_handshake_is_the_clients(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = mint_pki(tmp_path / "certs")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(pki.server.certificate, pki.server.private_key)

    async def scenario() -> bytes:
        server, acceptor, _made, _passes = await _serve(server_context)
        port = _port(server)
        # plain text to a TLS port: the handshake fails, on the client's account
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(reader.read(), 5)
        writer.close()
        # and the next client, speaking TLS, is served
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context(pki, None), server_hostname="localhost"
        )
        writer.write(b"hello")
        answer = await asyncio.wait_for(reader.readexactly(2), 5)
        writer.close()
        acceptor.close()
        server.close()
        return answer

    with caplog.at_level(logging.DEBUG, logger=accept_all.__name__):
        assert uvloop.run(scenario()) == b"ok"
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not loud, [r.getMessage() for r in loud]


def test_close_stops_accepting() -> None:
    async def scenario() -> None:
        server, acceptor, made, _passes = await _serve()
        port = _port(server)
        acceptor.close()
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
        assert made == []

    uvloop.run(scenario())


_OUT_OF_DESCRIPTORS = textwrap.dedent(
    """
    import asyncio, logging, resource, socket, sys, time
    import uvloop
    from inferway.backends.protocol.accept_all import AcceptAll

    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")

    class Answer(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
        def data_received(self, data):
            self.transport.write(b"ok")  # and stays open: its descriptor stays taken

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Answer, "127.0.0.1", 0, start_serving=False)
        acceptor = AcceptAll(loop, server.sockets, Answer, ssl_context=None, backlog=64,
                             retry_after_s=0.3)
        port = server.sockets[0].getsockname()[1]
        import os
        used = len(os.listdir("/proc/self/fd"))
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (used + 2, hard))  # room for two, no more
        print("PORT", port, flush=True)
        await asyncio.sleep(0.5)  # the parent connects 6 clients, each sends a byte
        cpu0 = time.process_time()
        await asyncio.sleep(1.0)  # out of descriptors meanwhile: paused, not spinning
        print("CPU", time.process_time() - cpu0, flush=True)
        print("ACCEPTED", acceptor.accepted, flush=True)
        resource.setrlimit(resource.RLIMIT_NOFILE, (used + 64, hard))
        await asyncio.sleep(1.0)  # room again: the waiting clients are taken and answered
        print("ACCEPTED", acceptor.accepted, flush=True)
        acceptor.close()
        server.close()

    uvloop.run(main())
    """
)


def test_out_of_descriptors_pauses_without_spinning_then_resumes() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _OUT_OF_DESCRIPTORS],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    try:
        line = child.stdout.readline()
        assert line.startswith("PORT "), line
        port = int(line.split()[1])
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
        for client in clients:
            client.sendall(b"x")
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    lines = out.splitlines()
    assert any("accepting on" in x and "paused" in x for x in lines), out
    cpu = float(next(x for x in lines if x.startswith("CPU")).split()[1])
    assert cpu < 0.3, f"the paused acceptor spun: {cpu:.2f} s of CPU in 1 s"
    counts = [int(x.split()[1]) for x in lines if x.startswith("ACCEPTED")]
    assert counts[0] < 6 <= counts[1], out
    for client in clients:  # every one was answered once there was room
        client.settimeout(5)
        assert client.recv(2) == b"ok"
        client.close()
