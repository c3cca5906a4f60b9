"""The endpoint picker's pure core (inferway/gateway/picker/core/): metrics under every
dialect, the bounded prefix index, each scorer's effect on the pick, and the explanation."""

from __future__ import annotations

import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferway.gateway.picker.core.metrics import ServerMetrics, parse_metrics
from inferway.gateway.picker.core.picker import Picker, PickerConfig
from inferway.gateway.picker.core.prefix import PrefixIndex, prompt_blocks, prompt_text
from inferway.gateway.picker.core.scorers import Weights

VLLM = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.42
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a1, a2",waiting_lora_adapters=""} 10.0
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 5.0
"""
SGLANG = "sglang:num_queue_reqs 7\nsglang:num_running_reqs 2\nsglang:token_usage 0.9\n"
LLAMACPP = (
    "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n"
    "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 4\n"
    "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.25\n"
)


def test_metrics_in_each_dialect() -> None:
    vllm = parse_metrics(VLLM)
    assert (vllm.dialect, vllm.waiting, vllm.running, vllm.kv_cache) == ("vllm", 3, 5, 0.42)
    assert vllm.loras_running == {"a1", "a2"} and vllm.max_lora == 2  # the latest stamp wins
    sglang = parse_metrics(SGLANG)
    assert (sglang.dialect, sglang.waiting, sglang.running, sglang.kv_cache) == (
        "sglang", 7, 2, 0.9,
    )  # fmt: skip
    llama = parse_metrics(LLAMACPP)
    assert (llama.dialect, llama.waiting, llama.running, llama.kv_cache) == (
        "llamacpp", 4, 1, 0.25,
    )  # fmt: skip
    assert parse_metrics("other_metric 1\n") == ServerMetrics()  # unknown, never zero
    assert vllm.prefix_hit_rate is None and llama.prefix_hit_rate is None  # not said


def test_the_servers_own_prefix_cache_hit_rate_in_each_dialect() -> None:
    v1 = (
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{model_name="m",engine="0"} 300.0\n'
        'vllm:prefix_cache_queries_total{model_name="m",engine="1"} 100.0\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{model_name="m",engine="0"} 250.0\n'
        'vllm:prefix_cache_hits_total{model_name="m",engine="1"} 50.0\n'
    )
    assert parse_metrics(VLLM + v1).prefix_hit_rate == 0.75  # every engine's, summed
    none_yet = v1.replace("300.0", "0").replace("100.0", "0")
    assert parse_metrics(VLLM + none_yet).prefix_hit_rate is None  # no lookup yet
    v0 = "# TYPE vllm:gpu_prefix_cache_hit_rate gauge\nvllm:gpu_prefix_cache_hit_rate 0.4\n"
    assert parse_metrics(VLLM + v0).prefix_hit_rate == 0.4
    assert parse_metrics(SGLANG + "sglang:cache_hit_rate 0.9\n").prefix_hit_rate == 0.9


def test_prompt_text_from_chat_and_completions() -> None:
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]}
    assert prompt_text(chat) == "system\x1fS\x1euser\x1fQ\x1e"
    assert prompt_text({"prompt": "abc"}) == "abc"
    assert prompt_text({"prompt": ["abc", "d"]}) == "abc"
    assert prompt_text({"input": "x"}) is None and prompt_text([1]) is None


def test_blocks_are_chained_so_a_block_matches_only_after_the_same_prefix() -> None:
    a = prompt_blocks("x" * 64 + "y" * 64, block_chars=64)
    b = prompt_blocks("z" * 64 + "y" * 64, block_chars=64)
    assert len(a) == 2 and a[1] != b[1]  # same second block, different history
    assert prompt_blocks("x" * 63, block_chars=64) == []  # partial blocks are not cached
    assert len(prompt_blocks("x" * 64 * 10, block_chars=64, max_blocks=4)) == 4
    with pytest.raises(ValueError, match="block_chars"):
        prompt_blocks("x", block_chars=0)


def test_index_matches_the_longest_held_prefix() -> None:
    index = PrefixIndex()
    shared = prompt_blocks("s" * 640, block_chars=64)
    index.record("a", shared)
    index.record("b", shared[:3])
    assert index.matches(shared, ["a", "b", "c"]) == {"a": 10, "b": 3, "c": 0}
    index.forget("a")
    assert index.matches(shared, ["a", "b"]) == {"a": 0, "b": 3}


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(1, 20),
    endpoints=st.integers(1, 5),
    records=st.lists(
        st.tuples(st.integers(0, 7), st.lists(st.integers(0, 200), max_size=30)), max_size=40
    ),
)
def test_index_never_holds_more_than_its_bound(
    cap: int, endpoints: int, records: list[tuple[int, list[int]]]
) -> None:
    index = PrefixIndex(blocks_per_endpoint=cap, max_endpoints=endpoints)
    for endpoint, blocks in records:
        index.record(f"e{endpoint}", blocks)
        assert len(index.endpoints()) <= endpoints
        assert len(index) <= cap * endpoints
        # the reverse map agrees with the per-endpoint LRUs
        held = {(e, b) for e in index.endpoints() for b in index._lru[e]}
        reverse = {b: es if isinstance(es, set) else {es} for b, es in index._holders.items()}
        assert held == {(e, b) for b, es in reverse.items() for e in es}


def test_index_memory_is_bounded_whatever_the_traffic() -> None:
    index = PrefixIndex(blocks_per_endpoint=2000, max_endpoints=8)
    rng = random.Random(1)
    tracemalloc.start()
    try:
        for i in range(400):  # 400 distinct 100-block prompts over 8 endpoints: 40k blocks
            index.record(f"e{i % 8}", [rng.getrandbits(64) for _ in range(100)])
        first, _ = tracemalloc.get_traced_memory()
        for i in range(400):
            index.record(f"e{i % 8}", [rng.getrandbits(64) for _ in range(100)])
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index) == 2000 * 8
    assert second < first * 1.1 + 200_000, (first, second)  # flat once full
    assert second < 16_000 * 300, second  # under 300 bytes per block held


def _picker(**config: object) -> Picker:
    picker = Picker(PickerConfig(**config), rng=random.Random(0))  # type: ignore[arg-type]
    picker.set_endpoints(["a:1", "b:1", "c:1"])
    return picker


def test_shared_prefix_goes_to_the_holder_until_it_is_saturated() -> None:
    picker = _picker(queue_limit=3)
    blocks = prompt_blocks("system prompt " * 100)
    first = picker.pick(blocks)
    holder = first.endpoints[0]
    tickets = [first.ticket]
    for _ in range(2):  # depth 1, 2: still the holder despite a longer queue
        again = picker.pick(blocks)
        assert again.endpoints[0] == holder, again.reason
        assert "prefix 1.00" in again.reason
        tickets.append(again.ticket)
    saturated = picker.pick(blocks)  # depth 3 = the limit: elsewhere
    assert saturated.endpoints[0] != holder and "1 saturated excluded" in saturated.reason
    for ticket in tickets:
        picker.finish(ticket)
    assert picker.pick(blocks).endpoints[0] in (holder, saturated.endpoints[0])


def test_a_deep_queue_gets_less() -> None:
    picker = _picker()
    picker.observe("a:1", ServerMetrics(waiting=6, running=1))
    chosen = [picker.pick().endpoints[0] for _ in range(30)]
    assert "a:1" not in chosen[:14], chosen  # b and c fill up to a's depth first
    assert chosen.count("a:1") < min(chosen.count("b:1"), chosen.count("c:1")), chosen
    scraped = picker.stats()["a:1"]
    assert scraped["depth"] == 7 + chosen.count("a:1")


def test_in_flight_counts_between_scrapes_and_a_scrape_resets_them() -> None:
    picker = _picker()
    picker.observe("a:1", ServerMetrics(waiting=0, running=0))
    pick = picker.pick(subset=["a:1"])
    assert picker.stats()["a:1"]["depth"] == 1
    picker.observe("a:1", ServerMetrics(waiting=0, running=1))  # the scrape saw it
    assert picker.stats()["a:1"]["depth"] == 1
    picker.finish(pick.ticket)
    picker.finish(pick.ticket)  # twice is harmless
    assert picker.stats()["a:1"]["in_flight"] == 0


def test_kv_cache_lora_and_session_scorers_steer() -> None:
    picker = _picker(weights=Weights(queue=0, kv_cache=1, prefix=0, lora=0, session=0))
    picker.observe("a:1", ServerMetrics(kv_cache=0.8))
    picker.observe("b:1", ServerMetrics(kv_cache=0.1))
    picker.observe("c:1", ServerMetrics(kv_cache=0.5))
    assert picker.pick().endpoints == ("b:1", "c:1", "a:1")
    lora = _picker(weights=Weights(queue=0, kv_cache=0, prefix=0, lora=1, session=0))
    lora.observe("c:1", ServerMetrics(loras_running=frozenset({"ad"}), max_lora=1))
    lora.observe("a:1", ServerMetrics(loras_running=frozenset({"x"}), max_lora=1))
    assert lora.pick(lora="ad").endpoints == ("c:1", "b:1", "a:1")
    sticky = _picker(weights=Weights(queue=1, kv_cache=0, prefix=0, lora=0, session=5))
    home = sticky.pick(session="s1").endpoints[0]
    assert all(sticky.pick(session="s1").endpoints[0] == home for _ in range(5))


def test_no_endpoint_is_503_and_all_saturated_sheds_429_or_takes_the_least_bad() -> None:
    assert Picker().pick().status == 503
    assert _picker().pick(subset=["z:9"]).status == 503
    shedding = _picker(shed=True, queue_limit=1)
    for endpoint in ("a:1", "b:1", "c:1"):
        shedding.observe(endpoint, ServerMetrics(waiting=1, running=0))
    assert shedding.pick().status == 429
    keeping = _picker(queue_limit=1)
    keeping.observe("a:1", ServerMetrics(waiting=5))
    keeping.observe("b:1", ServerMetrics(waiting=1))
    keeping.observe("c:1", ServerMetrics(waiting=3))
    pick = keeping.pick()
    assert pick.endpoints[0] == "b:1" and "3 saturated (all: least bad)" in pick.reason


def test_saturated_endpoints_left_out_are_said_in_the_reason() -> None:
    picker = _picker(queue_limit=2)
    picker.observe("a:1", ServerMetrics(waiting=5))
    picker.observe("b:1", ServerMetrics(waiting=2))
    picker.observe("c:1", ServerMetrics(waiting=0))
    pick = picker.pick()
    assert pick.endpoints[0] == "c:1" and [row[1] for row in pick.rows] == ["c:1"]
    assert pick.reason.startswith("c:1 total ") and "2 saturated excluded" in pick.reason
    assert "runner-up" not in pick.reason  # the only candidate


def test_a_pick_explains_itself() -> None:
    picker = _picker(fallbacks=1)
    pick = picker.pick(prompt_blocks("q" * 256), subset=["a:1", "b:1"])
    attributes = pick.explain()
    assert attributes["picker.winner"] == pick.endpoints[0]
    assert attributes["picker.fallbacks"] == pick.endpoints[1]
    assert set(attributes["picker.scores"]) == {"a:1", "b:1"}
    assert {"queue", "kv_cache", "prefix", "lora", "total", "depth"} <= set(
        attributes["picker.scores"]["a:1"]
    )
    assert "runner-up" in attributes["picker.reason"]


def test_removed_endpoints_are_forgotten() -> None:
    picker = _picker()
    blocks = prompt_blocks("p" * 640)
    holder = picker.pick(blocks).endpoints[0]
    picker.set_endpoints([e for e in ("a:1", "b:1", "c:1") if e != holder])
    assert holder not in picker.index.endpoints() and holder not in picker.endpoints()


def test_kv_cache_use_moves_with_requests_between_scrapes() -> None:
    picker = _picker()
    picker.observe("a:1", ServerMetrics(waiting=0, running=2, kv_cache=0.4))
    assert picker.stats()["a:1"]["kv_cache"] == pytest.approx(0.4)
    tickets = [picker.pick(subset=["a:1"]).ticket for _ in range(2)]
    assert picker.stats()["a:1"]["kv_cache"] == pytest.approx(0.8)  # 0.2 a request
    for ticket in tickets:
        picker.finish(ticket)
    picker.finish(picker.pick(subset=["a:1"]).ticket)
    picker.observe("a:1", ServerMetrics(waiting=0, running=2, kv_cache=0.4))
    assert picker.stats()["a:1"]["kv_cache"] == pytest.approx(0.4)


def test_requests_finished_since_the_scrape_leave_its_count() -> None:
    picker = _picker()
    tickets = [picker.pick(subset=["a:1"]).ticket for _ in range(3)]
    picker.observe("a:1", ServerMetrics(waiting=1, running=2))  # the scrape sees all three
    assert picker.stats()["a:1"]["depth"] == 3
    for ticket in tickets[:2]:
        picker.finish(ticket)
    assert picker.stats()["a:1"]["depth"] == 1  # not 3 until the next scrape
