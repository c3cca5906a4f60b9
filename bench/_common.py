"""Shared pieces of the benchmarks: a realistic policy, percentiles, a table, a JSON file.

Benchmarks are not tests: they print what they measured and write it to
``bench/results/<name>.json`` so BENCHMARKS.md can quote the figures with the command.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inferway.policies.model import Backend, Endpoint, Listener, Policy, Route, Service

__all__ = [
    "RESULTS_DIR",
    "build_bench_policy",
    "environment",
    "free_port",
    "percentile",
    "print_table",
    "summarize",
    "write_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_bench_policy(
    *,
    listeners: int = 10,
    services: int = 50,
    endpoints_per_service: int = 4,
    canary_weight: float = 10.0,
    base_port: int = 20000,
) -> Policy:
    """A fleet-sized policy: ``listeners`` listeners, ``services`` services of
    ``endpoints_per_service`` endpoints, and one route per pair of services (stable/canary)
    spread over the listeners. Only the first route's canary weight varies with
    ``canary_weight``, as a real rollout edit would."""
    listener_models = [Listener(name=f"listener-{i}", port=base_port + i) for i in range(listeners)]
    service_models = [
        Service(
            name=f"svc-{s}",
            endpoints=[
                Endpoint(host=f"10.{s // 250}.{s % 250}.{e + 1}", port=8000)
                for e in range(endpoints_per_service)
            ],
        )
        for s in range(services)
    ]
    routes: list[Route] = []
    for r in range(services // 2):
        weight = canary_weight if r == 0 else 10.0
        routes.append(
            Route(
                name=f"route-{r}",
                listeners=[listener_models[r % listeners].name],
                match={"path": {"prefix": f"/models/m{r}"}},
                backends=[
                    Backend(service=f"svc-{2 * r}", weight=round(100.0 - weight, 1)),
                    Backend(service=f"svc-{2 * r + 1}", weight=weight),
                ],
            )
        )
    return Policy(listeners=listener_models, services=service_models, routes=routes)


def add_choice_list(
    parser: argparse.ArgumentParser, flag: str, known: Sequence[str], what: str
) -> None:
    """``flag``: a comma-separated subset of ``known`` (default all), in the order given."""
    parser.add_argument(
        flag, default=",".join(known), help=f"{what} (default all: {', '.join(known)})"
    )


def choice_list(
    parser: argparse.ArgumentParser, flag: str, value: str, known: Sequence[str]
) -> list[str]:
    """``value`` split on commas; a name not in ``known`` is a usage error naming ``flag``."""
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    if unknown := [v for v in chosen if v not in known]:
        parser.error(f"{flag}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    return chosen


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


MIN_ROUNDS_FOR_INTERVAL = 5


def median_interval(values: Sequence[float]) -> list[float] | None:
    """A 95% interval for the median of ``values`` (one a round), by resampling whole rounds
    (bootstrap, percentile method): a round is the unit the machine's drift moves, so the
    interval says how far another run's median may land. None under five rounds, or when
    every round gave the same figure."""
    if len(values) < MIN_ROUNDS_FOR_INTERVAL or len(set(values)) == 1:
        return None
    import numpy as np
    from scipy import stats

    result = stats.bootstrap(
        (np.asarray(values, dtype=float),),
        np.median,
        confidence_level=0.95,
        method="percentile",
        n_resamples=4000,
        rng=np.random.default_rng(0),
    )
    low, high = result.confidence_interval
    return [round(float(low), 3), round(float(high), 3)]


def summarize(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p99/max/mean in milliseconds (NaNs, i.e. missing measurements, left out)."""
    values_s = [v for v in values_s if not math.isnan(v)]
    if not values_s:
        return {"count": 0}
    ms = [v * 1000.0 for v in values_s]
    return {
        "count": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3),
        "mean_ms": round(sum(ms) / len(ms), 3),
    }


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table on a terminal; plain aligned text when rich is unavailable."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency, this is a fallback
        widths = [
            max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(str(c))
            for i, c in enumerate(columns)
        ]
        print(title)
        print("  ".join(str(c).rjust(w) for c, w in zip(columns, widths, strict=True)))
        for row in rows:
            print("  ".join(str(v).rjust(w) for v, w in zip(row, widths, strict=True)))
        return
    table = Table(title=title)
    for column in columns:
        table.add_column(str(column), justify="right")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    Console(width=140).print(table)


def environment() -> dict[str, Any]:
    """What the figures were measured on (these machines are noisy and shared): with the CPU's
    model, the load average and ``calibration_ms`` (a fixed pure-Python loop, best of 3), so
    figures from two days can be told apart by the machine's speed as well as the code's."""
    import os

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "calibration_ms": round(calibration_ms(), 1),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def calibration_ms() -> float:
    """Milliseconds for a fixed pure-Python loop (1M dict updates and string joins), the
    best of 3: a machine that is 1.4x slower today shows 1.4x here too."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        counts: dict[int, int] = {}
        parts = []
        for i in range(1_000_000):
            counts[i & 1023] = counts.get(i & 1023, 0) + i
            if i & 4095 == 0:
                parts.append(str(i))
        "".join(parts)
        best = min(best, time.perf_counter() - started)
    return best * 1000


def write_results(name: str, data: Mapping[str, Any], path: Path | None = None) -> Path:
    target = path or RESULTS_DIR / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(dict(data), indent=2, sort_keys=True, default=str) + "\n")
    return target
