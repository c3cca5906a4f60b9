"""A half-saved policy does not go live (issue 33, item 3), on a real gateway without Envoy:
an edit that removes every route or moves every listener is refused, located, unless it says
``allow_disruptive: true``; and a save written in several parts is read once it has stopped
changing, so the part-way file is never applied nor refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inferway.gateway.admin_security import ADMIN_TOKEN_ENV
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.policies import load_policy_text
from inferway.policies.checks_disruptive import check_disruptive_edit
from tests.envoy_process import free_port
from tests.helpers import poll_until, write_atomically

pytestmark = pytest.mark.integration

POLICY = """\
version: 1
listeners:
  - {{name: edge, port: {port}}}
services:
  - {{name: v1, endpoints: ["127.0.0.1:9001"]}}
routes:
  - name: r
    backends:
      - service: v1
        timeout: {timeout}
"""


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "test-token")
    policy = tmp_path / "policy.yaml"
    policy.write_text(_text(free_port(), "15s"), encoding="utf-8")
    options = GatewayOptions(
        policy_path=policy, xds_port=0, admin_port=0, with_envoy=False, workdir=tmp_path / "w"
    )
    running = await start_gateway(options)
    try:
        yield running
    finally:
        await running.stop()


def _text(port: int, timeout: str) -> str:
    return POLICY.format(port=port, timeout=timeout).replace("        timeout", "    timeout")


def _port(gateway: Gateway) -> int:
    assert gateway.control_plane.policy is not None
    return gateway.control_plane.policy.listeners[0].port


async def test_a_truncated_save_is_refused_and_located(gateway: Gateway) -> None:
    path = gateway.options.policy_path
    live = gateway.control_plane.version
    write_atomically(path, "version: 1\nlisteners:\n  - {name: edge, port: 10}\n")
    await poll_until(
        lambda: gateway.control_plane.last_refused is not None,
        timeout=10,
        what="the edit",
    )
    refusal = gateway.control_plane.last_refused
    assert refusal is not None
    messages = [str(issue) for issue in refusal.issues]
    assert any("this edit removes every route (1 live)" in m for m in messages), messages
    assert any(
        f"policy.yaml:2:1: listeners: this edit moves every listener (live: "
        f"127.0.0.1:{_port(gateway)}; new: 127.0.0.1:10)" in m
        for m in messages
    ), messages
    assert gateway.control_plane.version == live


async def test_allow_disruptive_lets_the_edit_through(gateway: Gateway) -> None:
    path = gateway.options.policy_path
    other = free_port()
    write_atomically(path, _text(other, "15s").replace("version: 1", "allow_disruptive: true"))
    await poll_until(lambda: _port(gateway) == other, timeout=10, what="the edit")
    assert gateway.control_plane.last_refused is None


async def test_moving_one_of_two_listeners_or_editing_routes_is_not_disruptive() -> None:
    live = load_policy_text(_text(10000, "15s"), "p.yaml")
    two = _text(10001, "15s").replace("listeners:\n", "listeners:\n  - {name: keep, port: 10000}\n")
    assert check_disruptive_edit(live, load_policy_text(two, "p.yaml")) == []
    assert check_disruptive_edit(live, load_policy_text(_text(10000, "3s"), "p.yaml")) == []
    assert check_disruptive_edit(None, load_policy_text(_text(1, "3s"), "p.yaml")) == []


async def test_a_save_in_two_parts_is_read_once_whole(gateway: Gateway) -> None:
    path = gateway.options.policy_path
    port = _port(gateway)
    full = _text(port, "7s")
    cut = full.index("routes:")
    with path.open("w", encoding="utf-8") as handle:  # in place, as a slow writer saves
        handle.write(full[:cut])
        handle.flush()
        await asyncio.sleep(0.04)  # more than the watch's debounce, less than settling
        handle.write(full[cut:])
    await poll_until(
        lambda: gateway.control_plane.policy.routes[0].timeout == 7.0,
        timeout=10,
        what="the edit",
    )
    assert gateway.control_plane.last_refused is None
