"""``picker: {transport: http}`` (the default) for real: real Envoy asks the gateway's picker
over ext_authz's HTTP service and reports each request's end over its gRPC access log.
Requests sharing a prefix
go to one replica (Envoy honours every pick: each replica served exactly what the picker
picked for it); every pick is ended by the access log, a request the client abandons too; with
the picker's HTTP lane down, ``fail: open`` answers every request with the service's own
balancing and ``fail: closed`` answers 503, none hangs; a sidecar picker process serves the
lane as well."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import httpx
import pytest

from inferway.gateway.picker.server import PoolPicker
from inferway.xds.translate.picker import DESTINATION_HEADER, TICKET_HEADER
from tests.envoy_process import free_port
from tests.picker_chat import chat, picker_policy
from tests.traffic_harness import ControlledBackend, TrafficGateway, poll_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


def _policy(process: str = "gateway", fail: str = "open", timeout: str = "2s") -> str:
    return _policy_for(free_port(), free_port(), process, fail, timeout)


def _policy_for(port: int, http_port: int, process: str, fail: str, timeout: str = "2s") -> str:
    return picker_policy(
        f"      listen: 127.0.0.1:{port}\n"
        f"      http_listen: 127.0.0.1:{http_port}\n      process: {process}\n"
        f"      metrics_path: null\n      timeout: {timeout}\n      fail: {fail}\n"
    )


def _pool(gw: TrafficGateway) -> PoolPicker:
    assert gw.gateway is not None and gw.gateway.pickers is not None
    pool = gw.gateway.pickers.pool("llm")
    assert pool is not None
    return pool


async def _idle(gw: TrafficGateway, picks: int) -> None:
    """Wait until the picker made ``picks`` picks and every one was ended by the access log."""
    pool = _pool(gw)

    async def ended() -> bool:
        stats = pool.picker.stats().values()
        made = sum(s["picks"] or 0 for s in stats)
        return made >= picks and sum(s["in_flight"] or 0 for s in stats) == 0

    await poll_until(ended, timeout=5, what=f"{picks} picks, all ended by the access log")


async def test_http_lane_picks_are_honoured_and_ended_by_the_access_log() -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    async with TrafficGateway(_policy(), backends) as gw:
        assert gw.gateway is not None and gw.gateway.pickers is not None
        (lane,) = gw.gateway.pickers.pools.http_servers.values()

        async def picked() -> bool:
            status, _ = await chat(gw, "warm-up", "hello")
            return status == 200

        await poll_until(picked, timeout=15, what="a 200 through the HTTP lane's picks")
        before = {b.name: len(b.hits) for b in backends}
        asked = lane.requests
        served: Counter[str | None] = Counter()
        for i in range(8):  # one at a time: never saturated
            status, backend = await chat(gw, "acme", f"question {i}")
            assert status == 200
            served[backend] += 1
        assert len(served) == 1, served  # the prefix holder, every time
        assert lane.requests - asked == 8
        # Envoy honoured the picks: the holder got all 8, and the request it got carried the
        # picker's destination (the holder first) and ticket headers
        (holder,) = served
        assert holder is not None
        assert {b.name: len(b.hits) - before[b.name] for b in backends if b.name != holder} == {
            b.name: 0 for b in backends if b.name != holder
        }
        seen = next(b for b in backends if b.name == holder).seen[-1]
        assert seen[DESTINATION_HEADER].split(",")[0] == f"127.0.0.1:{gw.backends[holder].port}"
        assert len(seen[DESTINATION_HEADER].split(",")) == 3  # winner + 2 ordered fallbacks
        assert seen[TICKET_HEADER].startswith("llm.")
        await _idle(gw, picks=9)
        (server,) = gw.gateway.pickers.servers.values()
        assert server.finished >= 9

        # a route to another service does not ask the picker (the filter is off there)
        assert gw.session is not None
        async with gw.session.get(f"{gw.url}/other/x") as response:
            assert response.status == 200
        assert lane.requests - asked == 8

        # a request the client abandons (reset downstream) is logged too: its pick ends
        holder_backend = next(b for b in backends if b.name == holder)
        holder_backend.delay = 3.0
        with pytest.raises(TimeoutError):
            await chat(gw, "acme", "abandoned", timeout=0.5)
        await _idle(gw, picks=10)
        holder_backend.delay = 0.0


@pytest.mark.parametrize("fail", ["open", "closed"])
async def test_http_lane_down_fails_as_the_policy_says(fail: str) -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    async with TrafficGateway(_policy(fail=fail), backends) as gw:
        assert gw.gateway is not None and gw.gateway.pickers is not None

        async def picked() -> bool:
            status, _ = await chat(gw, "warm-up", "hello")
            return status == 200

        await poll_until(picked, timeout=15, what="a 200 through the HTTP lane's picks")
        for lane in gw.gateway.pickers.pools.http_servers.values():
            await lane.stop()  # the lane's port refuses connections: ext_authz errors
        statuses: Counter[int] = Counter()
        served: Counter[str | None] = Counter()
        for i in range(9):
            status, backend = await chat(gw, "acme", f"while down {i}", timeout=5)
            statuses[status] += 1
            served[backend] += 1
        if fail == "open":  # every request answered, by the service's own round robin
            assert statuses == {200: 9} and len(served) == 3, (statuses, served)
        else:
            assert statuses == {503: 9}, statuses


@pytest.mark.parametrize(("fail", "expected"), [("open", 200), ("closed", 503)])
async def test_a_hung_picker_costs_its_timeout_and_no_more(fail: str, expected: int) -> None:
    """The sidecar stopped (SIGSTOP: its sockets still accept, nothing answers, as in a long
    pause or a deadlock): each request waits the picker's ``timeout`` and then gets the
    service's own balancing (open) or a 503 (closed), none hangs; continued, it picks again
    (stopped past the supervisor's ``hung_after``, it would be killed and restarted:
    tests/unit/test_picker_sidecar.py)."""
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    async with TrafficGateway(_policy("sidecar", fail, timeout="300ms"), backends) as gw:
        assert gw.gateway is not None and gw.gateway.pickers is not None
        (sidecar,) = gw.gateway.pickers.sidecars.values()
        assert await sidecar.wait_serving(20) and sidecar.pid is not None

        async def picked() -> bool:
            status, _ = await chat(gw, "warm-up", "hello")
            return status == 200

        await poll_until(picked, timeout=15, what="a 200 through the sidecar's HTTP lane")
        pid = sidecar.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            statuses: Counter[int] = Counter()
            for i in range(4):
                started = time.monotonic()
                status, _ = await chat(gw, "acme", f"while hung {i}", timeout=10)
                took = time.monotonic() - started
                statuses[status] += 1
                assert 0.25 < took < 3.0, took  # the timeout, then on: not a hang
            assert statuses == {expected: 4}, statuses
        finally:
            os.kill(pid, signal.SIGCONT)

        async def steered() -> bool:  # one replica for a tenant's prefix: the picker's doing
            served = {(await chat(gw, "globex", f"after {i}"))[1] for i in range(3)}
            return len(served) == 1 and None not in served

        await poll_until(steered, timeout=10, what="picks again once the sidecar continues")


async def test_a_sidecar_serves_the_http_lane() -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    async with TrafficGateway(_policy(process="sidecar"), backends) as gw:
        assert gw.gateway is not None and gw.gateway.pickers is not None
        assert not gw.gateway.pickers.pools.http_servers  # the lane is in the sidecar
        (sidecar,) = gw.gateway.pickers.sidecars.values()
        assert await sidecar.wait_serving(20)

        async def picked() -> bool:
            status, _ = await chat(gw, "warm-up", "hello")
            return status == 200

        await poll_until(picked, timeout=15, what="a 200 through the sidecar's HTTP lane")
        served: Counter[str | None] = Counter()
        for i in range(6):
            status, backend = await chat(gw, "globex", f"question {i}")
            assert status == 200
            served[backend] += 1
        assert len(served) == 1, served

        async def ended() -> bool:  # the sidecar's pool, as the gateway's status shows it
            assert gw.gateway is not None
            async with httpx.AsyncClient(base_url=gw.gateway.admin.url, timeout=5) as admin:
                pool = (await admin.get("/status")).json().get("pickers", {}).get("llm")
            if pool is None:
                return False
            assert pool["asked"]["transport"] == "http"  # the default, said by the sidecar
            stats = pool["endpoints"].values()
            return bool(
                sum(e["picks"] for e in stats) >= 7 and sum(e["in_flight"] for e in stats) == 0
            )

        await poll_until(ended, timeout=5, what="the sidecar's picks, all ended")
