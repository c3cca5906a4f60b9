"""Where a batch computes (``compute_thread``): on one CPU a CPU model's batches of 5-50 ms, and
shorter ones expected to end before the next request arrives, run on the event loop's thread;
with more CPUs, on a GPU, for a longer batch, a shorter one while requests keep arriving, or one
that would outlast a queued request's deadline, on the instance's worker thread."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Mapping

import numpy as np
import pytest

from inferway.backends.batching import BatchExecutor, BatchingConfig
from inferway.backends.batching.cost_model import CostModel
from inferway.backends.batching.cpu_allowance import CpuAllowance
from inferway.backends.batching.errors import DeadlineExceededError
from inferway.backends.batching.placement import INLINE_BELOW_S, ONE_CPU_INLINE_S, BatchPlacement
from inferway.backends.batching.shared_loop import LoopMember, SharedLoop
from inferway.backends.runners.base import TensorSpec

COMPUTE_S = 0.015
"""Each batch's compute: inside the one-CPU band (5-50 ms)."""


class BusyRunner:
    """y = x + 1 after ``delay`` seconds; remembers the thread of every batch."""

    inputs = (TensorSpec("x", "FP32", (-1, 2)),)
    outputs = (TensorSpec("y", "FP32", (-1, 2)),)

    def __init__(self, provider: str = "CPUExecutionProvider", delay: float = COMPUTE_S) -> None:
        self.provider = provider
        self.delay = delay
        self.threads: list[int] = []

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        time.sleep(self.delay)
        return {"y": inputs["x"] + 1}

    def close(self) -> None:
        pass


def _allowance(cpus: float) -> CpuAllowance:
    return CpuAllowance(lambda: cpus)


async def _serve(
    runner: BusyRunner, cpus: float | None, compute_thread: str = "auto", n: int = 5
) -> BatchExecutor:
    """``n`` requests one after another (the first teaches the cost model)."""
    config = BatchingConfig(mode="off", compute_thread=compute_thread)  # type: ignore[arg-type]
    allowance = None if cpus is None else _allowance(cpus)
    ex = BatchExecutor([runner], config, cpu_allowance=allowance)
    for i in range(n):
        x = np.full((1, 2), i, np.float32)
        out = await ex.infer({"x": x})
        np.testing.assert_array_equal(out["y"], x + 1)
    return ex


async def test_one_cpu_runs_a_cpu_models_batches_on_the_loop_once_their_cost_is_known() -> None:
    runner = BusyRunner()
    ex = await _serve(runner, cpus=1)
    loop = threading.get_ident()
    assert runner.threads[0] != loop  # nothing learned yet: the worker
    assert runner.threads[1:] == [loop] * 4
    assert ex.batches_on_loop == 4
    await ex.stop()


@pytest.mark.parametrize("cpus", [2, 1.5, None])
async def test_more_than_one_cpu_or_no_allowance_keeps_batches_on_the_worker(
    cpus: float | None,
) -> None:
    runner = BusyRunner()
    ex = await _serve(runner, cpus=cpus)
    assert threading.get_ident() not in runner.threads
    assert ex.batches_on_loop == 0
    await ex.stop()


async def test_a_half_cpu_quota_counts_as_one_cpu() -> None:
    runner = BusyRunner()
    ex = await _serve(runner, cpus=0.5)
    assert runner.threads[1:] == [threading.get_ident()] * 4
    await ex.stop()


async def test_a_gpu_runner_keeps_its_batches_on_the_worker_on_one_cpu() -> None:
    runner = BusyRunner(provider="CUDAExecutionProvider")
    ex = await _serve(runner, cpus=1)
    assert threading.get_ident() not in runner.threads
    await ex.stop()


async def test_a_batch_longer_than_the_band_stays_on_the_worker_on_one_cpu() -> None:
    runner = BusyRunner(delay=ONE_CPU_INLINE_S[1] * 1.2)
    ex = await _serve(runner, cpus=1, n=3)
    assert threading.get_ident() not in runner.threads
    await ex.stop()


@pytest.mark.parametrize("delay", [INLINE_BELOW_S * 5, ONE_CPU_INLINE_S[0] / 3])
async def test_a_lone_clients_shorter_batches_go_on_the_loop_on_one_cpu(delay: float) -> None:
    """Requests one after another: each batch ends before the next request comes, so the
    worker would have nothing to overlap with (the quiet rule), on one CPU only."""
    runner = BusyRunner(delay=delay)
    ex = await _serve(runner, cpus=1, n=4)
    loop = threading.get_ident()
    assert runner.threads[0] != loop and runner.threads[1:] == [loop] * 3
    await ex.stop()
    runner = BusyRunner(delay=delay)
    ex = await _serve(runner, cpus=2, n=4)
    assert loop not in runner.threads
    await ex.stop()


def _placement(
    cost_s: float, gap_s: float | None, cpus: float = 1, provider: str = "CPUExecutionProvider"
) -> BatchPlacement:
    """``auto`` placement of a model whose one-row batch costs ``cost_s`` and whose requests
    come every ``gap_s`` on average."""
    cost = CostModel()
    cost.observe(1, cost_s)
    return BatchPlacement(
        "auto",
        [BusyRunner(provider)],
        cost,
        arrival_gap=lambda: gap_s,
        cpu_allowance=_allowance(cpus),
    )


@pytest.mark.parametrize(
    ("cost_s", "gap_s", "on_loop"),
    [
        (INLINE_BELOW_S * 2, INLINE_BELOW_S * 3, True),  # ends before the next request
        (INLINE_BELOW_S * 2, INLINE_BELOW_S * 1.5, False),  # requests arrive meanwhile
        (INLINE_BELOW_S * 2, INLINE_BELOW_S * 2, False),  # at the same time: the worker
        (ONE_CPU_INLINE_S[0] / 2, None, True),  # no gap yet (one request so far)
        (INLINE_BELOW_S / 2, 0.0, True),  # quick: the loop whatever arrives
        (ONE_CPU_INLINE_S[0] * 2, 0.0, True),  # in the band: the loop whatever arrives
        (ONE_CPU_INLINE_S[1] * 2, None, False),  # too long to hold the loop
    ],
)
def test_the_quiet_rule_on_one_cpu(cost_s: float, gap_s: float | None, on_loop: bool) -> None:
    assert _placement(cost_s, gap_s).on_loop(1, 0.0) is on_loop


@pytest.mark.parametrize(("cpus", "provider"), [(2, "CPUExecutionProvider"), (1, "CUDA")])
def test_the_quiet_rule_needs_one_cpu_and_a_cpu_model(cpus: float, provider: str) -> None:
    assert _placement(INLINE_BELOW_S * 2, None, cpus, provider).on_loop(1, 0.0) is False


def test_a_quiet_batch_still_yields_to_a_queued_deadline() -> None:
    cost = CostModel()
    cost.observe(1, INLINE_BELOW_S * 2)
    deadline = [0.0001]
    placement = BatchPlacement(
        "auto",
        [BusyRunner()],
        cost,
        next_deadline=lambda: deadline[0],
        arrival_gap=lambda: 1.0,
        cpu_allowance=_allowance(1),
    )
    assert placement.on_loop(1, 0.0) is False  # the batch would end after the deadline
    deadline[0] = 1.0
    assert placement.on_loop(1, 0.0) is True


async def test_the_quiet_rule_reads_the_models_mean_gap_not_a_silence() -> None:
    """The executor's placement reads its scheduler's arrival estimate: requests every 0.5 ms
    keep a 1 ms batch on the worker, even after a silence (under many closed-loop clients a
    silence means they all wait for answers); requests every 100 ms let it on the loop."""
    ex = BatchExecutor([BusyRunner()], BatchingConfig(mode="off"), cpu_allowance=_allowance(1))
    ex.scheduler.cost_model.observe(1, 0.001)
    arrivals = ex.scheduler.arrivals
    for t in (0.0, 0.0005, 0.001, 0.0015):
        arrivals.observe(1, t)
    placement = ex._placement
    assert placement.on_loop(1, 0.0015) is False
    assert placement.on_loop(1, 1.0) is False  # a second of silence changes nothing
    for t in (0.1, 0.2, 0.3):
        arrivals.observe(1, t)
    assert placement.on_loop(1, 0.3) is True
    await ex.stop()


async def test_worker_and_loop_settings_override_the_allowance() -> None:
    on_worker = BusyRunner()
    ex = await _serve(on_worker, cpus=1, compute_thread="worker")
    assert threading.get_ident() not in on_worker.threads
    await ex.stop()
    on_loop = BusyRunner(provider="CUDAExecutionProvider")
    ex = await _serve(on_loop, cpus=4, compute_thread="loop")
    # "loop" needs no cost learned first: every batch, the first one too
    assert on_loop.threads == [threading.get_ident()] * 5
    assert ex.batches_on_loop == 5
    await ex.stop()


async def test_the_allowance_is_asked_again_as_it_changes() -> None:
    cpus = [2.0]
    now = [0.0]
    allowance = CpuAllowance(lambda: cpus[0], clock=lambda: now[0], every_s=1.0)
    runner = BusyRunner()
    ex = BatchExecutor([runner], BatchingConfig(mode="off"), cpu_allowance=allowance)
    x = {"x": np.zeros((1, 2), np.float32)}
    for _ in range(2):
        await ex.infer(x)
    cpus[0] = 1.0  # e.g. `taskset -p` on the running server
    now[0] = 1.0
    await ex.infer(x)
    loop = threading.get_ident()
    assert runner.threads[1] != loop and runner.threads[2] == loop
    await ex.stop()


def test_compute_thread_rejects_an_unknown_place() -> None:
    with pytest.raises(ValueError, match="compute_thread"):
        BatchingConfig(compute_thread="gpu")  # type: ignore[arg-type]


async def test_each_batch_span_names_the_thread_it_computed_on() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = BatchingConfig(mode="off")
    ex = BatchExecutor(
        [BusyRunner()], config, name="placed", tracer_provider=provider, cpu_allowance=_allowance(1)
    )
    for _ in range(3):
        await ex.infer({"x": np.zeros((1, 2), np.float32)})
    await ex.stop()
    threads = [s.attributes["batch.thread"] for s in exporter.get_finished_spans()]
    assert threads == ["worker", "loop", "loop"]  # the first teaches the cost model


@pytest.mark.parametrize(("timeout", "on_loop"), [(COMPUTE_S / 3, False), (1.0, True)])
async def test_a_batch_that_would_outlast_a_queued_deadline_goes_to_the_worker(
    timeout: float, on_loop: bool
) -> None:
    """The loop answers a queued request's timeout: a batch expected to end after that
    deadline does not hold the loop (one CPU, a batch in the band)."""
    runner = BusyRunner()
    ex = await _serve(runner, cpus=1, n=2)  # the cost is learned: batches of one go on the loop
    x = {"x": np.zeros((1, 2), np.float32)}
    first = ex.submit(x)  # max batch 1 (mode off): the second request stays queued
    second = ex.submit(x, timeout=timeout)
    await asyncio.wait([first, second])
    assert (runner.threads[2] == threading.get_ident()) is on_loop
    assert first.result()["y"][0, 0] == 1
    if on_loop:
        assert second.result()["y"][0, 0] == 1
    else:
        assert isinstance(second.exception(), DeadlineExceededError)
    await ex.stop()


async def test_a_near_deadline_of_another_model_on_the_loop_keeps_the_batch_off_it() -> None:
    """Two models share the loop (and a SharedLoop, as app.py gives them): a queued
    request of the second, with a near deadline, keeps the first model's batch on its worker;
    once the second model stops, its queue no longer counts."""
    shared = SharedLoop()
    runner, other = BusyRunner(), BusyRunner()
    config = BatchingConfig(mode="off")
    ex = BatchExecutor([runner], config, cpu_allowance=_allowance(1), shared_loop=shared)
    blocker = BatchExecutor([other], config, shared_loop=shared)
    x = {"x": np.zeros((1, 2), np.float32)}
    for _ in range(2):  # the first model's cost is learned: its batches go on the loop
        await ex.infer(x)
    held = blocker.submit(x)  # computing on the other model's worker
    waiting = blocker.submit(x, timeout=COMPUTE_S / 3)  # queued behind it, deadline near
    await ex.infer(x)
    loop = threading.get_ident()
    assert runner.threads[2] != loop
    await asyncio.wait([held, waiting])
    assert isinstance(waiting.exception(), DeadlineExceededError)
    assert len(shared) == 2
    await blocker.stop()
    assert len(shared) == 1  # the stopped model's queue is forgotten
    await ex.infer(x)
    assert runner.threads[3] == loop
    await ex.stop()
    assert len(shared) == 0


def test_the_shared_loop_gives_the_earliest_deadline_across_the_models() -> None:
    shared = SharedLoop()
    assert shared.earliest_deadline() is None
    first: list[float | None] = [None]
    second: list[float | None] = [5.0]
    shared.join(LoopMember(lambda: first[0]))
    member = LoopMember(lambda: second[0])
    shared.join(member)
    assert shared.earliest_deadline() == 5.0
    first[0] = 2.0
    assert shared.earliest_deadline() == 2.0
    first[0] = None
    shared.leave(member)
    shared.leave(member)  # twice: ignored
    assert shared.earliest_deadline() is None


def test_the_shared_loop_sums_the_other_models_rates() -> None:
    shared = SharedLoop()
    waits = {"a": 0.01, "b": 0.004, "c": math.inf}
    members = {
        name: LoopMember(lambda: None, lambda now, name=name: waits[name])  # type: ignore[misc]
        for name in waits
    }
    for member in members.values():
        shared.join(member)
    assert shared.others_rate(members["a"], 0.0) == pytest.approx(250.0)  # b alone; c unknown
    assert shared.others_rate(members["c"], 0.0) == pytest.approx(350.0)
    waits["b"] = 0.0  # expected at once
    assert shared.others_rate(members["a"], 0.0) == math.inf
    shared.leave(members["b"])
    assert shared.others_rate(members["a"], 0.0) == 0.0


@pytest.mark.parametrize(
    ("other_wait_s", "on_loop"),
    [
        (math.inf, True),  # the other model has had no requests
        (INLINE_BELOW_S * 20, True),  # its requests are rarer than the batch is long
        (INLINE_BELOW_S * 1.5, False),  # one is expected before the batch ends
    ],
)
def test_the_quiet_rule_counts_the_other_models_requests(
    other_wait_s: float, on_loop: bool
) -> None:
    """The loop reads every model's requests: a quiet model's batch stays off it while another
    model on the same loop expects a request before the batch would end."""
    shared = SharedLoop()
    shared.join(LoopMember(lambda: None, lambda now: other_wait_s))
    cost = CostModel()
    cost.observe(1, INLINE_BELOW_S * 2)
    placement = BatchPlacement(
        "auto",
        [BusyRunner()],
        cost,
        arrival_gap=lambda: 1.0,  # the model's own requests: one a second
        shared_loop=shared,
        cpu_allowance=_allowance(1),
    )
    assert placement.on_loop(1, 0.0) is on_loop


async def test_the_other_models_rate_falls_with_their_silence() -> None:
    """Two executors on one SharedLoop: requests every 0.2 ms to the second keep the first's
    quiet 1 ms batch off the loop; once the second has been silent for a second, it no longer
    counts (unlike the model's own mean gap, which a silence does not change), nor once it has
    stopped."""
    shared = SharedLoop()
    config = BatchingConfig(mode="off")
    ex = BatchExecutor([BusyRunner()], config, cpu_allowance=_allowance(1), shared_loop=shared)
    other = BatchExecutor([BusyRunner()], config, shared_loop=shared)
    ex.scheduler.cost_model.observe(1, 0.001)
    for t in (0.0, 0.5):
        ex.scheduler.arrivals.observe(1, t)  # its own requests: one every 0.5 s
    for t in (0.5, 0.5002, 0.5004, 0.5006):
        other.scheduler.arrivals.observe(1, t)
    placement = ex._placement
    assert placement.on_loop(1, 0.5006) is False
    assert placement.on_loop(1, 0.5008) is False  # a short silence: still expected
    assert placement.on_loop(1, 1.5) is True  # the other model silent for a second
    await other.stop()
    for t in (1.5, 1.5002, 1.5004):
        other.scheduler.arrivals.observe(1, t)  # a stopped model's estimate no longer counts
    assert placement.on_loop(1, 1.5004) is True
    await ex.stop()
