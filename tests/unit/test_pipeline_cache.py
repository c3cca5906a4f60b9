"""The step-result cache on a fake clock: hits and misses, the byte budget (least recently
used first), the time to live, and a content-hash key that sees every byte, dtype and shape."""

from __future__ import annotations

import numpy as np
import pytest

from inferway.backends.pipelines.cache import StepCache, build_cache_key
from inferway.backends.pipelines.moe import combine_experts, route_top_k


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _out(n: int, value: float = 1.0) -> dict[str, np.ndarray]:
    return {"y": np.full(n, value, dtype=np.float32)}  # 4 * n bytes


def test_a_hit_returns_what_was_put_read_only_and_counts() -> None:
    evictions: list[str] = []
    cache = StepCache(1000, 10, clock=Clock(), on_evict=lambda r, n: evictions.append(r))
    assert cache.get(b"k") is None
    out = _out(4)
    assert cache.put(b"k", out)
    out["y"][:] = 9  # the caller's array changes later: the cached copy does not
    hit = cache.get(b"k")
    assert hit is not None and hit["y"].tolist() == [1.0] * 4
    with pytest.raises(ValueError):
        hit["y"][0] = 2
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    assert cache.nbytes == 16 + 1 and evictions == []


def test_the_byte_budget_evicts_the_least_recently_used() -> None:
    evictions: list[str] = []
    cache = StepCache(100, 10, clock=Clock(), on_evict=lambda r, n: evictions.append(r))
    for key in (b"a", b"b", b"c"):
        assert cache.put(key, _out(7))  # 28 + 1 bytes each: three fit in 100
    assert cache.get(b"a") is not None  # a is now the most recently used
    assert cache.put(b"d", _out(7))
    assert cache.get(b"b") is None and cache.get(b"a") is not None
    assert evictions == ["budget"] and cache.stats.evicted_budget == 1
    assert cache.nbytes <= 100


def test_a_result_larger_than_the_budget_is_not_kept() -> None:
    cache = StepCache(10, 10, clock=Clock())
    assert not cache.put(b"k", _out(4))
    assert len(cache) == 0 and cache.nbytes == 0


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    evictions: list[str] = []
    cache = StepCache(1000, 5, clock=clock, on_evict=lambda r, n: evictions.append(r))
    cache.put(b"k", _out(1))
    clock.now += 4.9
    assert cache.get(b"k") is not None
    clock.now += 0.2
    assert cache.get(b"k") is None
    assert evictions == ["expired"] and cache.nbytes == 0


def test_expired_entries_make_room_before_the_budget_evicts_live_ones() -> None:
    clock = Clock()
    evictions: list[str] = []
    cache = StepCache(70, 5, clock=clock, on_evict=lambda r, n: evictions.append(r))
    cache.put(b"old", _out(7))
    clock.now += 6
    cache.put(b"new", _out(7))
    cache.put(b"newer", _out(7))
    assert evictions == ["expired"]
    assert cache.get(b"new") is not None and cache.get(b"newer") is not None


def test_replacing_a_key_keeps_the_byte_count_right() -> None:
    cache = StepCache(1000, 10, clock=Clock())
    cache.put(b"k", _out(4))
    cache.put(b"k", _out(8))
    assert len(cache) == 1 and cache.nbytes == 32 + 1


def test_the_key_sees_bytes_dtype_shape_names_and_identity() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    base = build_cache_key(("p", "s", "m", "1"), {"x": x})
    assert build_cache_key(("p", "s", "m", "1"), {"x": x.copy()}) == base
    assert build_cache_key(("p", "s", "m", "1"), {"x": np.asfortranarray(x)}) == base
    changed = x.copy()
    changed[1, 2] += 1
    others = [
        build_cache_key(("p", "s", "m", "1"), {"x": changed}),
        build_cache_key(("p", "s", "m", "1"), {"x": x.reshape(3, 2)}),
        build_cache_key(("p", "s", "m", "1"), {"x": x.astype(np.float64)}),
        build_cache_key(("p", "s", "m", "1"), {"z": x}),
        build_cache_key(("p", "s", "m", "2"), {"x": x}),
    ]
    assert len({base, *others}) == 6


def test_bytes_tensors_are_hashed_by_content() -> None:
    a = np.array([b"ab", b"c"], dtype=object)
    b = np.array([b"a", b"bc"], dtype=object)
    assert build_cache_key((), {"t": a}) != build_cache_key((), {"t": b})
    assert build_cache_key((), {"t": a}) == build_cache_key((), {"t": a.copy()})


def test_top_k_routing_picks_the_best_experts_and_normalises_weights() -> None:
    scores = np.array([[0.0, 2.0, 1.0], [5.0, 5.0, 0.0], [1.0, 0.0, 3.0]], dtype=np.float32)
    routing = route_top_k(scores, 2)
    assert routing.chosen.tolist() == [[1, 2], [0, 1], [2, 0]]  # ties: lower index first
    np.testing.assert_allclose(routing.weights.sum(axis=1), 1.0)
    np.testing.assert_allclose(routing.weights[0], np.exp([2, 1]) / np.exp([2, 1]).sum())
    assert routing.rows_of(0).tolist() == [1, 2] and routing.rows_of(1).tolist() == [0, 1]
    summed = route_top_k(np.array([[3.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), 2, "sum")
    np.testing.assert_allclose(summed.weights, [[0.75, 0.25], [0.5, 0.5]])


def test_experts_combine_by_their_weight_per_row() -> None:
    scores = np.array([[0.0, 9.0, 0.0], [1.0, 1.0, 0.0]], dtype=np.float32)
    routing = route_top_k(scores, 2, "softmax")
    outputs = {
        e: (routing.rows_of(e), np.full((len(routing.rows_of(e)), 2), float(e + 1), np.float32))
        for e in range(3)
        if len(routing.rows_of(e))
    }
    combined = combine_experts(routing, outputs, 2)
    w = routing.weights
    np.testing.assert_allclose(combined[0], w[0, 0] * 2 + w[0, 1] * 1, rtol=1e-6)  # experts 1, 0
    np.testing.assert_allclose(combined[1], [1.5, 1.5], rtol=1e-6)  # experts 0 and 1, equal


def test_routing_refuses_bad_scores() -> None:
    with pytest.raises(ValueError, match="must be \\[rows, experts\\]"):
        route_top_k(np.zeros(3), 1)
    with pytest.raises(ValueError, match=r"top_k 4 must lie in 1\.\.3"):
        route_top_k(np.zeros((1, 3)), 4)
    with pytest.raises(ValueError, match="non-negative"):
        route_top_k(-np.ones((1, 3)), 1, "sum")
