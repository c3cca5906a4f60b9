"""The rollouts on the admin API over real HTTP: reads are open, commands need the token, and
an unknown rollout or command, or one the phase refuses, gets a 4xx with the reason."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from inferway.gateway.admin import build_admin_app, start_admin_server
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.rollouts.admin_routes import add_rollout_routes
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.rollouts.store import RolloutStore
from inferway.policies import load_policy_text
from inferway.xds.cache import SnapshotCache

pytestmark = pytest.mark.integration

POLICY = """version: 1
listeners: [{name: edge, port: 18082}]
services:
  - {name: v1, endpoints: ["127.0.0.1:1"]}
  - {name: v2, endpoints: ["127.0.0.1:2"]}
routes:
  - name: inference
    backends: [{service: v1, weight: 100}, {service: v2, weight: 0}]
rollouts:
  - {name: r, route: inference, stable: v1, canary: v2, steps: [10, 100]}
"""


class _Nothing:
    async def sample(self) -> None:
        return None


async def test_rollout_endpoints_answer_and_guard_commands(tmp_path: Path) -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    plane = ControlPlane(SnapshotCache())
    driver = RolloutDriver(plane, RolloutStore(tmp_path), lambda c: _Nothing())
    plane.add_observer(driver)
    plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))
    app = build_admin_app(plane, token="secret")
    add_rollout_routes(app, driver)
    server = await start_admin_server(app, port=0)
    auth = {"Authorization": "Bearer secret"}
    try:
        async with aiohttp.ClientSession(base_url=server.url) as http:
            async with http.get("/rollouts") as response:
                listing = await response.json()
            assert response.status == 200 and [r["name"] for r in listing["rollouts"]] == ["r"]
            async with http.get("/rollouts/nope") as response:
                body = await response.json()
            assert response.status == 404 and "rollouts: r" in body["error"]
            async with http.post("/rollouts/r/pause") as response:
                assert response.status == 401
            async with http.post("/rollouts/r/explode", headers=auth) as response:
                assert response.status == 404
                assert "expected one of" in (await response.json())["error"]
            async with http.post("/rollouts/r/resume", headers=auth) as response:
                body = await response.json()
            assert response.status == 409 and "cannot resume while waiting" in body["error"]
            async with http.post("/rollouts/r/restart", headers=auth) as response:
                body = await response.json()
            assert response.status == 200 and body["status"]["phase"] == "progressing"
            assert dict(plane.state.weights["inference"]) == {"v1": 90.0, "v2": 10.0}
            async with http.post("/rollouts/r/abort", headers=auth) as response:
                body = await response.json()
            assert response.status == 200 and body["decision"]["action"] == "abort"
            assert dict(plane.state.weights["inference"]) == {"v1": 100.0, "v2": 0.0}
            async with http.get("/rollouts/r") as response:
                shown = await response.json()
            assert [d["action"] for d in shown["history"]] == ["start", "abort"]
    finally:
        await server.stop()
        await driver.stop()
