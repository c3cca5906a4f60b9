"""Zones and silent partitions (issue 32): one control plane, two Envoys on two hosts
(network namespaces) in zones a and b, and two backends per zone, each zone's on a host of its
own. While healthy each Envoy sends >= 95% to its own zone (per-node EDS priorities). Then,
under ~100 req/s, zone a's backends are killed (connections refused), or zone a is cut off
silently (its link down at the switch: no reset, no ICMP): >= 99.9% of the 1,000 requests sent
in the 10 s after the event succeed (at most one fails) and the p99 latency of the requests
sent in the first 2 s after the event stays under 200 ms. The client runs in a process of its
own (tests/paced_load.py), so this process's pauses are not counted as Envoy's; the figures
carry the untouched zone's p99 as the control.

The policy's only partition settings are the documented ones for failover under 200 ms
(docs/fleet.md "Zones and partitions"): a 100 ms hedged per-try timeout and a 100 ms connect
timeout (Envoy starts the per-try timer once a connection is ready, so a connect to a silent
zone waits out the connect timeout first). Everything else is the default: the retry goes to
the next tier (another zone), outlier detection counts the timed-out tries as gateway errors
and ejects the silent replicas, health checks confirm it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from inferway.gateway.runtime import GatewayOptions, start_gateway
from inferway.xds.bootstrap import build_bootstrap
from tests.envoy_process import EnvoyProcess
from tests.helpers import poll_until
from tests.netns import HostFleet, require_netns
from tests.paced_load import parse_output

ZONES = ("a", "b")
HOSTS = ("envoy-a", "envoy-b", "backends-a", "backends-b")
PORTS = {"a": (8011, 8012), "b": (8021, 8022)}
"""Backend ports by zone: the port a backend answers with names its zone."""
RATE = 100.0  # requests per second, both Envoys together
REPO = Path(__file__).resolve().parents[2]


def _policy(fleet: HostFleet) -> str:
    endpoints = ", ".join(
        f'{{address: "{fleet.address(f"backends-{zone}")}:{port}", zone: {zone}, region: r1}}'
        for zone in ZONES
        for port in PORTS[zone]
    )
    return f"""version: 1
listeners:
  - {{name: edge, address: 0.0.0.0, port: 10000}}
services:
  - name: model
    connect_timeout: 100ms
    endpoints: [{endpoints}]
routes:
  - name: infer
    backends: [{{service: model}}]
    retries: {{per_try_timeout: 100ms, hedge: true}}
"""


@dataclass
class Answer:
    envoy: str
    sent: float
    latency: float
    zone: str | None
    """The zone of the backend that answered; None: failed."""


def _zone_of(port: str) -> str:
    return next(zone for zone, ports in PORTS.items() if int(port) in ports)


@contextmanager
def _backends(fleet: HostFleet, zone: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    host = f"backends-{zone}"
    processes = [
        fleet.popen(
            host,
            [
                sys.executable,
                "-m",
                "tests.replica_server",
                "--host",
                fleet.address(host),
                "--port",
                str(port),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in PORTS[zone]
    ]
    try:
        yield processes
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)


async def _load(
    fleet: HostFleet,
    seconds: float,
    answers: list[Answer],
    event: Callable[[], None] | None = None,
    after: float = 1.0,
) -> float:
    """Open loop from a process of its own (tests/paced_load.py: this process's pauses are no
    part of Envoy's latency): one request every 1/RATE s, alternating Envoys, each timed from
    its send. With ``event``, runs it ``after`` s into the load and returns when it ran
    (monotonic, the load's clock too)."""
    urls = [f"http://{fleet.address(f'envoy-{envoy}')}:10000/infer" for envoy in ZONES]
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.paced_load",
        "--rate",
        str(RATE),
        "--seconds",
        str(seconds),
        *urls,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    try:
        first = await asyncio.wait_for(child.stdout.readline(), timeout=30)
        moment = 0.0
        if event is not None:
            begin = float(json.loads(first)["begin"])
            await asyncio.sleep(max(0.0, begin + after - time.monotonic()))
            moment = time.monotonic()
            event()
        rest, _ = await asyncio.wait_for(child.communicate(), timeout=seconds + 30)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0, f"tests.paced_load exited {child.returncode}"
    _, replies = parse_output([first.decode(), rest.decode()])
    for index, sent, latency, status, body in replies:
        zone = _zone_of(json.loads(body)["backend"]) if status == 200 else None
        answers.append(Answer(ZONES[index], sent, latency, zone))
    return moment


async def _backends_ready(fleet: HostFleet, session: aiohttp.ClientSession) -> None:
    """Every backend answers its readiness path (before any Envoy could eject one)."""

    async def ready() -> bool:
        for zone in ZONES:
            for port in PORTS[zone]:
                url = f"http://{fleet.address(f'backends-{zone}')}:{port}/v2/health/ready"
                try:
                    async with session.get(url) as response:
                        if response.status != 200:
                            return False
                except aiohttp.ClientError:
                    return False
        return True

    await poll_until(ready, timeout=20, what="every backend ready", interval=0.1)


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _own_zone_share(answers: list[Answer], envoy: str) -> float:
    mine = [a for a in answers if a.envoy == envoy]
    return sum(a.zone == envoy for a in mine) / len(mine)


@pytest.mark.parametrize("event", ["killed", "cut"])
async def test_each_envoy_prefers_its_zone_and_a_lost_zone_costs_no_request(
    tmp_path: Path, event: str
) -> None:
    require_netns()
    with HostFleet(list(HOSTS)) as fleet, _backends(fleet, "a") as zone_a, _backends(fleet, "b"):
        policy = tmp_path / "policy.yaml"
        policy.write_text(_policy(fleet))
        async with AsyncExitStack() as stack:
            session = await stack.enter_async_context(
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
            )
            await _backends_ready(fleet, session)
            gateway = await start_gateway(
                GatewayOptions(
                    policy_path=policy,
                    host=fleet.gateway_address,
                    xds_port=0,
                    admin_port=0,
                    with_envoy=False,
                    workdir=tmp_path / "cp",
                    stats_push_s=None,
                )
            )
            stack.push_async_callback(gateway.stop)
            for zone in ZONES:
                host = f"envoy-{zone}"
                envoy = EnvoyProcess(
                    build_bootstrap(
                        node_id=host,
                        xds_host=fleet.gateway_address,
                        xds_port=gateway.xds.port,
                        admin_port=9901,
                        admin_address="0.0.0.0",
                        locality={"zone": zone, "region": "r1"},
                    ),
                    prefix=["ip", "netns", "exec", fleet.namespace(host)],
                    admin_host=fleet.address(host),
                )
                await envoy.start(wait="ready", timeout=30)
                stack.callback(envoy.stop)
            groups = {s.node_id: s.group for s in gateway.cache.node_status()}
            assert groups == {"envoy-a": "zone:r1/a", "envoy-b": "zone:r1/b"}, groups

            async def both_answer() -> bool:
                probe: list[Answer] = []
                await _load(fleet, 0.2, probe)
                return all(a.zone is not None for a in probe)

            await poll_until(both_answer, timeout=20, what="both Envoys answering")
            healthy: list[Answer] = []
            await _load(fleet, 3.0, healthy)
            shares = {zone: _own_zone_share(healthy, zone) for zone in ZONES}

            after: list[Answer] = []

            def lose_zone_a() -> None:
                if event == "killed":
                    for process in zone_a:
                        process.kill()
                else:
                    fleet.cut("backends-a")

            moment = await _load(fleet, 11.0, after, event=lose_zone_a, after=1.0 - 0.5 / RATE)

    window = [a for a in after if a.sent >= moment]
    first_2s = [a.latency for a in window if a.sent < moment + 2.0]
    first_2s_a = [a.latency for a in window if a.sent < moment + 2.0 and a.envoy == "a"]
    first_2s_b = [a.latency for a in window if a.sent < moment + 2.0 and a.envoy == "b"]
    success = sum(a.zone is not None for a in window) / len(window)
    served = Counter((a.envoy, a.zone) for a in window if a.sent >= moment + 2.0)
    figures = {
        "event": event,
        "own_zone_share_healthy": shares,
        "requests_after_event": len(window),
        "success_after_event": round(100 * success, 3),
        "p99_first_2s_ms": round(1000 * _p99(first_2s), 1),
        "p99_first_2s_envoy_a_ms": round(1000 * _p99(first_2s_a), 1),
        "p99_first_2s_envoy_b_ms": round(1000 * _p99(first_2s_b), 1),
        "max_first_2s_ms": round(1000 * max(first_2s), 1),
        "over_50ms_first_2s": sum(latency > 0.05 for latency in first_2s),
        "served_after_2s": {f"{e}->{z}": n for (e, z), n in sorted(served.items(), key=str)},
    }
    print(f"zone failover figures: {json.dumps(figures)}")
    assert all(share >= 0.95 for share in shares.values()), figures
    assert success >= 0.999, figures
    assert _p99(first_2s) < 0.200, figures
    assert not served[("a", "a")], figures  # settled: nothing reaches the lost zone
