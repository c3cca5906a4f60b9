"""Property: whatever the arrivals, every accepted request gets exactly one outcome and every
batch honours the limits (rows, bytes, one shape, FIFO within a shape, no expired work)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferway.backends.batching import (
    BatchingConfig,
    Dispatch,
    Pending,
    QueueFullError,
    RequestState,
    Scheduler,
    WaitUntil,
)

submit_op = st.tuples(
    st.just("submit"),
    st.integers(1, 4),  # rows
    st.sampled_from(["a", "b"]),  # shape key
    st.one_of(st.none(), st.floats(0.0005, 0.05)),  # deadline after arrival
    st.floats(0.0, 0.003),  # time step before it
    st.sampled_from([0, 0, 0, 1, 2]),  # idle instances when the executor asks right after
)
cancel_op = st.tuples(st.just("cancel"), st.integers(0, 200))
step_op = st.tuples(st.just("step"), st.floats(0.0, 0.01), st.integers(0, 3))
done_op = st.tuples(st.just("done"), st.floats(0.0001, 0.01))

configs = st.builds(
    BatchingConfig,
    mode=st.sampled_from(["off", "fixed", "adaptive"]),
    max_batch_size=st.integers(4, 8),
    max_queue_delay_s=st.sampled_from([0.0, 0.002, 0.01]),
    preferred_batch_sizes=st.sampled_from([(), (4,), (2, 4)]),
    latency_slo_s=st.floats(0.001, 0.05),
    max_queue_size=st.integers(1, 30),
    max_batch_bytes=st.sampled_from([None, 24, 200]),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=configs,
    ops=st.lists(
        st.one_of(submit_op, submit_op, cancel_op, step_op, done_op), min_size=20, max_size=100
    ),
    loop_busy=st.sampled_from([0.0, 0.5, 0.95]),  # 0.95: the fill_when_busy rule is on
)
def test_every_request_gets_exactly_one_outcome_and_batches_honour_limits(config, ops, loop_busy):
    s = Scheduler(config)
    s.loop_busy = loop_busy
    now = 0.0
    outcomes: dict[int, list[str]] = {}
    accepted: list[Pending] = []
    last_seq: dict[str, int] = {}
    next_id = 0

    def record(req: Pending, what: str) -> None:
        outcomes.setdefault(req.id, []).append(what)

    def drive(idle: int) -> None:
        for req in s.expire(now):
            assert req.deadline is not None and req.deadline <= now
            assert req.state is RequestState.EXPIRED
            record(req, "expired")
        while idle > 0:
            action = s.next_action(now, idle)
            if isinstance(action, WaitUntil):
                assert action.at > now
                # an idle instance never holds the oldest request past max_queue_delay_s
                oldest = min(r.arrival for r in accepted if r.state is RequestState.QUEUED)
                assert action.at <= oldest + config.max_queue_delay_s + 1e-9
            if not isinstance(action, Dispatch):
                break
            idle -= 1
            batch = action.requests
            assert batch and action.rows == sum(r.rows for r in batch)
            assert action.rows <= config.max_batch_size
            if config.max_batch_bytes is not None:
                assert action.nbytes <= config.max_batch_bytes
            assert len({r.shape_key for r in batch}) == 1
            if config.mode == "off":
                assert len(batch) == 1
            for r in batch:
                assert r.deadline is None or r.deadline > now, "expired request dispatched"
                assert r.seq > last_seq.get(r.shape_key, 0), "FIFO within a shape broken"
                last_seq[r.shape_key] = r.seq
                record(r, "dispatched")
        for req in s.expire(now):
            record(req, "expired")

    for op in ops:
        if op[0] == "submit":
            _, rows, key, ttl, dt, idle = op
            now += dt
            nbytes = rows * 8
            r = Pending(next_id, rows, nbytes, key, now, None if ttl is None else now + ttl)
            next_id += 1
            try:
                s.submit(r, now)
            except QueueFullError as exc:
                assert exc.retry_after_s > 0 and s.queued == config.max_queue_size
                record(r, "rejected")
                continue
            except ValueError:  # larger than one batch: refused up front
                assert config.max_batch_bytes is not None and nbytes > config.max_batch_bytes
                record(r, "rejected")
                continue
            accepted.append(r)
            drive(idle)
        elif op[0] == "cancel":
            if accepted:
                victim = accepted[op[1] % len(accepted)]
                if s.cancel(victim.id) is not None:
                    record(victim, "cancelled")
        elif op[0] == "step":
            now += op[1]
            drive(op[2])
        else:
            s.on_dispatch_done(4, op[1], now)
    # Drain: time passes, instances free up, until nothing is queued.
    for _ in range(10_000):
        if not s.queued:
            break
        now += 0.001
        drive(2)
    assert s.queued == 0 and s.queued_rows == 0
    assert sorted(outcomes) == list(range(next_id))
    for rid, seen in outcomes.items():
        assert len(seen) == 1, (rid, seen)
