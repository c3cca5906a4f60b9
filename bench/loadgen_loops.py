"""The open- and closed-loop drivers of ``loadgen.py``: they turn a ``send()`` into measured
latencies and error kinds, and never raise on a failed request."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
from loadgen_spec import REQUEST_TIMEOUT_S, Send

__all__ = ["run_closed_loop", "run_open_loop"]


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


async def _timed(send: Send, scheduled: float, lat: list[float], errors: list[str]) -> None:
    try:
        ok = await send()
    except Exception as exc:  # every failure is counted, by kind, never raised
        errors.append(type(exc).__name__)
        return
    if ok:
        lat.append(time.perf_counter() - scheduled)
    else:
        errors.append("status")


async def run_open_loop(send: Send, rate: float, duration_s: float, seed: int = 0) -> dict:
    """Poisson arrivals at ``rate``/s for ``duration_s``; latency from the scheduled time."""
    rng = np.random.default_rng(seed)
    n = max(1, int(rate * duration_s * 1.2) + 16)
    offsets = np.cumsum(rng.exponential(1.0 / rate, n))
    offsets = offsets[offsets < duration_s].tolist()
    lat: list[float] = []
    errors: list[str] = []
    lags: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    cpu0 = _cpu_seconds()
    start = time.perf_counter()
    i = 0
    while i < len(offsets):
        now = time.perf_counter()
        due = start + offsets[i]
        if due > now:
            await asyncio.sleep(due - now)
            now = time.perf_counter()
        # Send everything that is due: timer granularity must not thin the arrivals out.
        while i < len(offsets) and start + offsets[i] <= now:
            scheduled = start + offsets[i]
            lags.append(now - scheduled)
            task = asyncio.create_task(_timed(send, scheduled, lat, errors))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
    if tasks:
        _, pending = await asyncio.wait(list(tasks), timeout=REQUEST_TIMEOUT_S + 2)
        for task in pending:  # no answer at all: a failure, not a missing sample
            task.cancel()
            errors.append("unanswered")
    end = time.perf_counter()
    lags.sort()
    return {
        "sent": len(offsets),
        "latencies_s": lat,
        "errors": errors,
        "elapsed_s": end - start,
        "send_lag_p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1000 if lags else 0.0,
        "client_cpu_s": _cpu_seconds() - cpu0,
    }


async def run_closed_loop(send: Send, concurrency: int, duration_s: float) -> dict:
    """``concurrency`` clients back to back for ``duration_s``."""
    lat: list[float] = []
    errors: list[str] = []
    cpu0 = _cpu_seconds()
    start = time.perf_counter()
    stop_at = start + duration_s

    async def client() -> None:
        while time.perf_counter() < stop_at:
            await _timed(send, time.perf_counter(), lat, errors)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    end = time.perf_counter()
    return {
        "sent": len(lat) + len(errors),
        "latencies_s": lat,
        "errors": errors,
        "elapsed_s": end - start,
        "send_lag_p99_ms": 0.0,
        "client_cpu_s": _cpu_seconds() - cpu0,
    }
