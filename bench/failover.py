"""Failover: kill one of three replicas under steady load, through a real Envoy configured by
inferway with the default traffic settings (readiness probe every 2 s, outlier detection on)
and a route retrying connect failures, resets and gateway errors.

Per trial (a fresh gateway each time, so trials are independent):

* ``last_routed_ms``: from the kill to the last time Envoy routed to the dead replica (its
  per-host ``rq_total + cx_connect_fail`` in admin ``/clusters`` last changed; polled every
  20 ms, so figures have ~20 ms resolution);
* ``out_of_rotation_ms``: from the kill until Envoy first marks it ejected or unhealthy;
* ``success_rate``: of the client requests sent from the kill to the end of the trial.

Both times are upper bounds: they include the kill itself (closing the aiohttp server and
its connections) and the admin poll's latency; ``first_poll_ms`` shows that resolution.
When the two times equal it, Envoy had already stopped routing to the replica by the first
look after the kill.

    .venv/bin/python bench/failover.py --trials 10          # full
    .venv/bin/python bench/failover.py --quick              # 3 trials, shorter events
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

from _common import environment, percentile, print_table, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests.* helpers

from tests.traffic_harness import (
    ControlledBackend,
    FailoverTiming,
    TrafficGateway,
    watch_failover,
)

POLICY = """
listeners: [{{name: edge, port: {listener_port}}}]
services:
  - name: model
    endpoints: ["127.0.0.1:{r1}", "127.0.0.1:{r2}", "127.0.0.1:{r3}"]
routes:
  - name: all
    backends: [{{service: model}}]
    retries: {{attempts: 2, on: [connect-failure, reset, gateway-error], per_try_timeout: 1s}}
"""


async def run_trial(*, rate: float, before: float, after: float) -> dict[str, Any]:
    replicas = [ControlledBackend(n) for n in ("r1", "r2", "r3")]
    victim = replicas[1]
    timings: list[FailoverTiming] = []
    async with TrafficGateway(POLICY, replicas) as gw:
        await gw.send(60)

        async def kill_then_watch() -> None:
            await asyncio.sleep(before)
            timings.append(await watch_failover(gw, "model", victim, watch_for=after))

        results = await gw.load(duration=before + after, rate=rate, during=kill_then_watch)
    (timing,) = timings
    during = [r for r in results if r.at >= timing.killed_at]
    ok = sum(r.status == 200 for r in during)
    out = timing.out_of_rotation_s
    return {
        "last_routed_ms": round(timing.last_routed_s * 1000, 1),
        "out_of_rotation_ms": None if out is None else round(out * 1000, 1),
        "first_poll_ms": round(timing.first_poll_s * 1000, 1),
        "requests_during": len(during),
        "failed_during": len(during) - ok,
        "success_rate": ok / len(during) if during else float("nan"),
        "requests_total": len(results),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rate", type=float, default=200.0, help="client requests per second")
    parser.add_argument("--quick", action="store_true", help="3 trials, shorter events")
    args = parser.parse_args(argv)
    trials = 3 if args.quick else args.trials
    before, after = (0.5, 1.5) if args.quick else (1.0, 3.0)

    rows: list[dict[str, Any]] = []
    for i in range(trials):
        row = asyncio.run(run_trial(rate=args.rate, before=before, after=after))
        rows.append(row)
        print(f"trial {i + 1}/{trials}: {row}", flush=True)

    last = [r["last_routed_ms"] for r in rows]
    out = [r["out_of_rotation_ms"] for r in rows if r["out_of_rotation_ms"] is not None]
    rates = [r["success_rate"] for r in rows]
    summary = {
        "trials": trials,
        "rate_rps": args.rate,
        "last_routed_p50_ms": percentile(last, 50),
        "last_routed_max_ms": max(last),
        "out_of_rotation_p50_ms": percentile(out, 50) if out else None,
        "out_of_rotation_max_ms": max(out) if out else None,
        "never_marked_out": trials - len(out),
        "first_poll_p50_ms": percentile([r["first_poll_ms"] for r in rows], 50),
        "success_rate_p50": percentile(rates, 50),
        "success_rate_min": min(rates),
        "success_rate_mean": statistics.fmean(rates),
        "failed_requests_total": sum(r["failed_during"] for r in rows),
        "requests_during_total": sum(r["requests_during"] for r in rows),
    }
    print_table(
        f"Failover: kill 1 of 3 replicas at {args.rate:g} rps ({trials} trials)",
        ["metric", "p50", "worst"],
        [
            ["kill -> last routed request (ms)", summary["last_routed_p50_ms"], max(last)],
            [
                "kill -> ejected/unhealthy (ms)",
                summary["out_of_rotation_p50_ms"],
                summary["out_of_rotation_max_ms"],
            ],
            [
                "kill -> first admin poll answer (resolution, ms)",
                summary["first_poll_p50_ms"],
                max(r["first_poll_ms"] for r in rows),
            ],
            [
                "success rate from the kill on",
                f"{summary['success_rate_p50']:.4%}",
                f"{summary['success_rate_min']:.4%}",
            ],
        ],
    )
    path = write_results(
        "failover",
        {
            "summary": summary,
            "trials": rows,
            "command": " ".join(["bench/failover.py", *(argv or sys.argv[1:])]),
            "environment": environment(),
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
