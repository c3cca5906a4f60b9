"""``picker: {process: sidecar}`` for real: real Envoy, the gateway, its supervised picker
process and three fast replicas. Requests sharing a prefix go to one replica through the
sidecar; SIGKILLing the picker process loses the affinity (``fail: open``: the service's own
balancing), never a request, and the gateway restarts it with the live pools, after which
the picker steers again."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import httpx
import pytest

from inferway.gateway.picker.sidecar import PickerSidecar
from tests.envoy_process import free_port
from tests.picker_chat import chat, picker_policy
from tests.traffic_harness import ControlledBackend, TrafficGateway, poll_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


def _policy(port: int) -> str:
    return picker_policy(
        f"      listen: 127.0.0.1:{port}\n      http_listen: 127.0.0.1:{free_port()}\n"
        "      process: sidecar\n      metrics_path: null\n      timeout: 2s\n",
        other_route=False,
    )


async def _steered(gw: TrafficGateway, tenant: str) -> Counter[str | None]:
    """Where 6 requests of ``tenant``, one at a time (never saturating), were answered."""
    served: Counter[str | None] = Counter()
    for i in range(6):
        status, backend = await chat(gw, tenant, f"question {i}")
        assert status == 200
        served[backend] += 1
    return served


async def test_a_sidecar_picker_steers_and_a_killed_one_fails_open_then_returns() -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    async with TrafficGateway(_policy(free_port()), backends) as gw:
        assert gw.gateway is not None and gw.gateway.pickers is not None
        assert not gw.gateway.pickers.servers  # nothing picks in the gateway's own process
        (sidecar,) = gw.gateway.pickers.sidecars.values()
        assert isinstance(sidecar, PickerSidecar) and await sidecar.wait_serving(20)
        assert sidecar.pid is not None and sidecar.pid != os.getpid()

        async def picked() -> bool:  # Envoy's health of the replicas, the picker's answers
            status, _ = await chat(gw, "warm-up", "hello")
            return status == 200

        await poll_until(picked, timeout=15, what="a 200 through the sidecar's picks")
        served = await _steered(gw, "acme")
        assert len(served) == 1, served  # the prefix holder, every time

        async def shown() -> bool:  # the gateway's status shows the sidecar's pool
            assert gw.gateway is not None
            async with httpx.AsyncClient(base_url=gw.gateway.admin.url, timeout=5) as admin:
                pool = (await admin.get("/status")).json().get("pickers", {}).get("llm")
            return pool is not None and sum(e["picks"] for e in pool["endpoints"].values()) >= 7

        await poll_until(shown, timeout=5, what="the sidecar's pool in the gateway's status")

        os.kill(sidecar.pid, signal.SIGKILL)
        started = time.monotonic()
        during: Counter[str | None] = Counter()
        while sidecar.restarts == 0 or not await sidecar.wait_serving(0.01):
            status, backend = await chat(gw, "acme", "while the picker is down")
            assert status == 200  # fail open: the service's own balancing answers
            during[backend] += 1
            assert time.monotonic() - started < 20, "the picker process was not restarted"
        assert sidecar.restarts == 1 and sidecar.last_restart_s is not None
        assert sum(during.values()) >= 1
        await poll_until(picked, timeout=10, what="picks again after the restart")
        served = await _steered(gw, "globex")
        assert len(served) == 1, served  # the restarted process steers again
