"""One model over one protocol, every batching mode side by side: the 1-in-flight rounds,
the closed-loop maximum, the open-loop grid and the sustained-rate search, with the modes
taking turns at each step so that a drifting machine shifts them all alike."""

from __future__ import annotations

import itertools
import time
from typing import Any

from batching_models import CLOSED_CLIENTS, SLO_S, served_name
from batching_report import is_sustained, summarize_point
from loadgen import LoadSpec, LoadWorker
from rate_search import RateSearch
from servers import ServerProcess, scrape_batches

__all__ = ["MIN_OPEN_SAMPLES", "grid_duration", "run_point", "run_protocol"]


MIN_OPEN_SAMPLES = 800
"""A grid point's p99 is compared between modes: at low rates the point runs long enough for
this many requests (at 100 req/s x 3 s, p99 would be the third-slowest of 300)."""
MAX_GRID_POINT_S = 8.0


def grid_duration(rate: float, duration: float, min_samples: int = MIN_OPEN_SAMPLES) -> float:
    """Seconds an open-loop grid point runs: ``duration``, longer at low rates."""
    return max(duration, min(MAX_GRID_POINT_S, min_samples / max(rate, 1e-9)))


def run_point(
    worker: LoadWorker, server: ServerProcess, spec: LoadSpec, served: str
) -> dict[str, Any]:
    rows0, batches0, compute0 = (
        scrape_batches(server.http_port, served) if server.metrics else (1, 1, 0)
    )
    cpu0, wall0 = server.cpu_seconds(), time.perf_counter()
    raw = worker.run(spec)
    cpu1, wall1 = server.cpu_seconds(), time.perf_counter()
    rows1, batches1, compute1 = (
        scrape_batches(server.http_port, served) if server.metrics else (2, 2, 0)
    )
    point = summarize_point(spec, raw)
    point["server_cpu_pct"] = round(100 * (cpu1 - cpu0) / max(wall1 - wall0, 1e-9), 1)
    batches = max(batches1 - batches0, 1)
    point["mean_batch"] = round((rows1 - rows0) / batches, 2)
    if server.metrics:  # a batch's model run inside the server, to hold against ORT alone's
        point["mean_compute_ms"] = round(1000 * (compute1 - compute0) / batches, 3)
    return point


def _merge(raws: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "sent": sum(r["sent"] for r in raws),
        "latencies_s": [x for r in raws for x in r["latencies_s"]],
        "errors": [x for r in raws for x in r["errors"]],
        "elapsed_s": sum(r["elapsed_s"] for r in raws),
        "send_lag_p99_ms": max(r["send_lag_p99_ms"] for r in raws),
        "client_cpu_s": sum(r["client_cpu_s"] for r in raws),
    }


def run_protocol(
    worker: LoadWorker,
    servers: dict[str, ServerProcess],
    *,
    model: str,
    width: int,
    protocol: str,
    modes: list[str],
    rates: list[float],
    duration: float,
    warmup: float,
    rounds: int,
    search_probes: int = 0,
    min_open_samples: int = MIN_OPEN_SAMPLES,
) -> list[dict[str, Any]]:
    """Every mode of one model over one protocol, side by side: the modes take turns at each
    step (1-in-flight rounds, closed loop, each open-loop rate, each search probe), so a
    machine whose load drifts during the run shifts all of them alike. ``search_probes`` > 0:
    after the grid, up to that many open-loop probes per mode locate the highest rate it
    sustains within the SLO (``rate_search.RateSearch``, seeded with the grid's outcomes)."""

    def spec(mode: str, **kw: Any) -> LoadSpec:
        server = servers[mode]
        return LoadSpec(
            protocol=protocol,
            host="127.0.0.1",
            http_port=server.http_port,
            grpc_port=server.grpc_port,
            model=served_name(model, mode),
            width=width,
            **kw,
        )

    one_raw: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    per_round = max(0.3, duration / rounds)
    for _ in range(rounds):
        for mode in modes:
            s = spec(mode, kind="closed", concurrency=1, duration_s=per_round, warmup_s=0.1)
            one_raw[mode].append(worker.run(s))
    runs = {}
    for mode in modes:
        first = spec(mode, kind="closed", concurrency=1, duration_s=per_round)
        one = summarize_point(first, _merge(one_raw[mode]))
        closed = run_point(
            worker,
            servers[mode],
            spec(
                mode,
                kind="closed",
                concurrency=CLOSED_CLIENTS[model],
                duration_s=duration,
                warmup_s=warmup,
            ),
            served_name(model, mode),
        )
        runs[mode] = {
            "model": model,
            "protocol": protocol,
            "mode": mode,
            "one_in_flight": one,
            "closed": closed,
            "open": [],
        }
    for i, rate in enumerate(rates):
        for mode in modes:
            run = runs[mode]
            if rate > 1.3 * run["closed"]["achieved_rps"]:
                # Far past what the closed loop served: the queue would only fill to the timeout.
                skipped = {"kind": "open", "offered_rps": rate, "skipped": "above closed max"}
                run["open"].append(skipped)
                continue
            s = spec(
                mode,
                kind="open",
                rate=rate,
                duration_s=grid_duration(rate, duration, min_open_samples),
                warmup_s=warmup,
                seed=i,
            )
            run["open"].append(run_point(worker, servers[mode], s, served_name(model, mode)))
    for mode in modes:
        run = runs[mode]
        if all(p.get("skipped") for p in run["open"]):
            # Every rate overloads this config: measure it once at 70% of its closed-loop max.
            rate = max(1.0, round(0.7 * run["closed"]["achieved_rps"], 1))
            s = spec(mode, kind="open", rate=rate, duration_s=duration, warmup_s=warmup)
            run["open"].append(run_point(worker, servers[mode], s, served_name(model, mode)))
    if search_probes > 0:
        slo_ms = SLO_S[model] * 1000
        searches = {}
        for mode in modes:
            run = runs[mode]
            search = RateSearch(run["closed"]["achieved_rps"], max_probes=search_probes)
            for p in run["open"]:
                if p.get("kind") == "open" and not p.get("skipped"):
                    search.seed(p["offered_rps"], is_sustained(p, slo_ms))
            searches[mode] = search
            run["search"] = {"slo_ms": slo_ms, "probes": []}
        # Probe by probe, the modes take turns, as on the grid.
        for step in itertools.count():
            pending = {m: r for m in modes if (r := searches[m].next_rate()) is not None}
            if not pending:
                break
            for mode, rate in pending.items():
                s = spec(
                    mode,
                    kind="open",
                    rate=rate,
                    duration_s=duration,
                    warmup_s=warmup,
                    seed=100 + step,
                )
                point = run_point(worker, servers[mode], s, served_name(model, mode))
                searches[mode].record(rate, is_sustained(point, slo_ms))
                runs[mode]["search"]["probes"].append(point)
        for mode in modes:
            runs[mode]["search"].update(searches[mode].as_dict())
    return [runs[m] for m in modes]
