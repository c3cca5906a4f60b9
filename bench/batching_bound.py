"""What issue 15's goal 4 allows on one core: the most any server could sustain at p99 under
the SLO, from ONNX Runtime's own batch costs on that core.

Goal 4 asks adaptive batching for >= 85% of ONNX Runtime's best-batch throughput (its best
batch size, measured alone on the core) at p99 < 100 ms, with the server on one core. This
script asks whether that is possible at all, for any front end and any batching policy:

1. ONNX Runtime alone, pinned to ``--pin`` (default CPU 1), is timed at each batch size
   (``batching_direct.measure_direct``, as ``bench/batching.py`` measures its (a)), or the
   sweep is read from a ``bench/batching.py`` results file (``--from-results``).
2. A discrete-event simulation serves Poisson arrivals on one core: a batch of b rows takes
   t(b) (the measured median, interpolated between sizes) plus c for each of its requests,
   the front end's CPU for one request on the same core. Latency is arrival to batch end.
3. For each c, a bisection finds the highest arrival rate whose p99 stays under the SLO, for
   the best greedy policy (dispatch whenever the core is free, at most B rows, every B of the
   sweep tried) and for inferway's own adaptive scheduler (``batching.Scheduler``, the bench's
   heavy-model config, fed the simulated costs as the executor feeds it).

Everything is in the server's favour (deterministic median costs, no scheduling noise, no
client), so the rates are upper bounds: a real server on that core does less.

    .venv/bin/python bench/batching_bound.py                         # ~2 min: sweep + bound
    .venv/bin/python bench/batching_bound.py --from-results bench/results/batching.json
    .venv/bin/python bench/batching_bound.py --frontend-us 0,50,100,168 -o json
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from _common import environment, print_table, write_results
from batching_direct import measure_direct
from batching_models import HEAVY_MAX_BATCH, SLO_S, batching_settings, heavy_max_batch_arg

from inferway.backends.batching import (
    BatchingConfig,
    Dispatch,
    Pending,
    QueueFullError,
    Scheduler,
    WaitUntil,
)
from inferway.devtools.demo_models import HEAVY_SIZES, build_mlp

SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TARGET = 0.85
"""Goal 4's share of ONNX Runtime's best-batch throughput."""


@dataclass(frozen=True)
class CostCurve:
    """t(b): a batch's compute seconds, linear between the measured batch sizes (and, past
    the largest, at the largest size's cost per row)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __call__(self, rows: int) -> float:
        i = bisect.bisect_left(self.sizes, rows)
        if i < len(self.sizes) and self.sizes[i] == rows:
            return self.seconds[i]
        if i == 0:
            return self.seconds[0] * rows / self.sizes[0]
        if i == len(self.sizes):
            return self.seconds[-1] * rows / self.sizes[-1]
        b0, b1 = self.sizes[i - 1], self.sizes[i]
        t0, t1 = self.seconds[i - 1], self.seconds[i]
        return t0 + (t1 - t0) * (rows - b0) / (b1 - b0)

    @classmethod
    def from_sweep(cls, sweep: Sequence[dict[str, Any]]) -> CostCurve:
        ordered = sorted(sweep, key=lambda r: r["batch"])
        return cls(
            tuple(int(r["batch"]) for r in ordered),
            tuple(float(r["ms"]) / 1000.0 for r in ordered),
        )


def arrivals(rate: float, n: int, seed: int) -> list[float]:
    """Poisson arrival times at ``rate``; the same seed gives the same sequence scaled by
    1/rate, so a bisection over rates compares like with like."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(1.0)
        out.append(t / rate)
    return out


def p99_after_warmup(latencies: list[float], warmup: float = 0.1) -> float:
    kept = sorted(latencies[int(len(latencies) * warmup) :])
    return kept[min(len(kept) - 1, math.ceil(0.99 * len(kept)) - 1)]


def greedy(times: list[float], cost: CostCurve, c: float, cap: int) -> list[float]:
    """Dispatch whenever the core is free: every request that has arrived, at most ``cap``."""
    latencies = [0.0] * len(times)
    free_at = 0.0
    i, n = 0, len(times)
    while i < n:
        now = max(free_at, times[i])
        j = bisect.bisect_right(times, now, i, min(n, i + cap))
        rows = j - i
        end = now + cost(rows) + c * rows
        for k in range(i, j):
            latencies[k] = end - times[k]
        free_at, i = end, j
    return latencies


def adaptive(times: list[float], cost: CostCurve, c: float, config: BatchingConfig) -> list[float]:
    """inferway's Scheduler on one instance, driven as the executor drives it (expire, then
    next_action until it stops dispatching; the batch's compute time fed back when it ends).
    The scheduler's ``loop_busy`` is the front end's share of the core (c x rate)."""
    sched: Scheduler[Pending] = Scheduler(config)
    latencies = [0.0] * len(times)
    rate = len(times) / times[-1]
    sched.loop_busy = min(1.0, c * rate)
    running: list[tuple[float, int, Dispatch[Pending], float]] = []
    idle, wake, seq, i, n = 1, math.inf, 0, 0, len(times)
    while i < n or running or sched.queued:
        t_arr = times[i] if i < n else math.inf
        t_done = running[0][0] if running else math.inf
        now = min(t_arr, t_done, wake)
        if not math.isfinite(now):
            raise RuntimeError("simulation stalled: the scheduler neither dispatched nor waited")
        while running and running[0][0] <= now:
            _, _, batch, compute = heapq.heappop(running)
            idle += 1
            for req in batch.requests:
                latencies[int(req.id)] = now - req.arrival  # type: ignore[call-overload]
            sched.on_dispatch_done(batch.rows, compute, now)
        while i < n and times[i] <= now:
            try:
                sched.submit(Pending(i, 1, 16384, "x", times[i]), now)
            except QueueFullError:  # refused (429): not a rate the server sustains
                latencies[i] = math.inf
            i += 1
        for req in sched.expire(now):  # past max_queue_delay's limits: count it as too slow
            latencies[int(req.id)] = math.inf  # type: ignore[call-overload]
        wake = math.inf
        while True:
            action = sched.next_action(now, idle)
            if isinstance(action, Dispatch):
                idle -= 1
                seq += 1
                compute = cost(action.rows)
                end = now + compute + c * action.rows
                heapq.heappush(running, (end, seq, action, compute))
                continue
            if isinstance(action, WaitUntil):
                wake = action.at
            break
    return latencies


def max_rate(
    policy: Callable[[list[float]], list[float]],
    *,
    lo: float,
    hi: float,
    slo: float,
    requests: int,
    seeds: Sequence[int],
    steps: int,
) -> float:
    """The highest rate (rows/s, one row a request) whose p99 is under ``slo`` for every
    seed, by bisection between ``lo`` and ``hi``; 0 when even ``lo`` misses."""

    def meets(rate: float) -> bool:
        return all(p99_after_warmup(policy(arrivals(rate, requests, seed))) < slo for seed in seeds)

    if not meets(lo):
        return 0.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def bound(
    cost: CostCurve, best_rows_s: float, frontend_us: Sequence[float], args: argparse.Namespace
) -> list[dict[str, Any]]:
    slo = SLO_S["heavy"]
    settings = batching_settings("heavy", "adaptive", heavy_max_batch=args.heavy_max_batch)
    config = BatchingConfig(**settings["batching"])
    seeds = tuple(range(args.seeds))
    search = {
        "lo": 0.05 * best_rows_s,
        "hi": 1.0 * best_rows_s,
        "slo": slo,
        "requests": args.requests,
        "seeds": seeds,
        "steps": args.steps,
    }
    rows = []
    for us in frontend_us:
        c = us / 1e6
        began = time.perf_counter()
        caps = {}
        for cap in cost.sizes:
            caps[cap] = max_rate(partial(greedy, cost=cost, c=c, cap=cap), **search)
        best_cap = max(caps, key=lambda k: caps[k])
        ours = max_rate(partial(adaptive, cost=cost, c=c, config=config), **search)
        row: dict[str, Any] = {
            "frontend_us": us,
            "ceiling_rows_s": round(_ceiling(cost, c), 1),
            "greedy_best_cap": best_cap,
            "greedy_rows_s": round(caps[best_cap], 1),
            "greedy_share": round(caps[best_cap] / best_rows_s, 3),
            "greedy_by_cap": {str(k): round(v, 1) for k, v in caps.items()},
            "adaptive_rows_s": round(ours, 1),
            "adaptive_share": round(ours / best_rows_s, 3),
        }
        rows.append(row)
        print(
            f"  front end {us:5.0f} us: best greedy {row['greedy_rows_s']:7.1f} rows/s "
            f"(cap {best_cap}, {100 * row['greedy_share']:.0f}% of (a)), inferway adaptive "
            f"{row['adaptive_rows_s']:7.1f} ({100 * row['adaptive_share']:.0f}%) "
            f"[{time.perf_counter() - began:.0f}s]",
            file=sys.stderr,
            flush=True,
        )
    return rows


def _ceiling(cost: CostCurve, c: float) -> float:
    """The core's most rows/s at any batch size, latency aside: max over b of b/(t(b)+c*b)."""
    return max(b / (cost(b) + c * b) for b in cost.sizes)


def measured_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """ONNX Runtime alone on ``args.pin``, as bench/batching.py measures (a)."""
    widths = tuple(int(w) for w in args.heavy_sizes.split(","))
    before = os.sched_getaffinity(0)
    if args.pin is not None:
        if args.pin not in before:
            raise SystemExit(f"--pin {args.pin}: this process may run on CPUs {sorted(before)}")
        os.sched_setaffinity(0, {args.pin})
    try:
        with tempfile.TemporaryDirectory(prefix="inferway-bound-") as tmp:
            path = build_mlp(Path(tmp) / "heavy.onnx", widths)
            print(f"timing ONNX Runtime alone at batch sizes {SWEEP} ...", file=sys.stderr)
            return measure_direct(path, widths[0], args.seconds, SWEEP)
    finally:
        os.sched_setaffinity(0, before)


def from_results(path: Path) -> dict[str, Any]:
    try:
        direct = json.loads(path.read_text())["direct"]
        # bench/batching.py keeps (a) per model; this script's own results hold one
        found = dict(direct.get("heavy", direct))
        if "sweep" not in found or "best_rows_s" not in found:
            raise KeyError("sweep" if "sweep" not in found else "best_rows_s")
        return found
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"--from-results {path}: not a results file of bench/batching.py (with the heavy "
            f"model) or of this script ({type(exc).__name__}: {exc})"
        ) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer requests and steps (~30 s)")
    p.add_argument(
        "--from-results", type=Path, default=None, help="(a) of a batching.json or of this"
    )
    p.add_argument("--pin", type=int, default=1, help="CPU for ONNX Runtime's sweep (-1: none)")
    p.add_argument("--seconds", type=float, default=0.6, help="timing per batch size")
    p.add_argument("--heavy-sizes", default=",".join(map(str, HEAVY_SIZES)))
    p.add_argument(
        "--heavy-max-batch",
        type=heavy_max_batch_arg,
        default=HEAVY_MAX_BATCH,
        help="max_batch_size of inferway's scheduler in the simulation (as batching.py's)",
    )
    p.add_argument(
        "--frontend-us", default="0,25,50,100,168", help="front-end CPU per request, microseconds"
    )
    p.add_argument("--requests", type=int, default=8000, help="simulated requests per trial")
    p.add_argument("--seeds", type=int, default=3, help="every seed must meet the SLO")
    p.add_argument("--steps", type=int, default=10, help="bisection steps per search")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results)")
    args = p.parse_args(argv)
    if args.pin is not None and args.pin < 0:
        args.pin = None
    if args.quick:
        args.requests, args.seeds, args.steps, args.seconds = 3000, 2, 7, 0.2
    try:
        args.frontend = [float(v) for v in args.frontend_us.split(",") if v.strip()]
    except ValueError:
        p.error(f"--frontend-us: {args.frontend_us!r} is not a comma-separated list of numbers")
    if not args.frontend or any(v < 0 for v in args.frontend):
        p.error("--frontend-us: give one or more microsecond figures >= 0")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    began = time.perf_counter()
    direct = from_results(args.from_results) if args.from_results else measured_sweep(args)
    cost = CostCurve.from_sweep(direct["sweep"])
    best = float(direct["best_rows_s"])
    print(
        f"(a) ONNX Runtime alone: {best:.0f} rows/s at batch {direct['best_batch']}; "
        f"simulating {args.requests} requests x {args.seeds} seeds per trial ...",
        file=sys.stderr,
    )
    rows = bound(cost, best, args.frontend, args)
    results = {
        "environment": environment(),
        "source": str(args.from_results) if args.from_results else f"measured on CPU {args.pin}",
        "direct": direct,
        "slo_s": SLO_S["heavy"],
        "target_share": TARGET,
        "settings": {k: v for k, v in vars(args).items() if k not in ("from_results", "out")},
        "rows": rows,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        print_table(
            f"one core, p99 < {SLO_S['heavy'] * 1000:.0f} ms: the most any server sustains "
            f"((a) = {best:.0f} rows/s at batch {direct['best_batch']}; goal: "
            f"{TARGET * best:.0f} = {TARGET:.0%})",
            [
                "front end us/req",
                "ceiling rows/s (any batch, no SLO)",
                "best greedy rows/s",
                "its cap",
                "% of (a)",
                "inferway adaptive rows/s",
                "% of (a)",
            ],
            [
                (
                    f"{r['frontend_us']:.0f}",
                    r["ceiling_rows_s"],
                    r["greedy_rows_s"],
                    r["greedy_best_cap"],
                    f"{100 * r['greedy_share']:.0f}%",
                    r["adaptive_rows_s"],
                    f"{100 * r['adaptive_share']:.0f}%",
                )
                for r in rows
            ],
        )
    path = write_results("batching_bound", results, args.out)
    print(f"wrote {path} in {results['elapsed_s']:.0f}s", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
