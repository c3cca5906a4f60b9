"""Hot reload is supervised (issue 33, item 1), on a real gateway without Envoy: an edit that
used to raise inside the watcher (500 nested lists, ``weight: .inf``, ``1e308``) is a refused
edit with its location and later valid edits still apply; an unexpected failure in a state
source is a refused edit, not a dead task; a watch task that has ended is started again by
``POST /reload``; and ``GET /status`` shows each watcher's health and last read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from inferway.gateway.admin_security import ADMIN_TOKEN_ENV
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.gateway.watch_health import WatchHealth, supervise
from inferway.policies.model import Policy
from inferway.state import State
from tests.envoy_process import free_port
from tests.helpers import poll_until, write_atomically

pytestmark = pytest.mark.integration

POLICY = """\
version: 1
listeners: [{{name: edge, port: {port}}}]
services:
  - {{name: v1, endpoints: ["127.0.0.1:9001"]}}
  - {{name: v2, endpoints: ["127.0.0.1:9002"]}}
routes:
  - name: r
    backends:
      - service: v1
        weight: {v1}
      - service: v2
        weight: {v2}
"""


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "test-token")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(port=free_port(), v1=90, v2=10), encoding="utf-8")
    options = GatewayOptions(
        policy_path=policy, xds_port=0, admin_port=0, with_envoy=False, workdir=tmp_path / "w"
    )
    running = await start_gateway(options)
    try:
        yield running
    finally:
        await running.stop()


def _weights(gateway: Gateway) -> list[float]:
    policy = gateway.control_plane.policy
    assert policy is not None
    return [backend.weight for backend in policy.routes[0].backends]


@pytest.mark.parametrize(
    "hostile",
    [
        "x: " + "[" * 500 + "]" * 500 + "\n",
        "WEIGHT:.inf",
        "WEIGHT:1e400",
        "WEIGHT:1.0e+308",
    ],
)
async def test_a_hostile_edit_is_refused_and_later_edits_still_apply(
    gateway: Gateway, hostile: str
) -> None:
    path = gateway.options.policy_path
    port = gateway.control_plane.policy.listeners[0].port  # type: ignore[union-attr]
    live = gateway.control_plane.version
    if hostile.startswith("WEIGHT:"):
        text = POLICY.format(port=port, v1=hostile.removeprefix("WEIGHT:"), v2=10)
    else:
        text = POLICY.format(port=port, v1=90, v2=10) + hostile
    write_atomically(path, text)
    await poll_until(
        lambda: gateway.control_plane.last_refused is not None,
        timeout=10,
        what="the edit",
    )
    refusal = gateway.control_plane.last_refused
    assert refusal is not None and refusal.issues[0].line is not None
    assert gateway.control_plane.version == live
    assert gateway.watcher.running

    write_atomically(path, POLICY.format(port=port, v1=50, v2=50))
    await poll_until(lambda: _weights(gateway) == [50, 50], timeout=10, what="the edit")


async def test_an_unexpected_failure_in_a_source_is_a_refused_edit(gateway: Gateway) -> None:
    """A state source with a bug (here: one that raises on a 70/30 split) refuses that edit
    with the file named; the watcher lives on and the next edit applies."""

    def buggy(policy: Policy, state: State) -> State:
        if policy.routes[0].backends[0].weight == 70:
            raise ZeroDivisionError("a bug in a source")
        return state

    gateway.watcher.sources = (*gateway.watcher.sources, buggy)
    path = gateway.options.policy_path
    port = gateway.control_plane.policy.listeners[0].port  # type: ignore[union-attr]
    live = gateway.control_plane.version
    write_atomically(path, POLICY.format(port=port, v1=70, v2=30))
    await poll_until(
        lambda: gateway.control_plane.last_refused is not None,
        timeout=10,
        what="the edit",
    )
    refusal = gateway.control_plane.last_refused
    assert refusal is not None and refusal.file == str(path)
    assert "could not be processed (ZeroDivisionError)" in refusal.issues[0].message
    assert gateway.control_plane.version == live
    assert gateway.watcher.health.last_error == "ZeroDivisionError: a bug in a source"

    write_atomically(path, POLICY.format(port=port, v1=60, v2=40))
    await poll_until(lambda: _weights(gateway) == [60, 40], timeout=10, what="the edit")


async def test_status_shows_each_watcher_and_reload_restarts_a_dead_one(
    gateway: Gateway,
) -> None:
    path = gateway.options.policy_path
    port = gateway.control_plane.policy.listeners[0].port  # type: ignore[union-attr]
    async with httpx.AsyncClient(base_url=gateway.admin.url, timeout=5) as client:
        write_atomically(path, POLICY.format(port=port, v1=80, v2=20))
        await poll_until(lambda: _weights(gateway) == [80, 20], timeout=10, what="the edit")
        status = (await client.get("/status")).json()
        watchers = {w["kind"]: w for w in status["watchers"]}
        assert set(watchers) == {"policy", "certificates"}
        policy = watchers["policy"]
        assert policy["healthy"] and policy["running"] and policy["path"] == str(path)
        assert policy["last_read_at"] is not None and policy["restarts"] == 0
        assert "health" in status and "policy" in status  # the existing keys stay

        task = gateway.watcher._task  # the watch task ends, as it did on an uncaught error
        assert task is not None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert not gateway.watcher.running
        write_atomically(path, POLICY.format(port=port, v1=40, v2=60))
        answer = await client.post("/reload", headers={"Authorization": "Bearer test-token"})
        assert answer.status_code == 200, answer.text
        assert answer.json().get("watcher_restarted") is True, answer.json()
        assert _weights(gateway) == [40, 60]
        assert gateway.watcher.running
        write_atomically(path, POLICY.format(port=port, v1=30, v2=70))
        await poll_until(
            lambda: _weights(gateway) == [30, 70], timeout=10, what="the edit"
        )  # watched again
        status = (await client.get("/status")).json()
        assert {w["kind"]: w for w in status["watchers"]}["policy"]["restarts"] == 1


async def test_a_failing_watch_loop_is_restarted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = WatchHealth("policy", "p.yaml")
    stop, ready = asyncio.Event(), asyncio.Event()
    runs = 0

    async def body() -> None:
        nonlocal runs
        runs += 1
        ready.set()
        health.running = True
        if runs < 3:
            raise OSError("the watch broke")
        await stop.wait()

    task = asyncio.create_task(supervise(body, health, stop, ready))
    await poll_until(lambda: runs == 3 and health.running, timeout=10, what="the edit")
    assert health.restarts == 2 and health.last_error == "OSError: the watch broke"
    assert "restarting it" in caplog.text
    stop.set()
    await task
    assert not health.running


async def test_a_watch_that_cannot_start_fails_the_start() -> None:
    health = WatchHealth("policy", "p.yaml")

    async def body() -> None:
        raise FileNotFoundError("no such directory")

    with pytest.raises(FileNotFoundError):
        await supervise(body, health, asyncio.Event(), asyncio.Event())


async def test_post_reload_on_a_deeply_nested_file_is_422_with_the_location(
    gateway: Gateway,
) -> None:
    """Issue 33, item 7: it was a 500 (RecursionError inside the reload)."""
    path = gateway.options.policy_path
    port = gateway.control_plane.policy.listeners[0].port  # type: ignore[union-attr]
    gateway.watcher.settle_ms = 10_000  # the watch loop waits; POST /reload reads at once
    path.write_text(POLICY.format(port=port, v1=90, v2=10) + "x: " + "[" * 900 + "]" * 900)
    async with httpx.AsyncClient(base_url=gateway.admin.url, timeout=5) as client:
        answer = await client.post("/reload", headers={"Authorization": "Bearer test-token"})
    assert answer.status_code == 422, answer.text
    (issue,) = answer.json()["refused"]
    assert issue.startswith(f"{path}:13:67: nested too deeply")
