"""Rollout webhooks over real HTTP on loopback: a pre-step gate holds a step until it
answers 2xx (no evidence lost meanwhile), promotion and rollback are POSTed as JSON, and a
failing call is retried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from inferway.controllers.rollout.evidence import VersionCounts, WindowSample
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.rollouts.store import RolloutStore
from inferway.policies import load_policy_text
from inferway.xds.cache import SnapshotCache
from tests.aiohttp_sites import start_site
from tests.helpers import poll_until

pytestmark = pytest.mark.integration


class Hooks:
    """One aiohttp server: /gate answers 503 while ``refuse``; /done and /rollback record
    bodies, /rollback failing its first call."""

    def __init__(self) -> None:
        self.refuse = True
        self.calls: dict[str, list[dict[str, Any]]] = {"gate": [], "done": [], "rollback": []}

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.calls[name].append(await request.json())
        if name == "gate" and self.refuse:
            return web.Response(status=503, text="change freeze")
        if name == "rollback" and len(self.calls["rollback"]) == 1:
            return web.Response(status=500, text="try again")
        return web.Response(text="ok")


@pytest.fixture
async def hooks() -> Any:
    server = Hooks()
    app = web.Application()
    app.router.add_post("/{name}", server.handle)
    runner, port = await start_site(app)
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _policy(base: str) -> str:
    return f"""version: 1
listeners: [{{name: edge, port: 18081}}]
services:
  - {{name: v1, endpoints: ["127.0.0.1:1"]}}
  - {{name: v2, endpoints: ["127.0.0.1:2"]}}
routes:
  - name: inference
    backends: [{{service: v1, weight: 100}}, {{service: v2, weight: 0}}]
rollouts:
  - name: r
    route: inference
    stable: v1
    canary: v2
    steps: [50, 100]
    analysis: {{interval: 1s}}
    webhooks:
      - {{type: pre-step, url: "{base}/gate", retries: 0, timeout: 2s}}
      - {{type: post-rollout, url: "{base}/done"}}
      - {{type: rollback, url: "{base}/rollback", retries: 1}}
"""


class _Good:
    async def sample(self) -> WindowSample:
        return WindowSample(
            stable=VersionCounts(2000, 0, {5.0: 2000}), canary=VersionCounts(2000, 0, {1.0: 2000})
        )


async def test_a_pre_step_gate_holds_steps_and_notifications_are_posted(
    tmp_path: Path, hooks: Any
) -> None:
    server, base = hooks
    policy = load_policy_text(_policy(base), "p.yaml")
    now = [1000.0]
    plane = ControlPlane(SnapshotCache())
    driver = RolloutDriver(plane, RolloutStore(tmp_path), lambda c: _Good(), clock=lambda: now[0])
    plane.add_observer(driver)
    plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))

    assert await driver.tick("r") is None, "the gate refused the first step"
    status = driver.status("r")
    assert status["phase"] == "waiting" and "503: change freeze" in status["gate"]["reason"]
    assert dict(plane.state.weights) == {}
    assert server.calls["gate"][0]["decision"]["action"] == "start"

    server.refuse = False
    start = await driver.tick("r")
    assert start is not None and start.action == "start" and driver.status("r")["gate"] is None
    assert dict(plane.state.weights["inference"]) == {"v1": 50.0, "v2": 50.0}

    server.refuse = True
    now[0] += 5
    assert await driver.tick("r") is None, "the promotion waits for the gate"
    server.refuse = False
    now[0] += 5
    promote = await driver.tick("r")
    assert promote is not None and promote.action == "promote"
    assert driver.status("r")["evidence"]["canary"]["requests"] == 4000, "held window kept"
    await poll_until(lambda: server.calls["done"], timeout=10, what="the post-rollout POST")
    assert server.calls["done"][0]["event"] == "post-rollout"
    assert server.calls["done"][0]["decision"]["weight"] == 10_000

    driver.command("r", "restart")
    assert driver.command("r", "abort").action == "abort"
    await poll_until(
        lambda: len(server.calls["rollback"]) == 2, timeout=10, what="the retried rollback POST"
    )
    assert server.calls["rollback"][1]["decision"]["action"] == "abort"
    await driver.stop()
