"""Autoscaling on the replicas' own queue, over real processes: the gateway's composition root
with a real Envoy, replicas that are real ``inferway serve`` backends whose batcher holds each
request 0.2 s (capacity made small on purpose, without burning CPU), and the issue's rule form
on ``queue_length``. Closed-loop load builds a queue in the backends; the driver reads it from
their /metrics, scales out to the maximum, and back in once the load stops, with no failed
request; each replica's /metrics also carries its ORCA busy fraction (``utilization``)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from inferway.devtools.demo_models import build_mlp
from inferway.gateway.backend_scrape import scrape_backends
from inferway.gateway.runtime import Gateway
from tests.envoy_process import free_port
from tests.gateway_process import replica_counts, running_gateway
from tests.helpers import poll_until

pytestmark = pytest.mark.integration

POLICY = """
listeners: [{{name: edge, port: {listener}}}]
services:
  - name: model
    health_check: {{interval: 250ms}}
    replicas:
      command: >-
        {python} -m inferway.cli.main serve --model-repository {repo}
        --http-port {{port}} --grpc-port {{grpc_port}}
      min: 1
      max: 3
      ready_timeout: 90s
      drain_timeout: 10s
      stop_grace: 10s
    autoscale:
      scaling_policy: {rule}
      sampling_interval: 0.5
      min_size: 1
      max_size: 3
routes:
  - name: all
    backends: [{{service: model}}]
"""
QUEUE_RULE = (
    "{metric_type: queue_length, threshold: 3, scale_in_threshold: 1, action: add_instance,"
    " cooldown: 1}"
)
WAIT_RULE = (  # above the batcher's 0.2 s hold: only a shortage makes requests wait longer
    "{metric_type: queue_wait, threshold: 0.4, scale_in_threshold: 0.01, action: add_instance,"
    " cooldown: 1}"
)
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[Gateway, int]]:
    async with _gateway(tmp_path, QUEUE_RULE) as running:
        yield running


@pytest.fixture
async def wait_gateway(tmp_path: Path) -> AsyncIterator[tuple[Gateway, int]]:
    async with _gateway(tmp_path, WAIT_RULE) as running:
        yield running


@contextlib.asynccontextmanager
async def _gateway(tmp_path: Path, rule: str) -> AsyncIterator[tuple[Gateway, int]]:
    repo = tmp_path / "models"
    build_mlp(repo / "mlp" / "1" / "model.onnx", (8, 16, 4), seed=0)
    (repo / "mlp" / "config.yaml").write_text(
        "batching: {mode: fixed, max_batch_size: 64, max_queue_delay_s: 0.2}\nintra_op_threads: 1\n"
    )
    listener = free_port()
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(listener=listener, python=sys.executable, repo=repo, rule=rule))
    async with running_gateway(path, tmp_path) as gw:
        yield gw, listener


async def _routed(session: aiohttp.ClientSession, url: str) -> None:
    """Until Envoy answers a request 200: the gateway counts a replica ready once it answers
    its readiness probe, and Envoy has it only once the endpoint update reaches it."""

    async def answered() -> bool:
        async with session.post(url, json=BODY) as response:
            await response.read()
            return response.status == 200

    await poll_until(answered, timeout=20, what="a 200 through Envoy")


async def test_a_queue_in_the_backends_scales_out_then_in_without_a_failed_request(
    gateway: tuple[Gateway, int],
) -> None:
    gw, listener = gateway
    assert gw.autoscale is not None and gw.replicas is not None
    seen: list[dict[str, Any]] = []
    gw.autoscale.on_decision.append(seen.append)
    await poll_until(lambda: replica_counts(gw) == (1, 1), timeout=90, what="one ready replica")

    failures: list[str] = []
    answered = 0
    loading = True
    began = time.monotonic()
    url = f"http://127.0.0.1:{listener}/v2/models/mlp/infer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        await _routed(session, url)

        async def user() -> None:  # a closed loop: at most one request in flight each
            nonlocal answered
            while loading:
                try:
                    async with session.post(url, json=BODY) as response:
                        if response.status != 200:
                            failures.append(
                                f"{response.status} {await response.text()} at "
                                f"{time.monotonic() - began:.2f} s, replicas (desired, ready) "
                                f"{replica_counts(gw)}"
                            )
                        else:
                            answered += 1
                except aiohttp.ClientError as exc:
                    failures.append(repr(exc))

        users = [asyncio.create_task(user()) for _ in range(8)]
        try:
            await poll_until(
                lambda: replica_counts(gw) == (3, 3), timeout=120, what="scale out to 3"
            )
            ready = gw.replicas.endpoints()["model"]
            urls = [f"http://{e.host}:{e.port}" for e in ready]
            scrapes = []
            for _ in range(10):  # one instant can fall between batches on every replica
                scrapes.append(await scrape_backends(session, urls))
                await asyncio.sleep(0.1)  # (the autoscaler may already drain one meanwhile)
        finally:
            loading = False
            await asyncio.gather(*users)
    await poll_until(lambda: replica_counts(gw) == (1, 1), timeout=60, what="scale in to 1")

    assert failures == [] and answered > 0
    first = scrapes[0]  # taken as the third replica turned ready: all three answer
    assert first.failures == {} and len(first.totals) == 3
    assert all(t.utilization is not None for t in first.totals.values())
    queued = [sum(t.queue_depth for t in scrape.totals.values()) for scrape in scrapes]
    assert max(queued) > 0, queued  # the queue the rule scaled on, in the backends' metrics
    up = next(d for d in seen if d["direction"] == "up")
    assert up["metric"] == "queue_length" and up["inputs"]["queue_length"] > 3, up
    down = next(d for d in seen if d["direction"] == "down")
    assert seen.index(down) > seen.index(up) and down["inputs"]["queue_length"] < 1
    (service,) = gw.autoscale.status_json()["services"]
    assert service["error"] is None


async def test_a_queue_wait_rule_holds_while_the_batcher_only_delays(
    wait_gateway: tuple[Gateway, int],
) -> None:
    """Issue 33 item 11: the same load keeps several requests queued in the batcher (the
    queue_length rule above scales to 3 on it) but each waits no longer than the batcher's
    0.2 s hold: a rule on the mean wait above that hold never scales out, and its decisions
    show the queue that would have."""
    gw, listener = wait_gateway
    assert gw.autoscale is not None
    seen: list[dict[str, Any]] = []
    gw.autoscale.on_decision.append(seen.append)
    await poll_until(lambda: replica_counts(gw) == (1, 1), timeout=90, what="one ready replica")

    failures: list[str] = []
    loading = True
    url = f"http://127.0.0.1:{listener}/v2/models/mlp/infer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        await _routed(session, url)

        async def user() -> None:
            while loading:
                try:
                    async with session.post(url, json=BODY) as response:
                        if response.status != 200:
                            failures.append(f"{response.status} {await response.text()}")
                except aiohttp.ClientError as exc:
                    failures.append(repr(exc))

        users = [asyncio.create_task(user()) for _ in range(8)]
        try:
            await asyncio.sleep(1.0)  # the load settles
            start = len(seen)
            (ready,) = gw.replicas.endpoints()["model"] if gw.replicas else ()
            queued = 0.0
            for _ in range(10):  # what the queue_length rule reads: above its threshold of 3
                scrape = await scrape_backends(session, [f"http://{ready.host}:{ready.port}"])
                queued = max(queued, *(t.queue_depth for t in scrape.totals.values()))
                await asyncio.sleep(0.1)
            await poll_until(lambda: len(seen) >= start + 10, timeout=30, what="10 decisions")
        finally:
            loading = False
            await asyncio.gather(*users)

    assert failures == []
    loaded = [d for d in seen[start:] if d["inputs"]["queue_wait"] is not None]
    assert len(loaded) >= 5, seen[start:]
    assert all(d["desired"] == 1 for d in seen), [(d["inputs"], d["desired"]) for d in seen]
    waits = [d["inputs"]["queue_wait"] for d in loaded]
    assert all(w < 0.4 for w in waits) and max(waits) > 0.1, waits  # the batcher's hold
    assert queued > 3
