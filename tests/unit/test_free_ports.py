"""free_ports: every port it returns was free, and no two are the same number, even when the
OS offers one number twice (it picks each bind's port at random)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from inferway import free_ports as free_ports_module
from inferway.free_ports import free_ports


def test_ports_picked_together_are_all_different_and_free_to_bind() -> None:
    ports = free_ports(*["127.0.0.1"] * 64)
    assert len(set(ports)) == 64
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_number_offered_twice_is_held_and_another_picked_on_each_family(
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
            return ("::1", self.port)

    monkeypatch.setattr(free_ports_module.socket, "socket", FakeSocket)
    assert free_ports("127.0.0.1", "::1") == [40001, 40003]
    assert [sock.family for sock in opened] == [socket.AF_INET, socket.AF_INET6, socket.AF_INET6]
    assert all(sock.closed for sock in opened)


def test_a_port_to_avoid_is_held_and_another_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    offered = iter([40002, 40005])

    class FakeSocket:
        def __init__(self, family: int, kind: int) -> None:
            pass

        def __enter__(self) -> FakeSocket:
            return self

        def __exit__(self, *_: Any) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(free_ports_module.socket, "socket", FakeSocket)
    assert free_ports("127.0.0.1", avoid={40002}) == [40005]
