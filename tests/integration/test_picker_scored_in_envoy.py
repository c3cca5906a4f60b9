"""``picker: {process: envoy, pick: score}`` for real: real Envoy runs the scoring picker in its
Lua filter (no picker process), answers ``override_host`` with the destination header, and
reads the replicas' load the gateway scrapes and pushes with the routes.

One tenant's requests meet on one replica and tenants spread; a replica whose own metrics
show a deep queue gets nothing once the gateway has pushed that; with every replica saturated
and ``shed: true`` Envoy answers 429 itself; each pick's winner and reason reach the access
log and the trace span. (bench/picker_llm_bench.py runs it on llama.cpp engines.)"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from inferway.cli.status import render_status
from inferway.devtools.otlp_receiver import ReceivedSpan, start_otlp_receiver
from tests.picker_chat import chat, llamacpp_metrics, picker_policy
from tests.traffic_harness import ControlledBackend, TrafficGateway, poll_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]

DESTINATION = "x-gateway-destination-endpoint"


def _policy(extra: str = "", observability: str = "") -> str:
    settings = "      process: envoy\n      pick: score\n      scrape_interval: 200ms\n"
    return picker_policy(settings + extra) + observability


async def test_a_tenant_meets_on_one_replica_tenants_spread_and_picks_are_explained(
    tmp_path: Path,
) -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    for backend in backends:  # vLLM's own prefix-cache counters: 75% of lookups hit
        backend.metrics_text = (
            "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n"
            "vllm:prefix_cache_queries_total 200\nvllm:prefix_cache_hits_total 150\n"
        )
    log = tmp_path / "access.log"
    receiver = await start_otlp_receiver()
    observability = (
        "observability:\n"
        "  tracing:\n"
        f'    collector: "{receiver.endpoint}"\n'
        "    sampling_percent: 100\n"
        "  access_log:\n"
        f"    path: {log}\n"
        "    extra_fields:\n"
        '      picked: "%DYNAMIC_METADATA(inferway.picker:winner)%"\n'
        '      why: "%DYNAMIC_METADATA(inferway.picker:reason)%"\n'
    )
    try:
        async with TrafficGateway(_policy(observability=observability), backends) as gw:
            assert gw.gateway is not None and gw.gateway.pickers is not None
            assert not gw.gateway.pickers.servers and not gw.gateway.pickers.sidecars
            homes = {}
            for tenant in ("acme", "globex", "initech"):
                served = Counter([(await chat(gw, tenant, f"q{i}"))[1] for i in range(5)])
                assert len(served) == 1 and None not in served, (tenant, served)
                homes[tenant] = next(iter(served))
            spread = Counter([(await chat(gw, f"tenant-{i}", "hi"))[1] for i in range(24)])
            assert len(spread) == 3, spread
            # the backend got the destination Envoy's Lua picker chose, with fallbacks
            seen = next(b for b in backends if b.seen).seen[-1]
            assert len(seen[DESTINATION].split(",")) == 3
            # the same pick, explained: access log and trace span
            ports = {f"127.0.0.1:{b.port}": b.name for b in backends}

            def logged() -> list[dict[str, str]]:
                lines = log.read_text().splitlines() if log.exists() else []
                return [json.loads(line) for line in lines if '"picked"' in line]

            async def explained() -> bool:
                return any(e.get("picked") in ports for e in logged())

            await poll_until(explained, timeout=10, what="picks in the access log")
            entry = next(e for e in reversed(logged()) if e.get("picked") in ports)
            assert entry["why"].startswith(f"{entry['picked']} total ")
            assert "prefix" in entry["why"] and "runner-up" in entry["why"]

            def tagged(span: ReceivedSpan) -> bool:
                return span.attributes.get("inferway.picker.winner") in ports

            spans = await receiver.wait_for(lambda s: any(tagged(x) for x in s), timeout=15)
            span = next(s for s in spans if tagged(s))
            assert str(span.attributes["inferway.picker.reason"]).startswith(
                str(span.attributes["inferway.picker.winner"])
            )
            # status says the service is scored in Envoy
            async with httpx.AsyncClient(base_url=gw.gateway.admin.url, timeout=5) as admin:
                document = (await admin.get("/status")).json()
            shown = document["pickers"]["llm"]
            assert shown["in_envoy"]["pick"] == "score"
            replica = shown["endpoints"][f"127.0.0.1:{backends[0].port}"]
            assert replica["prefix_hit_rate"] == 0.75 and replica["depth"] == 0
            console = Console(record=True, width=240)
            render_status(document, console)
            text = console.export_text()
            assert "scored in Envoy's Lua filter" in text and "75%" in text
    finally:
        await receiver.stop()


async def test_a_deep_queue_gets_nothing_and_all_saturated_sheds() -> None:
    backends = [ControlledBackend(name) for name in ("a", "b", "c")]
    for backend in backends:
        backend.metrics_text = llamacpp_metrics(0)
    async with TrafficGateway(_policy("      queue_limit: 4\n      shed: true\n"), backends) as gw:
        status, holder = await chat(gw, "acme", "prime")
        assert status == 200 and holder is not None
        busy = next(b for b in backends if b.name == holder)
        busy.metrics_text = llamacpp_metrics(7)  # 7 waiting + 1 running >= 4: saturated

        async def elsewhere() -> bool:  # the scrape reached Envoy with the routes
            served = [(await chat(gw, "acme", f"q{i}"))[1] for i in range(4)]
            return holder not in served and None not in served

        await poll_until(elsewhere, timeout=15, what=f"acme's requests off {holder}")
        moved = Counter([(await chat(gw, "acme", f"again {i}"))[1] for i in range(6)])
        assert len(moved) == 1 and holder not in moved, moved  # the prefix meets again
        for backend in backends:
            backend.metrics_text = llamacpp_metrics(9)

        async def shed() -> bool:
            return (await chat(gw, "acme", "x"))[0] == 429

        await poll_until(shed, timeout=15, what="429 with every replica saturated")
        for backend in backends:
            backend.metrics_text = llamacpp_metrics(0)

        async def served() -> bool:
            return (await chat(gw, "acme", "y"))[0] == 200

        await poll_until(served, timeout=15, what="200 again once drained")
