"""Multilevel load balancing through a real Envoy: zone and endpoint weights, and the
policies that steer traffic away from a slow or loaded replica."""

from __future__ import annotations

import math

import pytest

from tests.traffic_harness import ControlledBackend, TrafficGateway, share

pytestmark = pytest.mark.integration


def _bounds(n: int, p: float, sigmas: float = 4.5) -> tuple[float, float]:
    spread = sigmas * math.sqrt(n * p * (1 - p))
    return n * p - spread, n * p + spread


ZONES = """
listeners: [{{name: edge, port: {listener_port}}}]
services:
  - name: model
    load_balancing: {{zones: {{zone-a: 80, zone-b: 20}}}}
    endpoints:
      - {{address: "127.0.0.1:{a1}", zone: zone-a, weight: 3}}
      - {{address: "127.0.0.1:{a2}", zone: zone-a, weight: 1}}
      - {{address: "127.0.0.1:{b1}", zone: zone-b, weight: 5}}
routes: [{{name: all, backends: [{{service: model}}]}}]
"""


async def test_zone_weights_80_20_and_endpoint_weights_within_a_zone() -> None:
    backends = [ControlledBackend(n) for n in ("a1", "a2", "b1")]
    async with TrafficGateway(ZONES, backends) as gw:
        results = await gw.send(2000)
    counts = share(results)
    n = sum(counts.values())
    assert n == 2000 and counts["a1"] + counts["a2"] + counts["b1"] == n, counts
    # zone-b's 20 overrides its endpoint sum (5); inside zone-a the weights are 3:1.
    for name, p in (("a1", 0.6), ("a2", 0.2), ("b1", 0.2)):
        low, high = _bounds(n, p)
        assert low <= counts[name] <= high, f"{name}: {counts[name]} not in {low:.0f}..{high:.0f}"


SLOW = """
listeners: [{{name: edge, port: {listener_port}}}]
services:
  - name: model
    load_balancing: {{policy: {policy}}}
    endpoints: ["127.0.0.1:{fast}", "127.0.0.1:{slow}"]
routes: [{{name: all, backends: [{{service: model}}]}}]
"""


async def test_least_request_sends_less_to_a_slow_replica() -> None:
    fast, slow = ControlledBackend("fast"), ControlledBackend("slow")
    slow.delay = 0.1
    # Envoy samples choice_count replicas with replacement: with 2 replicas and the default
    # 2 choices, both samples are the slow one a quarter of the time. 4 choices: 1/16.
    template = SLOW.replace("{policy}", "least_request, choice_count: 4")
    async with TrafficGateway(template, [fast, slow]) as gw:
        counts = share(await gw.send(600, concurrency=16))
    assert counts["fast"] + counts["slow"] == 600, counts
    # Round robin would give the slow replica half; least_request compares active requests.
    assert counts["slow"] < 0.2 * 600, counts


LOAD_AWARE = """
listeners: [{{name: edge, port: {listener_port}}}]
services:
  - name: model
    load_balancing:
      policy: load_aware
      load_aware: {{blackout_period: 0s, weight_update_period: 100ms}}
    endpoints: ["127.0.0.1:{idle}", "127.0.0.1:{busy}"]
routes: [{{name: all, backends: [{{service: model}}]}}]
"""


async def test_load_aware_follows_orca_reports_and_hides_them_from_clients() -> None:
    idle, busy = ControlledBackend("idle"), ControlledBackend("busy")
    idle.utilization, busy.utilization = 0.1, 0.9  # weights 100/0.1 vs 100/0.9: 9 to 1
    async with TrafficGateway(LOAD_AWARE, [idle, busy]) as gw:
        warmup = await gw.load(duration=0.6, rate=200)  # reports flow, weights get computed
        results = await gw.send(1000, concurrency=8)
    assert all(r.status == 200 for r in warmup + results)
    assert not any(k.lower() == "endpoint-load-metrics" for r in results for k in r.headers)
    counts = share(results)
    assert counts["busy"] < 0.25 * 1000, counts  # round robin would give it half


AFFINITY = """
listeners: [{{name: edge, port: {listener_port}}}]
services:
  - name: model
    load_balancing: {{policy: ring_hash, hash_on: {{header: x-session-id}}}}
    endpoints: ["127.0.0.1:{s1}", "127.0.0.1:{s2}", "127.0.0.1:{s3}"]
routes: [{{name: all, backends: [{{service: model}}]}}]
"""


async def test_ring_hash_keeps_a_session_on_one_replica() -> None:
    backends = [ControlledBackend(n) for n in ("s1", "s2", "s3")]
    async with TrafficGateway(AFFINITY, backends) as gw:
        placement: dict[str, set[str | None]] = {}
        for session in range(30):
            for _ in range(5):
                result = await gw.get("/", headers={"x-session-id": f"user-{session}"})
                assert result.status == 200
                placement.setdefault(f"user-{session}", set()).add(result.backend)
    assert all(len(replicas) == 1 for replicas in placement.values()), placement
    used = set().union(*placement.values())
    assert len(used) >= 2, "30 sessions should spread over the replicas"
