"""The replica manager with real processes, a real Envoy and the real control plane: replicas
join the endpoints only once ready, leave make-before-break under load without a failed
request, crashed ones come back after a backoff, and one that never becomes ready is
reported, not counted, and given up on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from inferway.devtools.demo_models import write_demo_repository
from inferway.gateway.actuators.replica_plan import ReplicaState, ServiceReplicasStatus
from inferway.gateway.actuators.replicas import ReplicaManager
from tests.traffic_harness import Result, TrafficGateway, poll_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

POLICY = """
listeners: [{name: edge, port: @LISTENER@}]
services:
  - name: model
    health_check: {interval: 250ms}
    replicas:
      command: @COMMAND@
      min: 1
      max: 3
      devices: ["0", "1", "2"]
      ready_timeout: @READY@
      drain_timeout: 10s
      stop_grace: 5s
      backoff: {initial: @BACKOFF@, max: 400ms, give_up_after: 3}
routes:
  - name: all
    backends: [{service: model}]
"""


def _template(
    args: str = "",
    *,
    ready_timeout: str = "20s",
    backoff: str = "300ms",
    command: str | None = None,
) -> str:
    """The policy as a TrafficGateway template (braces escaped, but {listener_port})."""
    if command is None:
        server = ROOT / "tests" / "replica_server.py"
        command = f"{sys.executable} {server} --port {{port}} {args}".strip()
    text = (
        POLICY.replace("@COMMAND@", command)
        .replace("@READY@", ready_timeout)
        .replace("@BACKOFF@", backoff)
    )
    return text.replace("{", "{{").replace("}", "}}").replace("@LISTENER@", "{listener_port}")


@asynccontextmanager
async def managed(
    template: str, tmp_path: Path
) -> AsyncIterator[tuple[TrafficGateway, ReplicaManager]]:
    """The replica manager the composition root attached (start_gateway does, for a policy
    with ``replicas:``); the gateway's stop drains and stops its replicas."""
    async with TrafficGateway(template, []) as gw:
        assert gw.envoy is not None and gw.gateway is not None
        manager = gw.gateway.replicas
        assert manager is not None
        yield gw, manager


def _model(manager: ReplicaManager) -> ServiceReplicasStatus:
    (status,) = manager.status()
    return status


async def _steady_load(gw: TrafficGateway, results: list[Result], stop: asyncio.Event) -> None:
    """Bounded load: 6 clients, each pausing 20 ms between requests."""

    async def client() -> None:
        while not stop.is_set():
            results.append(await gw.get("/"))
            await asyncio.sleep(0.02)

    await asyncio.gather(*(client() for _ in range(6)))


def _ports_seen(results: list[Result]) -> set[int]:
    return {int(r.backend) for r in results if r.status == 200 and r.backend}


async def test_scale_out_and_in_under_load_fails_no_request(tmp_path: Path) -> None:
    async with managed(_template("--delay 0.03"), tmp_path) as (gw, manager):
        await poll_until(lambda: _model(manager).ready == 1, timeout=20, what="first replica")
        first = await poll_until(
            lambda: _answered(gw), timeout=15, what="traffic through Envoy to the first replica"
        )
        results: list[Result] = []
        stop = asyncio.Event()
        load = asyncio.create_task(_steady_load(gw, results, stop))
        try:
            assert manager.scale_to("model", 3, reason="test: scale out") == 3
            await poll_until(lambda: _model(manager).ready == 3, timeout=30, what="3 ready")
            ready_ports = {r.port for r in _model(manager).replicas}
            await poll_until(
                lambda: _ports_seen(results) >= ready_ports, timeout=15, what="traffic to all 3"
            )
            assert manager.scale_to("model", 1, reason="test: scale in") == 1
            await poll_until(
                lambda: len(_model(manager).replicas) == 1, timeout=30, what="two stopped"
            )
            served = len(results)
            await poll_until(lambda: len(results) > served + 50, timeout=15, what="more load")
        finally:
            stop.set()
            await load
        (kept,) = _model(manager).replicas
        assert kept.port == first and kept.state is ReplicaState.READY
        failed = [r for r in results if r.status != 200]
        assert not failed, f"{len(failed)} of {len(results)} requests failed: {failed[:3]}"
        devices = {r.backend: r.body for r in results if r.status == 200}
        assert len({_device(body) for body in devices.values()}) == 3, devices
        kinds = [(e.kind, e.index) for e in manager.events]
        stopped = [e for e in manager.events if e.kind == "stopped"]
        assert [e.kind for e in manager.events].count("drained") == 2, kinds
        assert "drain_timeout" not in [k for k, _ in kinds]
        assert len(stopped) == 2 and all(not e.detail["killed"] for e in stopped)


async def _answered(gw: TrafficGateway) -> int | None:
    """The port of the replica that answered one request through Envoy (None: no 200)."""
    result = await gw.get("/")
    return int(result.backend) if result.status == 200 and result.backend else None


def _device(body: str) -> str:
    return str(json.loads(body)["device"])


async def test_a_crashed_replica_leaves_the_endpoints_and_restarts_after_backoff(
    tmp_path: Path,
) -> None:
    async with managed(_template(backoff="300ms"), tmp_path) as (gw, manager):
        await poll_until(lambda: _model(manager).ready == 1, timeout=20, what="ready replica")
        (before,) = _model(manager).replicas
        assert before.pid is not None and before.restarts == 0
        await poll_until(lambda: _answered(gw), timeout=15, what="traffic to the replica")

        os.kill(before.pid, signal.SIGKILL)
        await poll_until(
            lambda: gw.control_plane.state.replicas.get("model") == (),
            timeout=5,
            what="the crashed replica out of State",
        )
        down = _model(manager).replicas[0]
        assert down.state in (ReplicaState.WAITING, ReplicaState.STARTING)
        assert down.last_error is not None and "exited (-9)" in down.last_error

        await poll_until(lambda: _model(manager).ready == 1, timeout=20, what="restarted")
        (after,) = _model(manager).replicas
        assert after.restarts == 1 and after.pid not in (None, before.pid)
        answer = await poll_until(
            lambda: _answered_port(gw, after.port), timeout=15, what="traffic to the restart"
        )
        assert answer
        crashed = [e for e in manager.events if e.kind == "crashed"]
        backoffs = [e.detail["seconds"] for e in manager.events if e.kind == "backoff"]
        assert len(crashed) == 1 and backoffs == [0.3]


async def _answered_port(gw: TrafficGateway, port: int | None) -> bool:
    return await _answered(gw) == port


async def test_a_replica_that_never_becomes_ready_is_reported_not_counted_and_given_up(
    tmp_path: Path,
) -> None:
    template = _template("--never-ready", ready_timeout="500ms", backoff="100ms")
    async with managed(template, tmp_path) as (gw, manager):
        await poll_until(
            lambda: _model(manager).replicas[0].state is ReplicaState.FAILED,
            timeout=30,
            what="the replica given up on",
        )
        status = _model(manager)
        (replica,) = status.replicas
        assert status.ready == 0 and status.desired == 1
        assert replica.pid is None and replica.failures == 3
        assert replica.last_error is not None and "not ready after 0.5s" in replica.last_error
        assert gw.control_plane.state.replicas.get("model", ()) == ()
        assert (await gw.get("/")).status == 503  # no capacity was ever published
        kinds = [e.kind for e in manager.events]
        assert kinds.count("started") == 3 and kinds.count("never_ready") == 3
        assert kinds[-1] == "gave_up"
        assert [e.detail["seconds"] for e in manager.events if e.kind == "backoff"] == [0.1, 0.2]
        pids = [int(str(e.detail["pid"])) for e in manager.events if e.kind == "started"]
        for pid in pids:  # every attempt was stopped, none left running
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        snapshot = manager.status_json()
        assert snapshot["services"][0]["replicas"][0]["state"] == "failed"  # type: ignore[index]


async def test_inferway_serve_replicas_serve_the_model_and_stop_gracefully(tmp_path: Path) -> None:
    """The example policy's command shape: ``inferway serve`` with {port} and {grpc_port}."""
    write_demo_repository(tmp_path / "models")
    command = (
        f"{sys.executable} -m inferway.cli.main serve --model-repository "
        f"{tmp_path / 'models'} --http-port {{port}} --grpc-port {{grpc_port}}"
    )
    async with managed(_template(command=command, ready_timeout="60s"), tmp_path) as (gw, manager):
        assert manager.scale_to("model", 2) == 2
        await poll_until(lambda: _model(manager).ready == 2, timeout=90, what="2 backends ready")
        grpc_ports = {r.grpc_port for r in _model(manager).replicas}
        assert len(grpc_ports) == 2 and None not in grpc_ports

        async def model_ready() -> bool:
            return (await gw.get("/v2/models/demo/ready")).status == 200

        await poll_until(model_ready, timeout=15, what="the model through Envoy")
        assert manager.scale_to("model", 1) == 1
        await poll_until(lambda: len(_model(manager).replicas) == 1, timeout=30, what="scaled in")
        (stopped,) = [e for e in manager.events if e.kind == "stopped"]
        assert stopped.detail["code"] == 0 and not stopped.detail["killed"]
        assert (await gw.get("/v2/models/demo/ready")).status == 200
