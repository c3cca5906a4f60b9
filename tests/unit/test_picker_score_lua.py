"""The Lua picker Envoy runs for ``picker: {process: envoy, pick: score}`` (picker_score.lua),
on LuaJIT as in Envoy (tests/lua_picker.py stands in for Envoy's handle only).

It must make the pick the picker process makes (gateway/picker/core/picker.py): a property
test runs both on the same random pools, scrapes, picks and finishes, and compares every
candidate's total. Then what only the Lua side has: the prompt's blocks from the raw body,
the index's bound, shedding as a local reply, sessions, the header a client sends, and the
in-flight count of a request that never ends."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferway.gateway.picker.core.metrics import ServerMetrics
from inferway.gateway.picker.core.picker import Picker, PickerConfig
from inferway.gateway.picker.core.prefix import PrefixIndex
from inferway.gateway.picker.core.scorers import Weights
from inferway.resolve.ir.picker import PickerIR, ReplicaLoadIR
from inferway.xds.translate.picker_score import IN_FLIGHT_EXPIRY_S
from tests.lua_picker import LuaPicker, Picked, chat_body

pytestmark = pytest.mark.unit

HEADER = "x-gateway-destination-endpoint"


def _ir(replicas: int | tuple[ReplicaLoadIR, ...] = 4, **kw: object) -> PickerIR:
    if isinstance(replicas, int):
        replicas = tuple(ReplicaLoadIR(f"10.0.0.{i}:8000") for i in range(1, replicas + 1))
    base = PickerIR(
        "llm", "127.0.0.1", 1, False, True, 0.5, "x-session-id", in_envoy=True, pick="score"
    )
    return replace(base, replicas=replicas, **kw)  # type: ignore[arg-type]


SYSTEM = "You are the assistant of {}. " + "Answer briefly and cite the handbook. " * 12


def _tenant(picker: LuaPicker, tenant: str, question: str) -> Picked:
    return picker.request(chat_body([("system", SYSTEM.format(tenant)), ("user", question)]))


# -- the same pick as the picker process ----------------------------------------------------

_gauge = st.tuples(
    st.sampled_from([None, 0, 1, 2, 3, 5, 8, 12]),
    st.sampled_from([None, 0.0, 0.1, 0.45, 0.9, 1.0]),
    st.frozensets(st.sampled_from("abc"), max_size=2),
    st.frozensets(st.sampled_from("abc"), max_size=1),
    st.sampled_from([None, 1, 2, 3]),
)
_op = st.one_of(
    st.tuples(st.just("pick"), st.sampled_from([None, "a", "b", "z"])),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("scrape"), st.lists(_gauge, min_size=6, max_size=6)),
)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 5),
    weights=st.tuples(*[st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0])] * 4),
    queue_limit=st.sampled_from([1.0, 3.0, 8.0]),
    kv_limit=st.sampled_from([0.5, 0.95]),
    shed=st.booleans(),
    ops=st.lists(_op, min_size=4, max_size=60),
)
def test_every_candidate_scores_as_in_the_picker_process(
    n: int,
    weights: tuple[float, float, float, float],
    queue_limit: float,
    kv_limit: float,
    shed: bool,
    ops: list[tuple[str, object]],
) -> None:
    queue, kv, prefix, lora = weights
    if not any(weights):
        queue = 1.0
    names = [f"10.0.0.{i}:8000" for i in range(1, n + 1)]
    ir = _ir(
        n,
        weights=(queue, kv, prefix, lora, 0.0),
        queue_limit=queue_limit,
        kv_cache_limit=kv_limit,
        shed=shed,
    )
    lua = LuaPicker(ir)
    py = Picker(
        PickerConfig(
            weights=Weights(queue, kv, prefix, lora, 0.0),
            queue_limit=queue_limit,
            kv_cache_limit=kv_limit,
            shed=shed,
        )
    )
    py.set_endpoints(names)
    open_: list[tuple[Picked, int | None]] = []
    version = None
    for op, arg in ops:
        if op == "scrape":
            assert isinstance(arg, list)
            gauges = arg[:n]
            replicas = tuple(
                ReplicaLoadIR(name, d, k, tuple(sorted(loras)), tuple(sorted(waiting)), m)
                for name, (d, k, loras, waiting, m) in zip(names, gauges, strict=True)
            )
            new = lua.set_replicas(replicas)
            if new != version:  # the Lua side reads a scrape only when the gauges changed
                version = new
                for name, (d, k, loras, waiting, m) in zip(names, gauges, strict=True):
                    metrics = ServerMetrics(
                        waiting=None if d is None else float(d),
                        running=None if d is None else 0.0,
                        kv_cache=k,
                        loras_running=frozenset(loras),
                        loras_waiting=frozenset(waiting),
                        max_lora=m,
                    )
                    py.observe(name, metrics)
        elif op == "finish":
            if open_:
                picked, ticket = open_.pop(int(arg) % len(open_))  # type: ignore[call-overload]
                lua.finish(picked)
                py.finish(ticket)
        else:
            model = arg if isinstance(arg, str) else None
            probe = py.pick((), lora=model)
            py.finish(probe.ticket)  # only to see the totals: back as it was
            expected = {e: t for t, e, _, _ in probe.rows}
            got = lua.rows(model)
            if probe.status == 429:
                assert got == {}
            assert got.keys() == expected.keys()
            for endpoint, total in expected.items():
                assert got[endpoint] == pytest.approx(total, abs=1e-9), (endpoint, got, expected)
            body = json.dumps({"model": model} if model else {})
            picked = lua.request(body)
            assert picked.status == probe.status
            if picked.status == 200:
                winner = picked.destination[0]
                best = sorted(expected.values(), reverse=True)[: len(picked.destination)]
                got_order = [expected[e] for e in picked.destination]  # winner, fallbacks
                assert got_order == pytest.approx(best, abs=1e-9), (picked.destination, expected)
                applied = py.pick((), lora=model, subset=[winner])  # the same winner there
                open_.append((picked, applied.ticket))
    for picked, ticket in open_:
        lua.finish(picked)
        py.finish(ticket)
    for name in names:
        state = lua.state(name)
        assert state["in_flight"] == 0 and state["since"] == 0


@settings(max_examples=200, deadline=None)
@given(
    cap=st.integers(1, 6),
    ops=st.lists(
        st.tuples(
            st.integers(0, 2), st.lists(st.integers(1, 9), min_size=1, max_size=8, unique=True)
        ),
        max_size=40,
    ),
)
def test_the_prefix_index_is_the_picker_processes_lru(
    cap: int, ops: list[tuple[int, list[int]]]
) -> None:
    """Block by block: what each replica holds, and the least recently sent going first."""
    lua = LuaPicker(
        _ir(3), replace={"local BLOCKS_PER_ENDPOINT = 4096": f"local BLOCKS_PER_ENDPOINT = {cap}"}
    )
    py = PrefixIndex(blocks_per_endpoint=cap)
    names = [r.address for r in lua.picker.replicas]
    for who, blocks in ops:
        lua.record(names[who], blocks)
        py.record(names[who], blocks)
        for probe in ([b] for b in range(1, 10)):
            expected = {e: n for e, n in py.matches(probe, names).items() if n}
            assert lua.matches(probe) == expected, (probe, who, blocks)
        assert lua.matches(blocks) == {e: n for e, n in py.matches(blocks, names).items() if n}
    assert lua.blocks_held() == len(py)


# -- the prompt, from the raw body ----------------------------------------------------------


def test_a_tenants_requests_meet_where_its_prefix_went_and_tenants_spread() -> None:
    picker = LuaPicker(_ir(4))
    homes = {}
    for tenant in ("acme", "globex", "initech", "umbrella"):
        first = _tenant(picker, tenant, "hello")
        homes[tenant] = first.destination[0]
        for i in range(3):
            again = _tenant(picker, tenant, f"question {i}")
            assert again.destination[0] == homes[tenant], (tenant, again.meta)
            assert again.meta["hit"] == again.meta["blocks"] > 0
            assert "prefix 1.00x3" in again.meta["reason"]
    assert len(set(homes.values())) >= 3, homes  # load spreads the new tenants


def test_workers_put_a_new_prompt_at_its_home_and_spill_it_alike() -> None:
    """Each Envoy worker has its own index; a prompt none of them has seen goes to its home
    (the prompt's own order of the replicas, among the least loaded), so two workers that see
    the pool alike cache it once, and spill it to the same next replica when it saturates."""
    workers = [LuaPicker(_ir(8)), LuaPicker(_ir(8))]
    homes = {}
    for tenant in [f"tenant-{i}" for i in range(12)]:
        picked = [_tenant(w, tenant, "first") for w in workers]
        assert picked[0].destination[0] == picked[1].destination[0], tenant
        assert "new here: its home" in picked[0].meta["reason"]
        for w, p in zip(workers, picked, strict=True):
            w.finish(p)
        homes[tenant] = picked[0].destination[0]
    assert len(set(homes.values())) >= 5, homes  # the prompts' own orders differ
    home = homes["tenant-0"]
    loads = tuple(
        ReplicaLoadIR(r.address, 8.0 if r.address == home else 0.0)
        for r in workers[0].picker.replicas
    )
    spilled = []
    for w in workers:
        w.set_replicas(loads)  # the home saturated (queue_limit 8)
        spilled.append(_tenant(w, "tenant-0", "again").destination[0])
    assert spilled[0] == spilled[1] != home


def test_a_prompt_sharing_part_of_a_prefix_scores_that_part() -> None:
    picker = LuaPicker(_ir(2))
    system = "x" * 2048
    first = picker.request(chat_body([("system", system), ("user", "a")]))
    half = picker.request(chat_body([("system", system[:1024] + "y" * 1024), ("user", "a")]))
    assert first.meta["blocks"] == 8 and half.meta["blocks"] == 8
    assert half.meta["hit"] == 4, half.meta  # the first 1,024 bytes (and the JSON before)
    assert half.destination[0] == first.destination[0]


def test_prompt_or_messages_anywhere_in_the_body_and_bodies_without_either() -> None:
    picker = LuaPicker(_ir(3))
    long = "p" * 600
    a = picker.request(json.dumps({"stream": True, "tools": ["t"], "prompt": long}))
    b = picker.request(json.dumps({"prompt": long, "max_tokens": 5}))
    assert a.meta["blocks"] == 2 and b.meta["hit"] == 2 and a.destination[0] == b.destination[0]
    for body in (json.dumps({"input": "embed me " * 100}), None, ""):
        picked = picker.request(body)
        assert picked.status == 200 and picked.meta["blocks"] == 0  # picked by load alone


def test_the_index_is_bounded_per_replica_and_forgets_a_replica_gone() -> None:
    picker = LuaPicker(
        _ir(2), replace={"local BLOCKS_PER_ENDPOINT = 4096": "local BLOCKS_PER_ENDPOINT = 64"}
    )
    for i in range(200):
        picked = picker.request(chat_body([("user", f"{i:04d}" + "z" * 2000)]))
        picker.finish(picked)
    assert 0 < picker.blocks_held() <= 2 * 64
    # the most recent prompt is still held in full
    again = picker.request(chat_body([("user", "0199" + "z" * 2000)]))
    assert again.meta["hit"] == again.meta["blocks"] == 7
    picker.finish(again)
    picker.set_replicas(_ir(1).replicas)  # 10.0.0.2 gone: its blocks with it
    assert picker.blocks_held() <= 64
    assert picker.request(chat_body([("user", "x")])).destination == ["10.0.0.1:8000"]


def test_memory_stays_bounded_under_many_distinct_prompts() -> None:
    picker = LuaPicker(
        _ir(4), replace={"local BLOCKS_PER_ENDPOINT = 4096": "local BLOCKS_PER_ENDPOINT = 256"}
    )
    for i in range(300):
        picker.finish(picker.request(chat_body([("user", f"{i:05d}" + "w" * 4000)])))
    settled = picker.memory_kib()
    for i in range(300, 1500):
        picker.finish(picker.request(chat_body([("user", f"{i:05d}" + "w" * 4000)])))
    assert picker.blocks_held() <= 4 * 256
    assert picker.memory_kib() < settled * 1.5 + 256, (settled, picker.memory_kib())


# -- answers ---------------------------------------------------------------------------------


def test_fallbacks_follow_the_winner_and_a_clients_own_header_never_steers() -> None:
    picker = LuaPicker(_ir(4, fallbacks=2))
    picked = picker.request(chat_body([("user", "hi")]), {HEADER: "10.9.9.9:1"})
    assert picked.status == 200 and len(picked.destination) == 3
    assert "10.9.9.9:1" not in picked.destination and len(set(picked.destination)) == 3
    none = LuaPicker(_ir(2, fallbacks=0)).request(chat_body([("user", "hi")]))
    assert len(none.destination) == 1


def test_all_saturated_sheds_429_or_takes_the_least_loaded() -> None:
    loads = (ReplicaLoadIR("10.0.0.1:8000", 9.0), ReplicaLoadIR("10.0.0.2:8000", 12.0))
    shed = LuaPicker(_ir(loads, shed=True)).request(chat_body([("user", "hi")]))
    assert shed.status == 429 and "saturated: shed" in shed.meta["reason"]
    kept = LuaPicker(_ir(loads)).request(chat_body([("user", "hi")]))
    assert kept.destination[0] == "10.0.0.1:8000"
    assert "2 saturated (all: least bad)" in kept.meta["reason"]


def test_a_saturated_replica_is_left_out_even_holding_the_prefix() -> None:
    picker = LuaPicker(_ir(2))
    home = _tenant(picker, "acme", "q").destination[0]
    other = next(r for r in picker.picker.replicas if r.address != home)
    picker.set_replicas((ReplicaLoadIR(home, 8.0), other))  # queue_limit 8: saturated
    moved = _tenant(picker, "acme", "q2")
    assert moved.destination[0] == other.address and "1 saturated excluded" in moved.meta["reason"]


def test_a_deep_queue_or_a_full_kv_cache_gets_less_and_a_loaded_adapter_more() -> None:
    picker = LuaPicker(
        _ir(
            (
                ReplicaLoadIR("10.0.0.1:8000", 6.0, 0.2),
                ReplicaLoadIR("10.0.0.2:8000", 0.0, 0.9),
                ReplicaLoadIR("10.0.0.3:8000", 0.0, 0.2),
            )
        )
    )
    served = []
    for i in range(6):
        picked = picker.request(chat_body([("user", f"u{i}")]))
        served.append(picked.destination[0])
        picker.finish(picked)
    assert set(served) == {"10.0.0.3:8000"}, served
    adapters = LuaPicker(
        _ir(
            (
                ReplicaLoadIR("10.0.0.1:8000", 1.0, 0.2),
                ReplicaLoadIR("10.0.0.2:8000", 1.0, 0.2, ("sql",)),
            )
        )
    )
    for model, where in (("sql", "10.0.0.2:8000"), ("base", None)):
        picked = adapters.request(chat_body([("user", "x")], model=model))
        if where is not None:
            assert picked.destination[0] == where and "lora 1.00x1" in picked.meta["reason"]
        else:
            assert "lora 0.50x1" in picked.meta["reason"]  # neither has it: a free slot
        adapters.finish(picked)


def test_a_session_sticks_when_its_scorer_counts() -> None:
    picker = LuaPicker(_ir(3, weights=(1.0, 0.0, 0.0, 0.0, 5.0)))
    first = picker.request(chat_body([("user", "a")]), {"x-session-id": "s1"})
    for i in range(4):
        picked = picker.request(chat_body([("user", f"b{i}")]), {"x-session-id": "s1"})
        assert picked.destination[0] == first.destination[0]


# -- in flight -------------------------------------------------------------------------------


def test_a_request_counts_until_its_response_ends_or_expires() -> None:
    picker = LuaPicker(_ir(1))
    done = picker.request(chat_body([("user", "a")]))
    stream = picker.request(chat_body([("user", "s")]))
    lost = picker.request(chat_body([("user", "b")]))  # its client goes: no response
    assert picker.state("10.0.0.1:8000")["in_flight"] == 3
    assert picker.finish(stream, "text/event-stream; charset=utf-8") == 2  # read to its end
    assert picker.finish(done) == 0  # whole once its headers come
    picker.finish(done)  # a second end of one request counts once
    assert picker.state("10.0.0.1:8000")["in_flight"] == 1
    picker.now += IN_FLIGHT_EXPIRY_S + 1
    picker.finish(picker.request(chat_body([("user", "c")])))
    assert picker.state("10.0.0.1:8000")["in_flight"] == 0
    picker.finish(lost)  # after its expiry: nothing left to take off
    assert picker.state("10.0.0.1:8000")["in_flight"] == 0


def test_a_pool_with_no_replicas_leaves_the_request_to_envoys_balancing() -> None:
    picked = LuaPicker(_ir(0)).request(chat_body([("user", "a")]), {HEADER: "10.9.9.9:1"})
    assert picked.status == 0 and picked.destination == []
