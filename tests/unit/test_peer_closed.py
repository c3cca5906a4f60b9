"""The hang-up peek that the executor asks before computing a queued request's row
(protocol/peer.py): both ways of peeking agree on every state of a real TCP connection."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from inferway.backends.protocol import peer

PEEKS: dict[str, Callable[[int, int], bool]] = {"socket": peer._socket_peek_closed}
_libc = peer._libc_peek()
if _libc is not None:
    PEEKS["libc"] = _libc


def test_the_libc_peek_is_the_one_used_on_linux() -> None:
    assert _libc is not None, "recv(2) through the C library should load on Linux"
    assert peer._peer_closed is not peer._socket_peek_closed


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(client, server side) of a loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    server.setblocking(False)
    yield client, server
    client.close()
    server.close()


def _settle() -> None:
    time.sleep(0.02)  # loopback delivers at once; a margin for a loaded machine


@pytest.mark.parametrize("name", sorted(PEEKS))
def test_a_connected_client_is_there(name: str, pair: tuple[socket.socket, socket.socket]) -> None:
    _client, server = pair
    assert PEEKS[name](server.fileno(), server.family) is False


@pytest.mark.parametrize("name", sorted(PEEKS))
def test_bytes_waiting_mean_the_client_is_there_and_stay_unread(
    name: str, pair: tuple[socket.socket, socket.socket]
) -> None:
    client, server = pair
    client.sendall(b"GET / HTTP/1.1\r\n")
    _settle()
    assert PEEKS[name](server.fileno(), server.family) is False
    assert server.recv(64) == b"GET / HTTP/1.1\r\n"  # the peek consumed nothing


@pytest.mark.parametrize("name", sorted(PEEKS))
def test_a_fin_is_a_client_gone(name: str, pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    client.shutdown(socket.SHUT_WR)
    _settle()
    assert PEEKS[name](server.fileno(), server.family) is True


@pytest.mark.parametrize("name", sorted(PEEKS))
def test_a_reset_is_a_client_gone(name: str, pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # linger 0: an RST, not a FIN
    _settle()
    assert PEEKS[name](server.fileno(), server.family) is True


@pytest.mark.parametrize("name", sorted(PEEKS))
def test_a_descriptor_that_is_no_socket_reads_as_gone(name: str) -> None:
    with open(__file__, "rb") as f:
        assert PEEKS[name](f.fileno(), socket.AF_INET) is True


def test_the_check_follows_a_real_transport() -> None:
    async def scenario() -> list[bool]:
        seen: list[bool] = []
        accepted: asyncio.Future[asyncio.BaseTransport] = asyncio.get_running_loop().create_future()

        class Server(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted.set_result(transport)

        server = await asyncio.get_running_loop().create_server(Server, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        transport = await asyncio.wait_for(accepted, 5)
        check = peer.transport_gone_check(transport)
        assert check is not None
        seen.append(check())
        client.close()
        await asyncio.sleep(0.02)
        seen.append(check())
        transport.close()
        server.close()
        await server.wait_closed()
        return seen

    assert asyncio.run(scenario()) == [False, True]
