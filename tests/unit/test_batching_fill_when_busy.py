"""The adaptive scheduler's fill_when_busy rule: while the event loop limits throughput, an
idle instance waits for fuller batches, within the same latency limits (fake clock)."""

from __future__ import annotations

from inferway.backends.batching import BatchingConfig, CostModel, Dispatch, Pending, Scheduler
from inferway.backends.batching.loop_load import LOOP_BUSY
from inferway.backends.batching.records import WaitUntil


def learned() -> CostModel:
    """A tiny model: 2 ms of fixed cost, 0.1 ms a row."""
    model = CostModel()
    for b in (1, 2, 4, 8, 16, 32):
        model.observe(b, 0.002 + 0.0001 * b)
    return model


def scheduler(*, busy: float, fill: bool = True, slo: float = 0.05) -> Scheduler[Pending]:
    cfg = BatchingConfig(
        mode="adaptive", max_queue_delay_s=0.05, latency_slo_s=slo, fill_when_busy=fill
    )
    s: Scheduler[Pending] = Scheduler(cfg, learned())
    s.loop_busy = busy
    return s


def arrive(s: Scheduler[Pending], count: int, gap: float, start: float = 0.0) -> float:
    """``count`` one-row requests ``gap`` apart while the instance is busy; the last time."""
    t = start
    for i in range(count):
        t = start + i * gap
        s.submit(Pending(i, 1, 4, "a", t, None), t)
        s.next_action(t, 0)
    return t


def test_a_busy_loop_waits_where_the_instance_time_rule_would_dispatch():
    # 250 requests/s: waiting 4 ms for a second row costs the instance more than it saves, so
    # with a loop to spare the batch goes at once
    calm = scheduler(busy=0.2)
    t = arrive(calm, 3, 0.004)
    assert isinstance(calm.next_action(t, 1), Dispatch)
    # the loop limits: the idle instance waits for the next request
    busy = scheduler(busy=LOOP_BUSY + 0.05)
    t = arrive(busy, 3, 0.004)
    action = busy.next_action(t, 1)
    assert isinstance(action, WaitUntil)
    assert action.at > t
    assert busy.filled == 1


def test_filling_is_off_below_the_threshold_and_when_disabled():
    for s in (scheduler(busy=LOOP_BUSY - 0.01), scheduler(busy=1.0, fill=False)):
        t = arrive(s, 3, 0.004)
        assert isinstance(s.next_action(t, 1), Dispatch)
        assert s.filled == 0


def test_filling_stops_when_requests_stop_coming():
    s = scheduler(busy=1.0)
    t = arrive(s, 3, 0.001)
    assert isinstance(s.next_action(t + 0.0015, 1), WaitUntil)  # within two mean gaps
    action = s.next_action(t + 0.0025, 1)  # silent for more than two mean gaps
    assert isinstance(action, Dispatch)
    assert action.rows == 3


def test_filling_keeps_the_latency_limit():
    # a 10 ms SLO: the head arrived at 0 and a 4-row batch takes ~2.4 ms (x1.25 safety), so
    # by 7 ms waiting for one more arrival would break the limit
    s = scheduler(busy=1.0, slo=0.010)
    t = arrive(s, 3, 0.001)
    assert isinstance(s.next_action(t, 1), WaitUntil)
    s.submit(Pending(99, 1, 4, "a", 0.006, None), 0.006)
    s.next_action(0.006, 0)
    action = s.next_action(0.007, 1)
    assert isinstance(action, Dispatch)
    assert action.rows == 4


def test_filling_never_holds_past_max_queue_delay():
    cfg = BatchingConfig(mode="adaptive", max_queue_delay_s=0.003, latency_slo_s=1.0)
    s: Scheduler[Pending] = Scheduler(cfg, learned())
    s.loop_busy = 1.0
    t = arrive(s, 3, 0.001)  # a steady stream, 1 ms apart, never silent
    action = s.next_action(t, 1)
    assert isinstance(action, WaitUntil)
    assert action.at <= 0.003 + 1e-12  # the head arrived at 0
    s.submit(Pending(3, 1, 4, "a", 0.003, None), 0.003)
    action = s.next_action(0.003, 1)
    assert isinstance(action, Dispatch)
    assert action.rows == 4


def test_a_lone_request_never_waits_however_busy_the_loop():
    s = scheduler(busy=1.0)
    t = arrive(s, 2, 0.004)  # 4 ms apart: as in the first test, filling alone would wait
    assert isinstance(s.next_action(t + 0.009, 1), Dispatch)  # silent: both go
    s.submit(Pending(7, 1, 4, "a", t + 0.0091, None), t + 0.0091)
    action = s.next_action(t + 0.0091, 1)
    assert isinstance(action, Dispatch)
    assert action.rows == 1
    assert s.filled == 0
