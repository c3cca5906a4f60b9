"""Scheduler decisions, with a fake clock (times are plain numbers)."""

from __future__ import annotations

import pytest

from inferway.backends.batching import (
    IDLE,
    BatchingConfig,
    CostModel,
    Dispatch,
    InvalidRequestError,
    Pending,
    QueueFullError,
    RequestState,
    Scheduler,
    WaitUntil,
)


def req(i: int, at: float, *, rows: int = 1, key: str = "a", nbytes: int = 4, deadline=None):
    return Pending(i, rows, nbytes, key, at, deadline)


def ids(action) -> list[int]:
    assert isinstance(action, Dispatch), action
    return [r.id for r in action.requests]


def learned(a: float = 0.002, c: float = 0.0001) -> CostModel:
    model = CostModel()
    for b in (1, 2, 4, 8, 16, 32):
        model.observe(b, a + c * b)
    return model


def test_adaptive_dispatches_at_once_before_anything_is_learned():
    s = Scheduler(BatchingConfig(mode="adaptive"))
    s.submit(req(1, 0.0), 0.0)
    assert ids(s.next_action(0.0, 1)) == [1]
    assert s.next_action(0.0, 1) is IDLE


def test_adaptive_dispatches_at_once_at_low_load():
    s = Scheduler(BatchingConfig(mode="adaptive", max_queue_delay_s=0.05), learned())
    for i in range(5):  # 10 requests/s: waiting for the next one never pays off
        t = i * 0.1
        s.submit(req(i, t), t)
        assert ids(s.next_action(t, 1)) == [i]


def test_adaptive_waits_for_more_rows_under_high_load_within_the_slo():
    cfg = BatchingConfig(mode="adaptive", max_queue_delay_s=0.05, latency_slo_s=0.02)
    s = Scheduler(cfg, learned())
    for i in range(3):  # 10,000 requests/s
        t = i * 0.0001
        s.submit(req(i, t), t)
        s.next_action(t, 0)  # instance busy: they queue
    t = 0.0002
    action = s.next_action(t, 1)
    assert isinstance(action, WaitUntil)
    assert t < action.at <= 0.0 + cfg.latency_slo_s
    s.submit(req(3, 0.0003), 0.0003)
    assert isinstance(s.next_action(0.0003, 1), WaitUntil)
    # when arrivals stop, waiting stops paying off long before the SLO
    final = s.next_action(0.003, 1)
    assert ids(final) == [0, 1, 2, 3]


def test_adaptive_never_holds_longer_than_max_queue_delay():
    cfg = BatchingConfig(mode="adaptive", max_queue_delay_s=0.001, latency_slo_s=1.0)
    s = Scheduler(cfg, learned())
    for i in range(5):
        s.submit(req(i, i * 0.0001), i * 0.0001)
    action = s.next_action(0.0005, 1)
    assert isinstance(action, WaitUntil) and action.at <= 0.001
    assert ids(s.next_action(0.001, 1)) == [0, 1, 2, 3, 4]


def test_fixed_window_waits_up_to_max_queue_delay():
    s = Scheduler(BatchingConfig(mode="fixed", max_batch_size=8, max_queue_delay_s=0.005))
    s.submit(req(1, 0.0), 0.0)
    assert s.next_action(0.0, 1) == WaitUntil(0.005)
    s.submit(req(2, 0.003), 0.003)
    assert s.next_action(0.003, 1) == WaitUntil(0.005)
    assert ids(s.next_action(0.005, 1)) == [1, 2]


def test_fixed_dispatches_a_full_batch_without_waiting():
    s = Scheduler(BatchingConfig(mode="fixed", max_batch_size=4, max_queue_delay_s=1.0))
    for i in range(6):
        s.submit(req(i, 0.0), 0.0)
    assert ids(s.next_action(0.0, 1)) == [0, 1, 2, 3]
    assert isinstance(s.next_action(0.0, 1), WaitUntil)


def test_max_batch_size_counts_rows_not_requests():
    s = Scheduler(BatchingConfig(mode="fixed", max_batch_size=8, max_queue_delay_s=0.0))
    for i in range(3):
        s.submit(req(i, 0.0, rows=3), 0.0)
    first = s.next_action(0.0, 1)
    assert ids(first) == [0, 1] and first.rows == 6
    assert ids(s.next_action(0.0, 1)) == [2]


def test_byte_budget_caps_a_batch():
    cfg = BatchingConfig(
        mode="fixed", max_batch_size=64, max_queue_delay_s=0.0, max_batch_bytes=100
    )
    s = Scheduler(cfg)
    for i in range(5):
        s.submit(req(i, 0.0, nbytes=40), 0.0)
    batches = [s.next_action(0.0, 1) for _ in range(3)]
    assert [ids(b) for b in batches] == [[0, 1], [2, 3], [4]]
    assert all(b.nbytes <= 100 for b in batches)


def test_request_larger_than_a_batch_is_refused_at_submit():
    s = Scheduler(BatchingConfig(max_batch_size=4, max_batch_bytes=10))
    with pytest.raises(InvalidRequestError, match="max_batch_size 4"):
        s.submit(req(1, 0.0, rows=5), 0.0)
    with pytest.raises(InvalidRequestError, match="max_batch_bytes 10"):
        s.submit(req(2, 0.0, nbytes=11), 0.0)
    s.submit(req(3, 0.0), 0.0)
    with pytest.raises(InvalidRequestError, match="already queued"):
        s.submit(req(3, 0.0), 0.0)


def test_preferred_size_is_dispatched_as_soon_as_it_can_be_formed():
    cfg = BatchingConfig(
        mode="fixed", max_batch_size=16, max_queue_delay_s=1.0, preferred_batch_sizes=(2, 4)
    )
    s = Scheduler(cfg)
    for i in range(5):
        s.submit(req(i, 0.0), 0.0)
    assert ids(s.next_action(0.0, 1)) == [0, 1, 2, 3]  # the largest preferred size
    assert s.next_action(0.0, 1) == WaitUntil(1.0)  # 1 row left: not preferred, wait
    s.submit(req(5, 0.1), 0.1)
    assert ids(s.next_action(0.1, 1)) == [4, 5]


def test_shapes_are_never_mixed_and_the_oldest_head_goes_first():
    s = Scheduler(BatchingConfig(mode="fixed", max_batch_size=8, max_queue_delay_s=0.0))
    s.submit(req(1, 0.0, key="b"), 0.0)
    s.submit(req(2, 0.1, key="a"), 0.1)
    s.submit(req(3, 0.2, key="b"), 0.2)
    s.submit(req(4, 0.3, key="a"), 0.3)
    first, second = s.next_action(0.3, 1), s.next_action(0.3, 1)
    assert ids(first) == [1, 3] and ids(second) == [2, 4]
    assert {r.shape_key for r in first.requests} == {"b"}


def test_off_mode_runs_every_request_alone():
    s = Scheduler(BatchingConfig(mode="off"))
    for i in range(3):
        s.submit(req(i, 0.0), 0.0)
    assert [ids(s.next_action(0.0, 1)) for _ in range(3)] == [[0], [1], [2]]


def test_expired_requests_are_dropped_before_compute():
    s = Scheduler(BatchingConfig(mode="fixed", max_queue_delay_s=0.01))
    s.submit(req(1, 0.0, deadline=0.004), 0.0)
    s.submit(req(2, 0.0, deadline=0.5), 0.0)
    assert s.next_action(0.0, 1) == WaitUntil(0.004)  # woken for the deadline, not the window
    expired = s.expire(0.004)
    assert [r.id for r in expired] == [1] and expired[0].state is RequestState.EXPIRED
    assert ids(s.next_action(0.01, 1)) == [2]
    assert s.expire(1.0) == []


def test_next_action_sets_expired_requests_aside_for_expire():
    s = Scheduler(BatchingConfig(mode="fixed", max_queue_delay_s=0.0))
    s.submit(req(1, 0.0, deadline=0.001), 0.0)
    s.submit(req(2, 0.0), 0.0)
    assert ids(s.next_action(0.002, 1)) == [2]
    assert [r.id for r in s.expire(0.002)] == [1]


def test_cancelled_requests_are_never_dispatched():
    s = Scheduler(BatchingConfig(mode="fixed", max_queue_delay_s=0.0))
    for i in range(3):
        s.submit(req(i, 0.0), 0.0)
    cancelled = s.cancel(1)
    assert cancelled is not None and cancelled.state is RequestState.CANCELLED
    assert s.cancel(1) is None and s.queued == 2
    assert ids(s.next_action(0.0, 1)) == [0, 2]
    assert s.cancel(0) is None  # already dispatched


def test_full_queue_rejects_with_a_retry_after_estimate():
    cfg = BatchingConfig(mode="fixed", max_queue_size=2, max_batch_size=2)
    s = Scheduler(cfg, learned())
    s.submit(req(1, 0.0), 0.0)
    s.submit(req(2, 0.0), 0.0)
    with pytest.raises(QueueFullError) as info:
        s.submit(req(3, 0.0), 0.0)
    assert 0 < info.value.retry_after_s <= 60
    assert info.value.queue_size == 2 and "queue full" in str(info.value)
    assert s.queued == 2  # the rejected request left no trace
    s.next_action(0.0, 1)
    s.submit(req(3, 0.0), 0.0)


def test_busy_instances_hold_dispatch_and_several_idle_ones_take_batches_in_turn():
    s = Scheduler(BatchingConfig(mode="fixed", max_batch_size=2, max_queue_delay_s=0.0))
    for i in range(5):
        s.submit(req(i, 0.0, deadline=9.0), 0.0)
    assert s.next_action(0.0, 0) == WaitUntil(9.0)
    assert ids(s.next_action(0.0, 2)) == [0, 1]
    assert ids(s.next_action(0.0, 1)) == [2, 3]
    assert s.next_action(0.0, 0) == WaitUntil(9.0)


def test_cost_model_learns_affine_cost_and_extrapolates():
    model = learned(0.002, 0.0001)
    a, c = model.affine()
    assert a == pytest.approx(0.002) and c == pytest.approx(0.0001)
    assert model.predict(64) == pytest.approx(0.0084)
    one = CostModel()
    assert one.predict(4) is None
    one.observe(4, 0.004)
    assert one.predict(2) == 0.004 and one.predict(8) == pytest.approx(0.008)
