"""free_ports: every port it returns was free, and no two are the same number, even when the
OS offers one number twice (it picks each bind's port at random)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
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


class FakeSocket:
    """A socket whose binds take their numbers from ``offered``; every one made is kept."""

    offered: Iterator[int] = iter(())
    opened: list[FakeSocket] = []

    def __init__(self, family: int, kind: int) -> None:
        self.family, self.closed, self.port = family, False, 0
        FakeSocket.opened.append(self)

    def __enter__(self) -> FakeSocket:
        return self

    def __exit__(self, *_: Any) -> None:
        self.closed = True

    def bind(self, address: tuple[str, int]) -> None:
        self.port = next(FakeSocket.offered)

    def getsockname(self) -> tuple[str, int]:
        return ("::1", self.port)


def offer(monkeypatch: pytest.MonkeyPatch, *ports: int) -> list[FakeSocket]:
    """Make ``free_ports``' binds return ``ports`` in turn; the sockets it opens."""
    monkeypatch.setattr(FakeSocket, "offered", iter(ports))
    monkeypatch.setattr(FakeSocket, "opened", [])
    monkeypatch.setattr(free_ports_module.socket, "socket", FakeSocket)
    return FakeSocket.opened


def test_a_number_offered_twice_is_held_and_another_picked_on_each_family(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened = offer(monkeypatch, 40001, 40001, 40003)
    assert free_ports("127.0.0.1", "::1") == [40001, 40003]
    assert [sock.family for sock in opened] == [socket.AF_INET, socket.AF_INET6, socket.AF_INET6]
    assert all(sock.closed for sock in opened)


def test_a_port_to_avoid_is_held_and_another_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    offer(monkeypatch, 40002, 40005)
    assert free_ports("127.0.0.1", avoid={40002}) == [40005]


def test_ports_are_picked_under_the_kernels_ephemeral_range_where_it_leaves_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Linux's default range, whatever this host's is: the test runs everywhere, and the ports
    # under 32768 are real ones, bound for the test.
    first = 32768
    monkeypatch.setattr(free_ports_module, "ephemeral_range", lambda: (first, 60999))
    ports = free_ports(*["127.0.0.1"] * 32)
    assert all(free_ports_module._LOWEST <= port < first for port in ports), ports


def test_a_taken_candidate_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        tries = iter([busy, busy, 0])
        monkeypatch.setattr(free_ports_module, "_candidates", lambda: tries)
        (port,) = free_ports("127.0.0.1")
        assert port != busy


def test_inferways_default_ports_are_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that leaves the feature router on its default 18091 and asks for a free reports
    port must never be given 18091 (it would be refused as the feature router's)."""
    reserved = sorted(free_ports_module.INFERWAY_DEFAULT_PORTS)
    offered = [*reserved, 17001]
    monkeypatch.setattr(free_ports_module.random, "sample", lambda *_: list(offered))
    monkeypatch.setattr(free_ports_module, "ephemeral_range", lambda: (32768, 60999))
    assert free_ports("127.0.0.1") == [17001]


def test_the_reserved_ports_are_inferways_defaults() -> None:
    from inferway.gateway.gateway_plan import DEFAULT_XDS_PORT
    from inferway.policies.features import DEFAULT_FEATURE_ROUTER_PORT
    from inferway.policies.llm import DEFAULT_LLM_PORT
    from inferway.policies.masking import DEFAULT_MASK_SINK_PORT
    from inferway.policies.picker import DEFAULT_PICKER_HTTP_LISTEN, DEFAULT_PICKER_LISTEN

    defaults = {
        DEFAULT_XDS_PORT,
        DEFAULT_FEATURE_ROUTER_PORT,
        DEFAULT_LLM_PORT,
        DEFAULT_LLM_PORT + 1,  # the reports port's default: port + 1
        DEFAULT_MASK_SINK_PORT,
        int(DEFAULT_PICKER_LISTEN.rsplit(":", 1)[1]),
        int(DEFAULT_PICKER_HTTP_LISTEN.rsplit(":", 1)[1]),
    }
    assert defaults == set(free_ports_module.INFERWAY_DEFAULT_PORTS)
