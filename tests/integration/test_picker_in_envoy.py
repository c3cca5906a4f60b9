"""``picker: {process: envoy}`` for real: real Envoy hashes the prompt's prefix itself (Lua)
and balances by Maglev with bounded load; no picker process runs. One tenant's requests meet
on one replica, tenants spread over the pool, a prompt that differs only after the hashed
prefix still meets, a client cannot steer with its own hash header, a body without a prompt
(or no body) is still served, a route to another service is not hashed, and a replica past
the load bound is passed over. (tests/integration/test_picker.py runs it on llama.cpp engines
too, for the prefix's reuse. The bound is tested here only: it needs requests that overlap in
Envoy, which backends that hold each answer 0.5 s make sure of and the tiny model, which may end
an answer after a few tokens, does not.)"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest
from rich.console import Console

from inferway.cli.status import render_status
from inferway.xds.translate.picker_envoy import PREFIX_HASH_HEADER
from tests.picker_chat import SYSTEM, chat, llamacpp_metrics, picker_policy
from tests.traffic_harness import ControlledBackend, TrafficGateway, poll_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


async def _all_serving(gw: TrafficGateway, count: int) -> None:
    """Until ``count`` replicas answered: Maglev's table changes while hosts turn healthy."""
    served: set[str | None] = set()
    tenant = 0

    async def all_served() -> bool:
        nonlocal tenant
        tenant += 1
        status, backend = await chat(gw, f"warm-{tenant}", "hello")
        if status == 200:
            served.add(backend)
        return len(served) == count

    await poll_until(all_served, timeout=15, what=f"{count} replicas answering")


def _policy(extra: str = "") -> str:
    return picker_policy(f"      process: envoy\n      prefix_bytes: 512\n{extra}")


async def test_one_tenant_meets_on_one_replica_and_tenants_spread() -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    async with TrafficGateway(_policy(), backends) as gw:
        assert gw.gateway is not None and gw.gateway.pickers is not None
        assert not gw.gateway.pickers.servers and not gw.gateway.pickers.sidecars
        await _all_serving(gw, 3)
        for tenant in ("acme", "globex"):
            served = Counter([(await chat(gw, tenant, f"question {i}"))[1] for i in range(6)])
            assert len(served) == 1 and None not in served, served  # past 512 bytes: same
        holder = next(b for b in backends if b.seen and PREFIX_HASH_HEADER in b.seen[-1])
        assert len(holder.seen[-1][PREFIX_HASH_HEADER]) == 8  # 32 bits, hex
        spread = Counter([(await chat(gw, f"tenant-{i}", "hi"))[1] for i in range(24)])
        assert len(spread) == 3 and max(spread.values()) <= 16, spread
        assert gw.session is not None
        # a route to another service is not hashed
        seen_before = len(backends[2].seen)
        async with gw.session.post(f"{gw.url}/other/x", json={"messages": []}) as response:
            assert response.status == 200
        assert PREFIX_HASH_HEADER not in backends[2].seen[seen_before]
        # status says the service is picked in Envoy, and how
        async with httpx.AsyncClient(base_url=gw.gateway.admin.url, timeout=5) as admin:
            document = (await admin.get("/status")).json()
        shown = document["pickers"]["llm"]
        assert shown["in_envoy"] == {"prefix_bytes": 512, "load_bound": 1.1}
        console = Console(record=True, width=240)
        render_status(document, console)
        assert "endpoint picker: llm: in Envoy, the prompt's first 512 bytes" in (
            console.export_text()
        )


async def test_the_client_cannot_steer_and_bodies_without_a_prompt_are_served() -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    async with TrafficGateway(_policy(), backends) as gw:
        await _all_serving(gw, 3)
        assert gw.session is not None
        before = {b.name: len(b.seen) for b in backends}

        def since() -> list[dict[str, str]]:
            return [h for b in backends for h in b.seen[before[b.name] :]]

        forged = {PREFIX_HASH_HEADER: "deadbeef"}
        for body in ({"input": "no prompt here"}, None):
            async with gw.session.post(
                f"{gw.url}/v1/embeddings", json=body, headers=forged
            ) as response:
                assert response.status == 200
        async with gw.session.get(f"{gw.url}/v1/models", headers=forged) as response:
            assert response.status == 200
        seen = since()
        assert len(seen) == 3 and all(PREFIX_HASH_HEADER not in h for h in seen), seen
        # a forged header on a prompt is replaced by the prompt's own hash
        before = {b.name: len(b.seen) for b in backends}
        status, served = await chat(gw, "acme", "first")
        system = {"role": "system", "content": SYSTEM.replace("{}", "acme")}
        async with gw.session.post(
            f"{gw.url}/v1/chat/completions", json={"messages": [system]}, headers=forged
        ) as response:
            assert response.status == 200
        hashes = [h.get(PREFIX_HASH_HEADER) for h in since()]
        assert status == 200 and served is not None and len(hashes) == 2, hashes
        assert hashes[0] == hashes[1] and hashes[0] not in (None, "deadbeef"), hashes


async def test_a_replica_past_the_load_bound_is_passed_over() -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    async with TrafficGateway(_policy("      load_bound: 1\n"), backends) as gw:
        await _all_serving(gw, 3)
        status, holder = await chat(gw, "busy", "prime")
        assert status == 200 and holder is not None
        for backend in backends:
            backend.delay = 0.5  # every request stays in flight a while
        # Envoy counts a request as active on a replica once it is on a connection there, so
        # requests in one burst (all waiting for new connections) would see the same counts:
        # each starts 50 ms after the one before, all still in flight together

        async def later(i: int) -> tuple[int, str | None]:
            await asyncio.sleep(0.05 * i)
            return await chat(gw, "busy", f"overlapping {i}")

        results = await asyncio.gather(*(later(i) for i in range(6)))
        assert {status for status, _ in results} == {200}
        served = Counter(backend for _, backend in results)
        assert served[holder] >= 1 and len(served) >= 2, served


async def test_a_replica_its_metrics_show_saturated_is_left_out_then_taken_back() -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    for backend in backends:
        backend.metrics_text = llamacpp_metrics(0)
    limits = "      queue_limit: 4\n      scrape_interval: 200ms\n"
    async with TrafficGateway(_policy(limits), backends) as gw:
        assert gw.gateway is not None and gw.gateway.pickers is not None
        await _all_serving(gw, 3)
        status, holder = await chat(gw, "acme", "prime")
        assert status == 200 and holder is not None
        busy = next(b for b in backends if b.name == holder)
        busy.metrics_text = llamacpp_metrics(7)  # 7 waiting + 1 running >= 4

        async def elsewhere() -> bool:  # Envoy has the replica as DEGRADED: off the table
            served = [(await chat(gw, "acme", f"q{i}"))[1] for i in range(4)]
            return holder not in served and None not in served

        await poll_until(elsewhere, timeout=15, what=f"acme's requests off saturated {holder}")
        moved = Counter([(await chat(gw, "acme", f"again {i}"))[1] for i in range(6)])
        assert len(moved) == 1 and holder not in moved, moved  # the prefix meets on the next
        async with httpx.AsyncClient(base_url=gw.gateway.admin.url, timeout=5) as admin:
            document = (await admin.get("/status")).json()
        shown = document["pickers"]["llm"]
        busy_endpoint = f"127.0.0.1:{busy.port}"
        assert shown["endpoints"][busy_endpoint]["left_out"] is True
        assert shown["changes"][-1]["reason"] == "queue 8 >= queue_limit 4, the pool has room"
        console = Console(record=True, width=240)
        render_status(document, console)
        text = " ".join(console.export_text().split())  # the caption may wrap
        assert "left out (saturated)" in text and "queue 8 >= queue_limit 4" in text
        busy.metrics_text = llamacpp_metrics(0)  # drained: taken back after 2 scrape intervals

        async def back() -> bool:
            served = [(await chat(gw, "acme", f"b{i}"))[1] for i in range(3)]
            return served == [holder] * 3

        await poll_until(back, timeout=15, what=f"acme's requests back on {holder}")
        async with httpx.AsyncClient(base_url=gw.gateway.admin.url, timeout=5) as admin:
            shown = (await admin.get("/status")).json()["pickers"]["llm"]
        assert shown["changes"][-1]["left_out"] is False
        assert shown["changes"][-1]["reason"].startswith("under both limits")
