"""The long fuzzing run against live ``inferway serve`` front ends (issue 33): generated
inference requests (tests/request_fuzz.py: JSON and binary-extension bodies, mutated fields,
headers, lengths, methods, paths), each checked for exactly one whole 2xx/4xx answer (strict
JSON when JSON); then every server must still answer and its log must hold no traceback.

It runs until ``--cases`` requests were sent (all workers together) or ``--duration`` seconds
passed, whichever comes first, printing the progress (cases, rate, failures, time to the
target) every ``--progress`` seconds. Each of ``--workers`` processes runs its own server and
its own Hypothesis loop: a case spends most of its time waiting on the socket (the answer,
then a moment to see that nothing follows it), so several workers reach a count much sooner,
even on 2 cores. ``--frontend both`` gives the workers the two front ends in turn. Prints the
cases, statuses and failures per front end, and writes them as JSON to
bench/results/fuzz_requests_<frontend>.json (or ``--json``).

    .venv/bin/python bench/fuzz_requests.py --cases 100000 --workers 4 --frontend both
    .venv/bin/python bench/fuzz_requests.py --duration 600 [--frontend aiohttp]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

from _common import environment, write_results
from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests.* helpers

from tests.request_fuzz import (
    FuzzServer,
    RequestCase,
    check_answer,
    fuzz_server,
    requests,
    send,
)

BATCH = 100
"""Examples per Hypothesis run; runs repeat until the worker's quota or the time is spent
(small: once either is, the rest of a run's examples are still generated, then skipped)."""
KEPT_FAILURES = 20
FRONTENDS = ("fast", "aiohttp")


def _run(
    server: FuzzServer,
    until: float,
    quota: int | None,
    statuses: Counter[int],
    failures: list[str],
    progress: Synchronized[int],
    failed: Synchronized[int],
) -> int:
    """One Hypothesis run of at most BATCH cases (fewer once ``until`` passes or ``quota``
    cases are sent); the cases sent."""
    sent = 0

    @settings(
        max_examples=BATCH,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=requests())
    def one(case: RequestCase) -> None:
        nonlocal sent
        if time.monotonic() > until or (quota is not None and sent >= quota):
            return
        try:
            status, wrong = check_answer(case, send(server, case))
        except OSError as exc:
            status, wrong = 0, f"{type(exc).__name__}: {exc}"
        sent += 1
        statuses[status] += 1
        with progress.get_lock():
            progress.value += 1
        if wrong is not None:
            failures.append(f"{case!r}: {wrong}"[:2000])
            with failed.get_lock():
                failed.value += 1

    one()
    return sent


def worker(
    frontend: str,
    quota: int | None,
    shared: dict[str, Any],
    results: Any,
) -> None:
    """One server of ``frontend``; once every worker's server is ready (``shared["go"]``),
    one Hypothesis loop on it until ``shared["until"]`` (Unix time: monotonic clocks are not
    shared between processes) or ``quota`` cases; its tallies go to ``results``."""
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    cases = 0
    progress, failed = shared["progress"], shared["failed"]
    with tempfile.TemporaryDirectory() as workdir, fuzz_server(Path(workdir), frontend) as server:
        with shared["ready"].get_lock():
            shared["ready"].value += 1
        shared["go"].wait()
        began = time.monotonic()
        until = began + (shared["until"].value - time.time())
        while time.monotonic() < until and (quota is None or cases < quota):
            left = None if quota is None else quota - cases
            cases += _run(server, until, left, statuses, failures, progress, failed)
        seconds = time.monotonic() - began
        healthy = server.healthy()
        tracebacks = server.log_text().count("Traceback")
    results.put(
        {
            "frontend": frontend,
            "cases": cases,
            "seconds": seconds,
            "statuses": dict(statuses),
            "failures": failures[:KEPT_FAILURES],
            "failure_count": len(failures),
            "tracebacks": tracebacks,
            "healthy": healthy,
        }
    )


def _quotas(total: int | None, workers: int) -> list[int | None]:
    if total is None:
        return [None] * workers
    return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


def _merge(parts: Sequence[dict[str, Any]], frontend: str) -> dict[str, Any]:
    mine = [p for p in parts if p["frontend"] == frontend]
    statuses: Counter[int] = Counter()
    for part in mine:
        statuses.update({int(k): v for k, v in part["statuses"].items()})
    return {
        "workers": len(mine),
        "cases": sum(p["cases"] for p in mine),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "failures": sum(p["failure_count"] for p in mine),
        "first_failures": [f for p in mine for f in p["failures"]][:KEPT_FAILURES],
        "tracebacks_in_server_logs": sum(p["tracebacks"] for p in mine),
        "servers_still_answering": all(p["healthy"] for p in mine),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds at most (default 600 without --cases)"
    )
    parser.add_argument("--cases", type=int, default=None, help="stop once this many were sent")
    parser.add_argument("--workers", type=int, default=1, help="processes, each with a server")
    parser.add_argument("--frontend", choices=[*FRONTENDS, "both"], default="fast")
    parser.add_argument("--progress", type=float, default=10.0, help="seconds between lines")
    parser.add_argument(
        "--json", type=Path, help="where to write the results (default bench/results/...)"
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or (args.cases is not None and args.cases < 1):
        parser.error("--workers and --cases must be at least 1")
    duration = args.duration if args.duration is not None else 600.0 if not args.cases else 1e9
    frontends = FRONTENDS if args.frontend == "both" else (args.frontend,)
    context = multiprocessing.get_context("spawn")
    shared: dict[str, Any] = {
        "progress": context.Value("q", 0),
        "failed": context.Value("q", 0),
        "ready": context.Value("q", 0),
        "until": context.Value("d", 0.0),
        "go": context.Event(),
    }
    progress, failed = shared["progress"], shared["failed"]
    results = context.Queue()
    processes = [
        context.Process(
            target=worker,
            args=(frontends[i % len(frontends)], quota, shared, results),
            name=f"fuzz-{i}",
        )
        for i, quota in enumerate(_quotas(args.cases, args.workers))
    ]
    for process in processes:
        process.start()
    began = time.monotonic()
    while shared["ready"].value < len(processes):  # the servers start first, not counted
        if not all(p.is_alive() for p in processes):
            print("a worker's server did not start", file=sys.stderr)
            break
        time.sleep(0.2)
    print(f"{len(processes)} servers ready in {time.monotonic() - began:.0f} s", flush=True)
    started = time.monotonic()
    shared["until"].value = time.time() + duration
    shared["go"].set()
    parts: list[dict[str, Any]] = []
    next_line = started + args.progress
    while len(parts) < len(processes):
        try:
            parts.append(results.get(timeout=0.5))
        except Exception:  # queue.Empty: a worker still runs (or died: checked below)
            if not any(p.is_alive() for p in processes) and results.empty():
                break
        if time.monotonic() >= next_line:
            next_line += args.progress
            _print_progress(time.monotonic() - started, progress.value, failed.value, args.cases)
    for process in processes:
        process.join(timeout=60)
    # the fuzzing time: from the start signal until the last worker stopped sending
    elapsed = max((p["seconds"] for p in parts), default=time.monotonic() - started)
    _print_progress(elapsed, progress.value, failed.value, args.cases)
    lost = len(processes) - len(parts)
    by_frontend = {f: _merge(parts, f) for f in frontends}
    cases = sum(p["cases"] for p in parts)
    result = {
        "environment": environment(),
        "frontend": args.frontend,
        "workers": args.workers,
        "target_cases": args.cases,
        "seconds": round(elapsed, 1),
        "cases": cases,
        "rate_per_s": round(cases / elapsed, 1),
        "failures": sum(p["failure_count"] for p in parts),
        "tracebacks_in_server_logs": sum(p["tracebacks"] for p in parts),
        "servers_still_answering": all(p["healthy"] for p in parts),
        "workers_lost": lost,
        "by_frontend": by_frontend,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=2))
    print(f"wrote {write_results(f'fuzz_requests_{args.frontend}', result, args.json)}")
    reached = args.cases is None or cases >= args.cases
    clean = not result["failures"] and not result["tracebacks_in_server_logs"]
    return 0 if clean and result["servers_still_answering"] and not lost and reached else 1


def _print_progress(elapsed: float, cases: int, failures: int, target: int | None) -> None:
    rate = cases / elapsed if elapsed > 0 else 0.0
    line = f"{elapsed:7.0f} s  {cases} cases  {rate:.1f}/s  {failures} failures"
    if target is not None and rate > 0:
        line += f"  {100 * cases / target:.1f}% of {target}, ~{(target - cases) / rate:.0f} s left"
    print(line, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
