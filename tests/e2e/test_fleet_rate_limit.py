"""A fleet-wide rate limit holds for the sum over the Envoys: one control-plane replica (a
``file:`` store: it leads), three Envoys on three hosts (network namespaces, each on its own
port 10000), uneven paced load through them (30, 12 and 4 req/s: 46 offered) on a route with
``rate_limit: {requests_per_second: 20, scope: fleet}``. Once the leader has split the limit by
the Envoys' reported load, the fleet admits 20 req/s within 10% over 30 s, and ``status``
shows the split; a per-Envoy limit served by several Envoys is a warning there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
from aiohttp import web

from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.xds.bootstrap import build_bootstrap
from tests.envoy_process import EnvoyProcess, free_port
from tests.netns import HostFleet, require_netns

LOAD = {"zone-a": 30.0, "zone-b": 12.0, "zone-c": 4.0}
LIMIT = 20
MEASURE_S = 30.0


def _policy(host: str, port: int) -> str:
    return f"""version: 1
listeners:
  - {{name: edge, address: 0.0.0.0, port: 10000}}
services:
  - {{name: model, endpoints: ["{host}:{port}"]}}
routes:
  - name: chat
    match: {{path: {{prefix: /chat}}}}
    backends: [{{service: model}}]
    rate_limit: {{requests_per_second: {LIMIT}, scope: fleet}}
  - name: embed
    match: {{path: {{prefix: /embed}}}}
    backends: [{{service: model}}]
    rate_limit: {{requests_per_second: 50}}
"""


async def _backend(host: str) -> AsyncIterator[int]:
    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, host, port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


async def _paced(
    client: httpx.AsyncClient, url: str, rate: float, answers: list[tuple[float, int]]
) -> None:
    """``rate`` requests per second to ``url`` until cancelled; (time, status) of each answer
    into ``answers``."""

    async def one() -> None:
        with contextlib.suppress(httpx.HTTPError):
            status = (await client.get(url)).status_code
            answers.append((time.monotonic(), status))

    start, tasks, i = time.monotonic(), set(), 0
    try:
        while True:
            await asyncio.sleep(max(start + i / rate - time.monotonic(), 0))
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
    finally:
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_fleet_wide_limit_holds_for_the_sum_over_three_envoys(tmp_path: Path) -> None:
    require_netns()
    with HostFleet(list(LOAD)) as hosts:
        async with AsyncExitStack() as stack:
            gen = _backend(hosts.gateway_address)
            port = await gen.__anext__()
            stack.push_async_callback(gen.aclose)
            policy = tmp_path / "policy.yaml"
            policy.write_text(_policy(hosts.gateway_address, port))
            gateway: Gateway = await start_gateway(
                GatewayOptions(
                    policy_path=policy,
                    host=hosts.gateway_address,
                    xds_port=0,
                    admin_port=0,
                    with_envoy=False,
                    workdir=tmp_path / "cp",
                    store=f"file:{tmp_path / 'store'}",
                    replica_id="cp",
                    stats_push_s=0.5,
                )
            )
            stack.push_async_callback(gateway.stop)
            for host in LOAD:
                envoy = EnvoyProcess(
                    build_bootstrap(
                        node_id=f"envoy-{host}",
                        xds_host=hosts.gateway_address,
                        xds_port=gateway.xds.port,
                        admin_port=9901,
                        admin_address="0.0.0.0",
                        stats_push_s=0.5,
                    ),
                    prefix=["ip", "netns", "exec", hosts.namespace(host)],
                    admin_host=hosts.address(host),
                )
                await envoy.start(wait="ready", timeout=30)
                stack.callback(envoy.stop)
            assert gateway.fleet is not None and gateway.fleet.limits is not None
            limits = gateway.fleet.limits

            answers: dict[str, list[tuple[float, int]]] = {h: [] for h in LOAD}
            async with httpx.AsyncClient(
                timeout=5, limits=httpx.Limits(max_connections=200)
            ) as client:
                runs = [
                    asyncio.create_task(
                        _paced(client, f"http://{hosts.address(h)}:10000/chat", r, answers[h])
                    )
                    for h, r in LOAD.items()
                ]
                try:
                    # the leader sees every Envoy's offered load and splits the limit; the
                    # split reaches the Envoys and settles
                    deadline = time.monotonic() + 40
                    while True:
                        split = limits.splits().get("chat", {})
                        rates = [limits._rates.get(("chat", n)) for n in split]
                        if len(split) == 3 and all(r is not None for r in rates):
                            break
                        assert time.monotonic() < deadline, f"no split of every Envoy: {split}"
                        await asyncio.sleep(0.2)
                    await asyncio.sleep(12)  # a full rate window on the steady load
                    writes, start = limits.writes, time.monotonic()
                    await asyncio.sleep(MEASURE_S)
                    end = time.monotonic()
                finally:
                    for run in runs:
                        run.cancel()
                    await asyncio.gather(*runs, return_exceptions=True)

                def count(host: str, status: int) -> int:
                    return sum(1 for t, s in answers[host] if start <= t < end and s == status)

                admitted = {h: count(h, 200) for h in LOAD}
                refused = {h: count(h, 429) for h in LOAD}
                others = [s for h in LOAD for t, s in answers[h] if s not in (200, 429)]
                rate = sum(admitted.values()) / MEASURE_S
                print(
                    f"admitted {rate:.2f} req/s of {LIMIT}: {admitted}, refused {refused}, "
                    f"split {limits.splits()['chat']}, {limits.writes - writes} re-splits, "
                    f"rates {limits._rates}"
                )
                assert not others, others
                assert abs(rate - LIMIT) <= 0.10 * LIMIT, (rate, admitted, limits.splits())
                # max-min fair: the light Envoy admits all it is offered, the heavy ones split
                # the rest evenly
                assert refused["zone-c"] <= 0.05 * admitted["zone-c"], (admitted, refused)
                assert abs(admitted["zone-a"] - admitted["zone-b"]) <= 0.15 * admitted["zone-a"]

                status = (await client.get(f"{gateway.admin.url}/status")).json()
                fleet = status["fleet"]
                assert fleet["rate_limit_splits"]["chat"] == limits.splits()["chat"]
                # the light Envoys' headroom comes on top of what the heavy ones split
                assert sum(fleet["rate_limit_splits"]["chat"].values()) >= LIMIT
                (warning,) = fleet["warnings"]
                assert warning.startswith("route embed: rate_limit holds per Envoy"), warning
                assert status["warnings"] == [warning]  # from the connected Envoys, store or not
