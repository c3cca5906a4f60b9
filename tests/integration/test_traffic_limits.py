"""Local rate limiting and circuit breakers through a real Envoy."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.traffic_harness import ControlledBackend, TrafficGateway, share

pytestmark = pytest.mark.integration

RATE_LIMITED = """
listeners: [{{name: edge, port: {listener_port}}}]
services:
  - name: model
    endpoints: ["127.0.0.1:{m}"]
routes:
  - name: limited
    match: {{path: {{prefix: /limited}}}}
    backends: [{{service: model}}]
    rate_limit: {{requests_per_second: 20}}
  - name: free
    backends: [{{service: model}}]
"""


async def test_rate_limit_answers_429_beyond_the_configured_rate() -> None:
    async with TrafficGateway(RATE_LIMITED, [ControlledBackend("m")]) as gw:
        started = time.monotonic()
        results = await gw.load(duration=2.0, rate=100, concurrency=4, path="/limited/x")
        elapsed = time.monotonic() - started
        free = await gw.send(100, path="/free")
    allowed = sum(r.status == 200 for r in results)
    limited = [r for r in results if r.status == 429]
    assert allowed + len(limited) == len(results) > 150, share(results)
    # A full bucket (20) plus 20 per second; refills are whole seconds, so allow one extra.
    assert 20 + 20 * int(elapsed) - 5 <= allowed <= 20 + 20 * (int(elapsed) + 1), allowed
    rejected = limited[0]
    assert json.loads(rejected.body) == {
        "error": "rate limited: route limited is over its request rate, retry later"
    }
    assert rejected.headers.get("x-inferway-rate-limited") == "true"
    assert rejected.headers.get("x-ratelimit-limit", "").startswith("20")
    assert all(r.status == 200 for r in free), "the other route must not be limited"


BREAKER = """
listeners: [{{name: edge, port: {listener_port}}}]
services:
  - name: model
    circuit_breakers: {{max_connections: 2, max_pending_requests: 2, max_requests: 2}}
    endpoints: ["127.0.0.1:{slow}"]
routes: [{{name: all, backends: [{{service: model}}]}}]
"""


async def test_circuit_breaker_overflow_fails_fast_and_is_counted() -> None:
    slow = ControlledBackend("slow")
    async with TrafficGateway(BREAKER, [slow]) as gw:
        slow.delay = 0.5
        started = time.monotonic()
        results = await asyncio.gather(*(gw.get("/") for _ in range(20)))
        elapsed = time.monotonic() - started
        stats = await gw.stats(r"cluster\.model\.upstream_rq_(pending|active)_overflow")
    overflowed = [r for r in results if r.status == 503]
    assert overflowed and sum(r.status == 200 for r in results) >= 2, share(results)
    assert all(r.headers.get("x-envoy-overloaded") == "true" for r in overflowed)
    # Over max_requests or max_pending_requests, depending on when the pool had connections.
    assert sum(stats.values()) == len(overflowed), stats
    assert max(slow.active, 0) == 0 and elapsed < 5.0
