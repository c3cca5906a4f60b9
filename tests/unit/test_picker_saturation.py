"""The ``process: envoy`` picker's saturation gate (which replicas Envoy leaves out, from the
model servers' own metrics) by simulation with an injected clock and by property, and the
gateway's watch over real HTTP metrics servers (scrape, decide, publish)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from inferway.gateway.picker.core.metrics import ServerMetrics
from inferway.gateway.picker.core.saturation import SaturationGate, SaturationLimits
from inferway.gateway.picker.in_envoy import InEnvoyLoad
from inferway.policies.picker import Picker as PickerPolicy
from inferway.state.model import ReplicaLoad
from tests.aiohttp_sites import start_site

LIMITS = SaturationLimits(queue_limit=8, kv_cache_limit=0.9, hold_s=2.0)


def _load(waiting: float, running: float = 0, kv: float | None = None) -> ServerMetrics:
    return ServerMetrics(waiting=waiting, running=running, kv_cache=kv)


def _gate(n: int = 4) -> SaturationGate:
    gate = SaturationGate(LIMITS)
    gate.set_endpoints(f"10.0.0.{i}:8000" for i in range(n))
    return gate


def test_a_replica_at_its_queue_limit_is_left_out_and_taken_back_after_the_hold() -> None:
    gate = _gate()
    a, b = "10.0.0.0:8000", "10.0.0.1:8000"
    for e in gate.endpoints():
        gate.observe(e, _load(1, kv=0.1), 0.0)
    gate.observe(a, _load(6, 2), 0.0)  # waiting + running = 8: at the limit
    assert gate.decide(0.0) == {a}
    (change,) = gate.history
    assert change.left_out and change.depth == 8
    assert change.reason == "queue 8 >= queue_limit 8, the pool has room"
    gate.observe(a, _load(1), 1.0)  # under: held
    assert gate.decide(1.0) == {a}
    gate.observe(a, _load(9), 1.5)  # over again: the hold starts over
    gate.observe(a, _load(1), 2.0)
    assert gate.decide(3.5) == {a}
    gate.observe(a, _load(1), 4.0)  # 2 s under since 2.0
    assert gate.decide(4.0) == frozenset()
    assert gate.history[-1].reason == "under both limits for 2 s"
    gate.observe(b, _load(0, kv=0.95), 5.0)
    assert gate.decide(5.0) == {b}
    assert gate.history[-1].reason == "KV cache 95% >= kv_cache_limit 90%, the pool has room"


def test_unknown_metrics_never_leave_a_replica_out() -> None:
    gate = _gate(2)
    gate.observe("10.0.0.0:8000", None, 0.0)  # down, or no metrics
    gate.observe("10.0.0.1:8000", ServerMetrics(kv_cache=None), 0.0)
    assert gate.decide(0.0) == frozenset() and not gate.history


def test_a_pool_loaded_as_a_whole_keeps_every_replica_in() -> None:
    gate = _gate(5)
    depths = [9, 20, 12, 3, 2]  # the median replica (9) is over half the limit: no room
    for e, depth in zip(gate.endpoints(), depths, strict=True):
        gate.observe(e, _load(depth), 0.0)
    assert gate.decide(0.0) == frozenset() and gate.kept_in == 3 and not gate.history
    assert gate.no_room == "the pool's median queue 9 >= 0.5 x queue_limit 8"
    gate.observe("10.0.0.0:8000", _load(3), 1.0)  # now the median is 3: room for the deep two
    assert gate.decide(1.0) == {"10.0.0.1:8000", "10.0.0.2:8000"} and gate.no_room is None
    kv = _gate(3)
    for e, used in zip(kv.endpoints(), [0.95, 0.5, 0.4], strict=True):
        kv.observe(e, _load(0, kv=used), 0.0)
    assert kv.decide(0.0) == frozenset() and kv.kept_in == 1
    assert kv.no_room == "the pool's median KV cache 50% >= 0.5 x kv_cache_limit 90%"


def test_at_most_half_the_pool_is_out_the_most_loaded_first() -> None:
    gate = _gate(5)
    a, b, c = "10.0.0.0:8000", "10.0.0.1:8000", "10.0.0.2:8000"
    for e, depth in zip(gate.endpoints(), [9, 20, 0, 0, 0], strict=True):
        gate.observe(e, _load(depth), 0.0)
    assert gate.decide(0.0) == {a, b}
    # both out and held (they read 0 now); c turns saturated with room on the table: three
    # saturated, room for two, the most loaded by the latest scrapes stay out
    gate.observe(a, _load(0), 1.0)
    gate.observe(b, _load(1), 1.0)
    gate.observe(c, _load(12), 1.0)
    assert gate.decide(1.0) == {b, c} and gate.kept_in == 1
    back = gate.history[-1]
    assert back.endpoint == a and not back.left_out
    assert back.reason.startswith("still saturated, but at most 2 of 5 replicas are left out")


def test_a_pool_of_one_is_never_emptied_and_removed_replicas_are_forgotten() -> None:
    gate = _gate(1)
    gate.observe("10.0.0.0:8000", _load(50), 0.0)
    assert gate.decide(0.0) == frozenset() and gate.kept_in == 1
    gate = _gate(2)
    gate.observe("10.0.0.0:8000", _load(0), 0.0)
    gate.observe("10.0.0.1:8000", _load(50), 0.0)
    assert gate.decide(0.0) == {"10.0.0.1:8000"}
    gate.set_endpoints(["10.0.0.0:8000"])
    assert gate.left_out == frozenset() and gate.decide(1.0) == frozenset()


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 9),
    rounds=st.lists(
        st.lists(st.one_of(st.none(), st.tuples(st.floats(0, 30), st.floats(0, 1))), max_size=9),
        max_size=12,
    ),
)
def test_left_out_is_saturated_within_the_cap_and_every_change_recorded(
    size: int, rounds: list[list[tuple[float, float] | None]]
) -> None:
    gate = _gate(size)
    endpoints = gate.endpoints()
    left: frozenset[str] = frozenset()
    for step, scrapes in enumerate(rounds):
        now = float(step)
        for endpoint, scrape in zip(endpoints, scrapes, strict=False):
            metrics = None if scrape is None else _load(scrape[0], kv=scrape[1])
            gate.observe(endpoint, metrics, now)
        before, changes = left, len(gate.history)
        left = gate.decide(now)
        stats = gate.stats()
        assert len(left) <= size // 2
        assert all(stats[e]["saturated"] for e in left)
        assert len(gate.history) - changes == len(left ^ before)  # each change recorded once
        saturated = {e for e, s in stats.items() if s["saturated"]}
        newly = saturated - before
        if gate.no_room is not None:  # no room: nobody new goes out
            assert not (left - before)
        elif len(left) < size // 2:  # room, and under the cap: every saturated one is out
            assert left == saturated, (left, saturated, newly)


async def _metrics_server(text: dict[str, str]) -> tuple[web.AppRunner, int]:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=text["now"], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return await start_site(app)


def _llamacpp(deferred: int, processing: int = 1) -> str:
    return (
        "# TYPE llamacpp:requests_deferred gauge\n"
        f"llamacpp:requests_deferred {deferred}\n"
        "# TYPE llamacpp:requests_processing gauge\n"
        f"llamacpp:requests_processing {processing}\n"
    )


@pytest.mark.asyncio
async def test_the_watch_scrapes_real_servers_and_publishes_changes_only() -> None:
    texts = [{"now": _llamacpp(0)} for _ in range(3)]
    sites = [await _metrics_server(t) for t in texts]
    published: list[Mapping[str, frozenset[tuple[str, int]]]] = []
    clock = [100.0]

    def publish(saturated: Mapping[str, frozenset[tuple[str, int]]], loads: object) -> None:
        assert loads == {}  # no pick: score service
        published.append(saturated)

    watch = InEnvoyLoad(publish, clock=lambda: clock[0])
    settings_ = PickerPolicy(process="envoy", queue_limit=4, scrape_interval=60)
    replicas = {f"127.0.0.1:{port}": ("127.0.0.1", port) for _, port in sites}
    try:
        watch.follow({"llm": (settings_, replicas)})
        await watch.watch_once()
        assert published == [] and watch.rounds >= 1
        texts[1]["now"] = _llamacpp(5)  # 6 >= 4
        await watch.watch_once()
        busy = ("127.0.0.1", sites[1][1])
        assert published == [{"llm": frozenset({busy})}]
        await watch.watch_once()  # unchanged: not published again
        assert len(published) == 1
        shown = watch.status()["llm"]
        assert shown["endpoints"][f"127.0.0.1:{busy[1]}"]["left_out"] is True
        assert shown["changes"][-1]["reason"] == "queue 6 >= queue_limit 4, the pool has room"
        texts[1]["now"] = _llamacpp(0)
        clock[0] += 1
        await watch.watch_once()  # under, held (2 scrape intervals)
        clock[0] += 120
        await watch.watch_once()
        assert published[-1] == {}
        # a failing publish is logged, kept unpublished, and tried again next round
        texts[2]["now"] = _llamacpp(9)

        def refuse(_saturated: Mapping[str, frozenset[tuple[str, int]]], _loads: object) -> None:
            raise RuntimeError("refused")

        watch._publish = refuse
        await watch.watch_once()
        assert watch.failed_publishes == 1 and watch.published == {}
        watch._publish = publish
        await watch.watch_once()
        assert published[-1] == {"llm": frozenset({("127.0.0.1", sites[2][1])})}
        watch.follow({})  # the service is gone: nothing left out anywhere
        assert published[-1] == {}
    finally:
        await watch.stop()
        for runner, _ in sites:
            await runner.cleanup()
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_scored_services_load_is_published_when_it_changes_and_nothing_left_out() -> None:
    """``pick: score``: Envoy's Lua picker leaves saturated replicas out itself; the watch
    only tells it each replica's queue, KV cache (to 0.05) and adapters, when they change."""
    texts = [{"now": _llamacpp(0)} for _ in range(2)]
    sites = [await _metrics_server(t) for t in texts]
    calls: list[tuple[object, object]] = []
    watch = InEnvoyLoad(lambda s, loads: calls.append((s, loads)), clock=lambda: 100.0)
    settings_ = PickerPolicy(process="envoy", pick="score", queue_limit=4, scrape_interval=60)
    replicas = {f"127.0.0.1:{port}": ("127.0.0.1", port) for _, port in sites}
    busy = f"127.0.0.1:{sites[1][1]}"
    try:
        watch.follow({"llm": (settings_, replicas)})  # not scraped yet: nothing known
        assert calls[-1] == ({}, {"llm": {e: ReplicaLoad() for e in replicas}})
        await watch.watch_once()
        idle = {e: ReplicaLoad(depth=1.0) for e in replicas}
        assert calls[-1] == ({}, {"llm": idle})
        kv = "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio {}\n"
        texts[1]["now"] = _llamacpp(9) + kv.format(0.512)  # past queue_limit: not left out
        await watch.watch_once()
        assert calls[-1] == ({}, {"llm": {**idle, busy: ReplicaLoad(depth=10.0, kv_cache=0.5)}})
        count = len(calls)
        texts[1]["now"] = _llamacpp(9) + kv.format(0.49)  # the same to 0.05: not published
        await watch.watch_once()
        assert len(calls) == count and watch.status()["llm"]["changes"] == []
    finally:
        await watch.stop()
        for runner, _ in sites:
            await runner.cleanup()
