"""free_ports: every port it returns was free, and no two are the same number, even when the
OS offers one number twice (it picks each bind's port at random)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from inferway import free_ports as free_ports_module
from inferway.free_ports import free_port, free_ports


def test_ports_picked_together_are_all_different_and_free_to_bind() -> None:
    ports = free_ports(*["127.0.0.1"] * 64)
    assert len(set(ports)) == 64
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_number_offered_twice_is_held_and_another_picked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offered = iter([40001, 40001, 40003])
    opened: list[FakeSocket] = []

    class FakeSocket:
        def __init__(self, family: int, kind: int) -> None:
            self.family, self.closed = family, False
            opened.append(self)

        def __enter__(self) -> FakeSocket:
            return self

        def __exit__(self, *_: Any) -> None:
            self.closed = True

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.2", self.port)

    monkeypatch.setattr(free_ports_module.socket, "socket", FakeSocket)
    assert free_ports("127.0.0.1", "127.0.0.2") == [40001, 40003]
    assert len(opened) == 3 and all(sock.closed for sock in opened)


def test_an_ipv6_host_gets_an_ipv6_socket() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this kernel")
    try:
        port = free_port("::1")
    except OSError as error:  # IPv6 compiled in but ::1 not configured
        pytest.skip(f"::1 cannot be bound here: {error}")
    with socket.socket(socket.AF_INET6) as sock:
        sock.bind(("::1", port))
