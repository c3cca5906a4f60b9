"""Inference backend under load: batching off vs fixed vs adaptive, against ONNX Runtime alone.

Two models, because a CPU has two different limits:

- heavy: a wide MLP whose batch-1 run is bound by reading its weights (as a GPU model is), so
  batching multiplies throughput; the direct-ORT best-batch/batch-1 ratio is recorded.
- tiny: the 256 -> 1024 -> 1024 -> 10 MLP, where per-request protocol overhead dominates.

The server (``start_backend`` under uvloop) runs in its own process over a generated model
repository holding one model per (model, batching mode); the load generator runs in another
process (``loadgen.LoadWorker``). Per model, protocol and mode it measures: p50 with one
request in flight, a closed-loop maximum, and open-loop Poisson points whose latency runs from
the scheduled send time. (a) is ONNX Runtime called in-process at its best batch size. For
tiny over HTTP JSON, the issue's yardstick -- a plain aiohttp handler calling ORT inline
(``servers.plain_server_main``) -- is measured side by side as mode ``plain-aiohttp``.
Sustained = p99 within the SLO (heavy 100 ms, tiny 20 ms; 50 ms also shown), <= 0.1% errors.
The grid is coarse, so after it a bounded search (``--search``, default on; ``--search-probes``)
locates each config's highest sustained open-loop rate, starting from its closed-loop maximum;
that rate is the summary's "sustained @SLO" and what the target verdicts read.

    .venv/bin/python bench/batching.py --quick
    .venv/bin/python bench/batching.py --models tiny --protocols grpc --duration 10
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _common import environment, print_table, write_results
from batching_direct import measure_direct
from batching_measure import MIN_OPEN_SAMPLES, run_protocol
from batching_models import (
    CLOSED_CLIENTS,
    HEAVY_MAX_BATCH,
    LOOP,
    MODES,
    NOFILL,
    PLAIN,
    SLO_S,
    TINY_SIZES,
    WORKER,
    WORKERS_MODE,
    batching_settings,
    build_bench_repository,
    check_answers,
    heavy_max_batch_arg,
)
from batching_report import evaluate_targets, print_report
from loadgen import PROTOCOLS, LoadWorker
from servers import (
    ServerProcess,
    WorkersServer,
    backend_server_main,
    fast_backend_server_main,
    plain_server_main,
)

from inferway.devtools.demo_models import HEAVY_SIZES

__all__ = ["MODES", "build_bench_repository", "main", "measure_direct"]

HEAVY_FRACTIONS = (0.1, 0.25, 0.5, 0.7, 0.85, 1.0)
HEAVY_FRACTIONS_QUICK = (0.25, 0.6, 0.9)
TINY_RATES = (100, 300, 600, 1000, 1500, 2000, 3000)
TINY_RATES_QUICK = (300, 1000, 2000)
BATCH_SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SERVER_CPU, LOADGEN_CPU = 1, 0
"""``--pin``: the cores the server side and the load generator get."""
SEARCH_PROBES = 6
SEARCH_PROBES_QUICK = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short run (~3 min) proving it works")
    p.add_argument("--models", default="heavy,tiny")
    p.add_argument("--protocols", default=",".join(PROTOCOLS))
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"of {', '.join(MODES)}, {NOFILL}, {WORKER}, {LOOP} (A/Bs)",
    )
    p.add_argument("--duration", type=float, default=None, help="seconds per load point")
    p.add_argument("--heavy-sizes", default=",".join(map(str, HEAVY_SIZES)))
    p.add_argument(
        "--heavy-max-batch",
        type=heavy_max_batch_arg,
        default=HEAVY_MAX_BATCH,
        help="heavy adaptive's max_batch_size (ONNX Runtime's own rate at this size bounds it)",
    )
    p.add_argument("--tiny-rates", default=None, help="open-loop req/s, comma separated")
    p.add_argument("--heavy-fractions", default=None, help="open-loop rates as fractions of (a)")
    p.add_argument(
        "--search",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="search each config's highest open-loop rate within the SLO (default: on, "
        "off with --quick)",
    )
    p.add_argument(
        "--search-probes",
        type=int,
        default=None,
        help=f"open-loop probes per config for the search (default {SEARCH_PROBES}, "
        f"{SEARCH_PROBES_QUICK} with --quick --search)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="also measure adaptive served by `inferway serve --workers N` (mode adaptive-wN)",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="one core each: the load generator on CPU 0, the server (and ORT direct for (a)) "
        "on CPU 1, so both sides get the same core budget (Linux; needs 2+ CPUs)",
    )
    p.add_argument(
        "--http-frontend",
        choices=("fast", "aiohttp"),
        default="fast",
        help="the backend's HTTP front end (default fast, as `inferway serve`; aiohttp: the "
        "one these figures were measured with before the fast front end existed)",
    )
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results)")
    return p.parse_args(argv)


def _floats(text: str | None, default: tuple[float, ...]) -> list[float]:
    return [float(x) for x in text.split(",")] if text else list(default)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    quick = args.quick
    duration = args.duration or (1.0 if quick else 8.0)
    warmup = 0.3 if quick else 1.0
    search = args.search if args.search is not None else not quick
    probes = args.search_probes or (SEARCH_PROBES_QUICK if quick else SEARCH_PROBES)
    search_probes = max(0, probes) if search else 0
    models = [m for m in args.models.split(",") if m]
    protocols = [p for p in args.protocols.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    known = {*MODES, NOFILL, WORKER, LOOP}
    for bad in set(models) - set(SLO_S) | set(protocols) - set(PROTOCOLS) | set(modes) - known:
        raise SystemExit(f"unknown model/protocol/mode {bad!r}")
    for given, what in ((models, "--models"), (protocols, "--protocols"), (modes, "--modes")):
        twice = sorted({x for x in given if given.count(x) > 1})
        if twice:  # the report finds runs by name: a repeat printed the first run twice
            raise SystemExit(
                f"{what}: {', '.join(twice)} given more than once; rerun the script to repeat"
            )
    all_sizes = {"heavy": tuple(int(x) for x in args.heavy_sizes.split(",")), "tiny": TINY_SIZES}
    sizes = {m: all_sizes[m] for m in models}
    started = time.perf_counter()
    results: dict[str, Any] = {"environment": _environment(), "settings": {}, "direct": {}}
    results["settings"] = {
        "quick": quick,
        "duration_s": duration,
        "warmup_s": warmup,
        "slo_ms": {m: SLO_S[m] * 1000 for m in models},
        "closed_clients": {m: CLOSED_CLIENTS[m] for m in models},
        "search_probes": search_probes,
        "pinned": {"loadgen_cpu": LOADGEN_CPU, "server_cpu": SERVER_CPU} if args.pin else None,
        "http_frontend": args.http_frontend,
        "configs": {
            f"{m}-{mode}": batching_settings(m, mode, heavy_max_batch=args.heavy_max_batch)
            for m in models
            for mode in modes
        },
    }
    with tempfile.TemporaryDirectory(prefix="inferway-bench-") as tmp:
        root = Path(tmp)
        onnx_files = build_bench_repository(root, sizes, heavy_max_batch=args.heavy_max_batch)
        for model, widths in sizes.items():
            weights = sum(a * b + b for a, b in itertools.pairwise(widths))
            with pinned(SERVER_CPU if args.pin else None):
                direct = measure_direct(
                    onnx_files[model], widths[0], 0.15 if quick else 0.6, BATCH_SWEEP
                )
            direct.update(
                sizes=list(widths),
                weights_mb=round(weights * 4 / 1e6, 1),
                mflop_per_row=round(2 * weights / 1e6, 1),
            )
            results["direct"][model] = direct
            print(
                f"(a) {model} {widths}: batch-1 {direct['batch1_rows_s']:.0f} rows/s, best "
                f"{direct['best_rows_s']:.0f} rows/s at batch {direct['best_batch']} "
                f"with {direct['best_config']} "
                f"(ratio {direct['ratio']:.1f}x)",
                flush=True,
            )
        with pinned(SERVER_CPU if args.pin else None):  # children inherit the affinity
            fast = args.http_frontend == "fast"
            main_fn = fast_backend_server_main if fast else backend_server_main
            server = ServerProcess(main_fn, (str(root),), metrics=True)
        many = (
            WorkersServer(root, args.workers, frontend=args.http_frontend)
            if args.workers > 1
            else None
        )
        many_mode = WORKERS_MODE.format(n=args.workers)
        plain = None
        if "tiny" in models and "http-json" in protocols:
            with pinned(SERVER_CPU if args.pin else None):
                plain = ServerProcess(
                    plain_server_main, (str(onnx_files["tiny"]), f"tiny-{PLAIN}"), metrics=False
                )
        with pinned(LOADGEN_CPU if args.pin else None):
            worker = LoadWorker()
        try:
            for model in models:
                for mode in modes:
                    check_answers(server.http_port, f"{model}-{mode}", sizes[model])
            runs = []
            for model in models:
                if model == "heavy":
                    best = results["direct"]["heavy"]["best_rows_s"]
                    fractions = HEAVY_FRACTIONS_QUICK if quick else HEAVY_FRACTIONS
                    rates = [round(f * best, 1) for f in _floats(args.heavy_fractions, fractions)]
                else:
                    rates = _floats(args.tiny_rates, TINY_RATES_QUICK if quick else TINY_RATES)
                for protocol in protocols:
                    with_plain = plain is not None and model == "tiny" and protocol == "http-json"
                    servers: dict[str, Any] = {m: server for m in modes}
                    extra = []
                    if many is not None:
                        servers[many_mode] = many
                        extra.append(many_mode)
                    if with_plain:
                        assert plain is not None
                        servers[PLAIN] = plain
                    done = run_protocol(
                        worker,
                        servers,
                        model=model,
                        width=sizes[model][0],
                        protocol=protocol,
                        modes=[*modes, *extra, PLAIN] if with_plain else [*modes, *extra],
                        rates=rates,
                        duration=duration,
                        warmup=warmup,
                        rounds=3 if quick else 5,
                        search_probes=search_probes,
                        min_open_samples=0 if quick else MIN_OPEN_SAMPLES,
                    )
                    runs += done
                    for run in done:
                        o, c = run["one_in_flight"], run["closed"]
                        print(
                            f"  {model:5} {protocol:11} {run['mode']:8} 1-in-flight p50 "
                            f"{o['p50_ms']:.2f} ms; closed {c['achieved_rps']:.0f} req/s "
                            f"p99 {c['p99_ms']:.1f} ms{_searched(run)}",
                            flush=True,
                        )
            results["runs"] = runs
        finally:
            worker.close()
            server.stop()
            if many is not None:
                many.stop()
            if plain is not None:
                plain.stop()
    results["targets"] = evaluate_targets(results)
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    print_report(results, print_table)
    path = write_results("batching", results, args.out)
    print(f"wrote {path} in {results['elapsed_s']:.0f}s")
    return results


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """This process on ``cpu`` alone for the block (processes started inside inherit it, and
    ONNX Runtime sizes its thread pool from the affinity); None: no change."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    if cpu not in before or len(before) < 2:
        raise SystemExit(
            f"--pin needs CPUs {LOADGEN_CPU} and {SERVER_CPU}; this process has {before}"
        )
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _searched(run: dict[str, Any]) -> str:
    search = run.get("search")
    if not search:
        return ""
    missed = search["missed_rps"]
    above = f", missed {missed:.0f}" if missed is not None else ""
    return (
        f"; sustained @SLO {search['sustained_rps']:.0f} req/s{above} "
        f"({search['probes_used']} probes)"
    )


def _environment() -> dict[str, Any]:
    import aiohttp
    import grpc
    import onnxruntime

    env = environment()
    env.update(
        usable_cores=len(os.sched_getaffinity(0)),
        onnxruntime=onnxruntime.__version__,
        numpy=np.__version__,
        grpcio=grpc.__version__,
        aiohttp=aiohttp.__version__,
        load_average_at_start=[round(x, 2) for x in os.getloadavg()],
        cpu_model=_cpu_model(),
    )
    return env


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
