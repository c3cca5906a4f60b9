"""Canary rollouts against a real Envoy: the driver reads Envoy's per-cluster stats from its
admin API, ticks the controller every second and moves the route's weights through State.

Traffic is bounded (a few workers with a pause between requests) and on loopback only.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.xds.bootstrap import build_bootstrap
from tests.aiohttp_sites import answer_every_path, start_site
from tests.envoy_process import EnvoyProcess, free_port
from tests.helpers import poll_until

pytestmark = pytest.mark.integration

NODE_ID = "rollout-node"
MAX_FAILED_FOR_BAD_CANARY = 80
"""A bad canary (30% 5xx at a 10% step, ~40 canary requests/s) is rolled back with fewer
failed client requests than this: a handful of errors decide the SPRT, then one interval and
one xDS push move the weight back."""


async def _backend(version: str, error_rate: float = 0.0) -> tuple[web.AppRunner, int]:
    rng = random.Random(version)

    async def answer(_request: web.Request) -> web.Response:
        if rng.random() < error_rate:
            return web.Response(status=500, text="injected failure")
        return web.json_response({"version": version})

    return await start_site(answer_every_path(answer))


def _policy(listener: int, ports: dict[str, int], steps: str) -> str:
    return f"""version: 1
listeners:
  - {{name: edge, port: {listener}}}
services:
  - {{name: v1, endpoints: ["127.0.0.1:{ports["v1"]}"]}}
  - {{name: v2, endpoints: ["127.0.0.1:{ports["v2"]}"]}}
routes:
  - name: models
    backends:
      - {{service: v1, weight: 100}}
      - {{service: v2, weight: 0}}
rollouts:
  - name: v2-rollout
    route: models
    stable: v1
    canary: v2
    steps: {steps}
    analysis:
      interval: 1s
      metrics:
        - {{name: error-rate, max_increase: 5%}}
        - {{name: latency-p99, max_increase: 50%}}
"""


class Traffic:
    """Bounded background load through Envoy; counts answers by version or status."""

    def __init__(self, url: str, workers: int = 4, pause_s: float = 0.01) -> None:
        self.url, self.workers, self.pause_s = url, workers, pause_s
        self.counts: Counter[str] = Counter()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _worker(self, session: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            try:
                async with session.get(self.url) as response:
                    if response.status == 200:
                        self.counts[(await response.json())["version"]] += 1
                    else:
                        await response.read()
                        self.counts[f"status {response.status}"] += 1
            except aiohttp.ClientError:
                self.counts["error"] += 1
            await asyncio.sleep(self.pause_s)

    async def __aenter__(self) -> Traffic:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self._tasks = [
            asyncio.create_task(self._worker(self._session)) for _ in range(self.workers)
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()

    def failed(self) -> int:
        return sum(n for k, n in self.counts.items() if k not in ("v1", "v2"))


class Rig:
    """Backends, a gateway (control plane + driver, ``--no-envoy``) and a real Envoy."""

    def __init__(self, tmp_path: Path, canary_error_rate: float, steps: str) -> None:
        self.tmp_path = tmp_path
        self.canary_error_rate = canary_error_rate
        self.steps = steps
        self.listener = free_port()
        self.envoy_admin = free_port()
        self.workdir = tmp_path / "work"
        self.policy = tmp_path / "policy.yaml"
        self.gateway: Gateway | None = None
        self.xds_port = 0
        self.runners: list[web.AppRunner] = []
        self.envoy: EnvoyProcess | None = None

    async def start(self) -> None:
        ports = {}
        for version, rate in (("v1", 0.0), ("v2", self.canary_error_rate)):
            runner, ports[version] = await _backend(version, rate)
            self.runners.append(runner)
        self.policy.write_text(_policy(self.listener, ports, self.steps))
        await self.start_gateway()
        bootstrap = build_bootstrap(
            node_id=NODE_ID, xds_port=self.xds_port, admin_port=self.envoy_admin
        )
        bootstrap["stats_flush_interval"] = "1s"  # histograms reach the admin API each second
        self.envoy = await EnvoyProcess(bootstrap).start(wait="ready", timeout=20.0)

    async def start_gateway(self) -> None:
        self.gateway = await start_gateway(
            GatewayOptions(
                policy_path=self.policy,
                xds_port=self.xds_port,
                admin_port=0,
                envoy_admin_port=self.envoy_admin,
                with_envoy=False,
                workdir=self.workdir,
            )
        )
        self.xds_port = self.gateway.xds.port

    async def stop_gateway(self) -> None:
        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None

    async def close(self) -> None:
        await self.stop_gateway()
        if self.envoy is not None:
            self.envoy.stop()
        for runner in self.runners:
            await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener}/infer"

    def status(self) -> dict:
        assert self.gateway is not None and self.gateway.rollouts is not None
        return self.gateway.rollouts.status("v2-rollout", history=100)

    async def admin(self, method: str, path: str, token: str | None = None) -> tuple[int, dict]:
        assert self.gateway is not None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, self.gateway.admin.url + path, headers=headers) as response,
        ):
            return response.status, json.loads(await response.text() or "{}")

    async def wait_phase(self, phases: set[str], timeout: float) -> dict:
        async def reached() -> dict | None:
            status = self.status()
            return status if status["phase"] in phases else None

        return await poll_until(reached, timeout=timeout, what=f"rollout phase in {phases}")


async def _cli(*args: str) -> tuple[int, str]:
    """``inferway rollout ...`` as a user runs it: a separate process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "inferway.cli.main",
        "rollout",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    return process.returncode or 0, out.decode()


@pytest.fixture
async def rig_factory(tmp_path: Path) -> AsyncIterator:
    rigs: list[Rig] = []

    async def make(canary_error_rate: float, steps: str) -> Rig:
        rig = Rig(tmp_path, canary_error_rate, steps)
        rigs.append(rig)
        await rig.start()
        return rig

    try:
        yield make
    finally:
        for rig in rigs:
            await rig.close()


async def test_a_good_canary_walks_every_step_to_100_percent_without_a_failed_request(
    rig_factory,
) -> None:
    rig = await rig_factory(0.0, "[10, 50, 100]")
    async with Traffic(rig.url) as traffic:
        status = await rig.wait_phase({"promoted", "rolled_back", "failed"}, timeout=90)
        assert status["phase"] == "promoted", status["reason"]
        await poll_until(
            lambda: traffic.counts["v2"] > 0, timeout=10, what="canary answers through Envoy"
        )
        before = traffic.counts["v1"]
        await poll_until(
            lambda: traffic.counts["v2"] > 200, timeout=20, what="traffic after promotion"
        )
    actions = [d["action"] for d in status["history"]]
    assert actions[0] == "start" and actions.count("advance") == 1 and actions[-1] == "promote"
    steps = [d["step"] for d in status["history"] if d["action"] in ("start", "advance")]
    assert steps == [0, 1], "every step is taken, one at a time, in order"
    assert traffic.failed() == 0, f"weight changes failed requests: {traffic.counts}"
    assert traffic.counts["v1"] - before < 50, "stable still served after the promotion"
    code, listing = await rig.admin("GET", "/rollouts")
    assert code == 200 and listing["rollouts"][0]["phase"] == "promoted"
    assert rig.gateway is not None
    async with (
        aiohttp.ClientSession() as session,
        session.get(rig.gateway.admin.url + "/metrics") as response,
    ):
        metrics = await response.text()
    assert 'inferway_rollout_weight{canary="v2",rollout="v2-rollout"} 100.0' in metrics
    assert 'inferway_rollout_phase{phase="promoted",rollout="v2-rollout"} 1.0' in metrics
    assert 'inferway_rollout_decisions_total{action="promote",rollout="v2-rollout"} 1.0' in metrics


async def test_a_bad_canary_is_rolled_back_after_few_failed_requests(rig_factory) -> None:
    rig = await rig_factory(0.3, "[10, 50, 100]")
    async with Traffic(rig.url) as traffic:
        status = await rig.wait_phase({"promoted", "rolled_back", "failed"}, timeout=60)
        assert status["phase"] == "rolled_back", status["reason"]
        failed_at_rollback = traffic.failed()
        served = traffic.counts["v2"]
        seen = traffic.counts["v1"]
        await poll_until(
            lambda: traffic.counts["v1"] > seen + 300, timeout=20, what="traffic after rollback"
        )
        settled = traffic.failed()  # the push back to 100% stable has reached Envoy
        await poll_until(lambda: traffic.counts["v1"] > seen + 600, timeout=20, what="more traffic")
    assert "error-rate" in status["reason"], status["reason"]
    assert status["step"] == 0, "it never left the first step"
    assert settled < MAX_FAILED_FOR_BAD_CANARY, traffic.counts
    assert traffic.failed() == settled, "failures continued after the rollback took effect"
    assert traffic.counts["v2"] - served < 50, "the canary kept serving after the rollback"
    fail = next(d for d in status["history"] if d["action"] == "rollback")
    verdict = next(v for v in fail["verdicts"] if v["check"] == "error-rate")
    assert verdict["result"] == "fail" and verdict["inputs"]["canary_events"] > 0
    assert failed_at_rollback <= settled


async def test_a_control_plane_restart_resumes_at_the_same_step(rig_factory) -> None:
    rig = await rig_factory(0.0, "[10, {weight: 50, pause: 1h}, 100]")
    async with Traffic(rig.url) as traffic:

        async def at_step_1() -> bool:
            return rig.status()["step"] == 1

        await poll_until(at_step_1, timeout=60, what="the rollout to reach step 1")
        before = rig.status()
        assert rig.gateway is not None
        version = rig.gateway.control_plane.version
        await rig.stop_gateway()
        saved = json.loads((rig.workdir / "rollouts" / "v2-rollout.json").read_text())["state"]
        assert (saved["step"], saved["phase"], saved["weight"]) == (1, "progressing", 5000)

        await rig.start_gateway()
        after = rig.status()
        assert (after["step"], after["phase"], after["weight_percent"]) == (1, "progressing", 50)
        assert after["evidence"]["canary"]["requests"] >= before["evidence"]["canary"]["requests"]
        assert rig.gateway is not None
        assert rig.gateway.control_plane.version == version, "the same weights, the same config"
        acked = await rig.gateway.control_plane.cache.wait_for_acks(
            version, node_ids=[NODE_ID], timeout=20
        )
        assert acked, "Envoy reconnected to the restarted control plane"
        mark = Counter(traffic.counts)
        await poll_until(
            lambda: traffic.counts.total() - mark.total() > 400, timeout=20, what="traffic"
        )
        window = traffic.counts - mark

        # The commands go through the admin API and need its token.
        status, body = await rig.admin("POST", "/rollouts/v2-rollout/promote")
        assert status == 401, body
        token_file = str(rig.workdir / "admin-token")
        admin = rig.gateway.admin.url
        code, out = await _cli(
            "promote", "v2-rollout", "--admin", admin, "--token-file", token_file
        )
        assert code == 0 and "promote: promoted by command" in out, out
        code, out = await _cli("status", "v2-rollout", "--admin", admin, "-o", "json")
        assert code == 0 and json.loads(out)["phase"] == "promoted", out
        code, out = await _cli("resume", "v2-rollout", "--admin", admin, "--token-file", token_file)
        assert code == 1 and "cannot resume while promoted" in out, out
        code, out = await _cli("status", "--admin", admin)
        assert code == 0 and "v2-rollout" in out and "promoted" in out, out
    assert traffic.failed() == 0, traffic.counts
    share = window["v2"] / (window["v1"] + window["v2"])
    assert 0.35 < share < 0.65, f"the resumed 50% split: {window}"
