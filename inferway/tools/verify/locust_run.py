"""The load part's locust run, in a process of its own: locust patches the standard library
for gevent when it is imported, which must never happen inside the inferway process (or its
tests' event loops). ``inferway verify`` starts ``python -m inferway.tools.verify.locust_run
CONFIG OUT``; CONFIG is JSON (host, users, spawn_rate, duration_s, think_time_s, requests as
path/headers/base64 body; optionally ``steady_only``: judge only the answers to requests sent
after every user was started, as locust's ``--reset-stats`` does; ``cpus``: the CPUs this
process may run on; ``freeze_heap``, default true, and ``defer_full_gc``, default false: see
generator_health). OUT receives the totals, the per-second timeline and what the load
generator itself added (``load_generator``: its collector's pauses, its loop's lateness, its
peak memory) as JSON.

Only the standard library (and generator_health, which imports only the standard library) is
imported at module level, and locust only inside :func:`main`, so importing this module (as
the import checks do) patches nothing.
"""

from __future__ import annotations

import base64
import gc
import itertools
import json
import math
import os
import sys
import time
from collections import Counter, defaultdict
from typing import Any

from inferway.tools.verify.generator_health import (
    LAG_TICK_S,
    GeneratorHealth,
    defer_full_collections,
    freeze_heap,
    peak_rss_mb,
)

__all__ = ["main", "percentile"]


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _quantiles(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {f"p{q}": percentile(ordered, q) for q in (50, 95, 99)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m inferway.tools.verify.locust_run CONFIG OUT\n")
        return 2
    with open(args[0], encoding="utf-8") as stream:
        config: dict[str, Any] = json.load(stream)
    if config.get("cpus"):
        os.sched_setaffinity(0, {int(c) for c in config["cpus"]})
    import gevent
    from locust import FastHttpUser, constant, events, task  # patches the stdlib for gevent
    from locust.env import Environment

    requests = [
        (r["path"], r["headers"], base64.b64decode(r["body"]), r["name"])
        for r in config["requests"]
    ]
    order = itertools.cycle(range(len(requests)))
    latencies: list[float] = []
    ramp: list[float] = []  # answers to requests sent before the last user started
    spawned: list[float] = []  # when spawning completed (time.time())
    steady_only = bool(config.get("steady_only", False))
    freeze = bool(config.get("freeze_heap", True))
    defer_full = bool(config.get("defer_full_gc", False))
    buckets: dict[int, list[float]] = defaultdict(list)
    bucket_failures: Counter[int] = Counter()
    statuses: Counter[str] = Counter()
    started = time.time()
    health = GeneratorHealth(started)

    cohort = max(1, math.floor(float(config["spawn_rate"])))  # locust starts this many at once
    users_started = itertools.count(1)

    class VerifyUser(FastHttpUser):
        host = config["host"]
        wait_time = constant(float(config.get("think_time_s", 0.0)))

        def on_start(self) -> None:
            if freeze and next(users_started) % cohort == 0:
                freeze_heap()  # each cohort as it starts: a long ramp's users live to the end

        @task
        def infer(self) -> None:
            path, headers, body, name = requests[next(order)]
            with self.client.post(
                path,
                data=body,  # type: ignore[arg-type]  # documented as str or bytes
                headers=headers,
                name=name,
                catch_response=True,
            ) as response:
                code = response.status_code or 0
                statuses[str(code)] += 1
                if code == 0 or code >= 500:
                    response.failure(f"HTTP {code}")
                else:
                    response.success()

    @events.request.add_listener
    def _record(response_time: float, exception: BaseException | None, **_: Any) -> None:
        now = time.time()
        second = int(now - started)
        sent = now - response_time / 1000.0
        (latencies if not steady_only or (spawned and sent >= spawned[0]) else ramp).append(
            response_time
        )
        buckets[second].append(response_time)
        if exception is not None:
            bucket_failures[second] += 1

    @events.spawning_complete.add_listener
    def _spawned(**_: Any) -> None:
        spawned.append(time.time())
        if freeze:
            freeze_heap()  # the users, their clients and greenlets live until the end

    env = Environment(user_classes=[VerifyUser], events=events)
    runner = env.create_local_runner()
    if freeze:
        freeze_heap(collect=True)  # see generator_health: locust's own full collections
    health.install()  # from here on: the collections made before the load are not the run's
    if defer_full:
        defer_full_collections()
    runner.start(int(config["users"]), spawn_rate=float(config["spawn_rate"]))
    watcher = gevent.spawn(health.watch_loop)

    def _stop() -> None:
        watcher.kill()  # stopping a thousand users holds the loop; that is not load
        runner.quit()

    gevent.spawn_later(float(config["duration_s"]), _stop)
    runner.greenlet.join()
    elapsed = time.time() - started
    lags = health.all_lags()
    total = env.stats.total
    document = {
        "users": int(config["users"]),
        "duration_s": elapsed,
        "requests": total.num_requests,
        "failures": total.num_failures,
        "throughput_rps": total.num_requests / elapsed if elapsed > 0 else 0.0,
        "latency_ms": _quantiles(latencies),
        "measured_requests": len(latencies),
        "steady_only": steady_only,
        "heap_frozen": freeze,
        "spawned_after_s": spawned[0] - started if spawned else None,
        "ramp": {"requests": len(ramp), "latency_ms": _quantiles(ramp)},
        "all_latency_ms": _quantiles(latencies + ramp),
        "statuses": dict(statuses),
        "load_generator": {
            "gc": health.gc_summary(),
            "loop_lag_ms": {"tick_ms": LAG_TICK_S * 1000.0, **_quantiles(lags)},
            "loop_lag_max_ms": max(lags, default=None),
            "frozen_objects": gc.get_freeze_count(),
            "full_collections_deferred": defer_full,
            "uncollected_objects": len(gc.get_objects(2)) if defer_full else None,
            "peak_rss_mb": peak_rss_mb(),
        },
        "errors": {str(k): v.occurrences for k, v in env.stats.errors.items()},
        "timeline": [
            {
                "second": second,
                "requests": len(values),
                "failures": bucket_failures[second],
                **_quantiles(values),
                "loop_lag_max_ms": health.lag_max_ms(second),
            }
            for second, values in sorted(buckets.items())
        ],
    }
    with open(args[1], "w", encoding="utf-8") as stream:
        json.dump(document, stream)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
