"""The deployment guide's acceptance load test: locust users at 1 request/s each against
``inferway run`` + ``inferway serve`` on the tiny model (issue 15 goal 3: p99 < 50 ms at 1,000
users; 2,000 recorded), through the gateway and straight to the backend in the same run, and
against a static server that answers at once (``floor``: the latency locust itself adds).

Real processes on loopback: ``inferway serve`` over a generated repository (the tiny MLP with
adaptive batching), ``inferway run`` with a one-route policy in front of it, and locust
(headless, ``FastHttpUser``, ``constant(1)`` think time: each user sends, waits for the
answer, sleeps 1 s, so a spawned cohort arrives in bursts as locust users do) through
``inferway verify``'s bounded locust runner. Targets are run in a rotated order per round.

    .venv/bin/python bench/locust_acceptance.py                  # 1,000 and 2,000 users, 60 s
    .venv/bin/python bench/locust_acceptance.py --quick          # 200 users, 10 s
    .venv/bin/python bench/locust_acceptance.py --spawn-rate 50 --duration 70 --rounds 2
    .venv/bin/python bench/locust_acceptance.py --serve-arg=--workers --serve-arg=2
    .venv/bin/python bench/locust_acceptance.py --pin            # locust on CPU 0, servers on 1

p99 is judged over the requests sent once every user has started (``--include-ramp``: all);
the ramp's p99 and that of all requests are reported beside it, and how late locust's own
event loop ran (its p99 and max over the run: a delay every request in flight shares).

Writes bench/results/locust_acceptance.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from _common import environment, free_port, print_table, write_results
from batching_models import NOFILL, TINY_SIZES, build_bench_repository, served_name

from inferway.tools.verify.expect import Probe
from inferway.tools.verify.load import LoadSettings, run_load

MODEL = served_name("tiny", "adaptive")
MODEL_NOFILL = served_name("tiny", NOFILL)
HEAPS = ("frozen", "plain", "deferred")
"""How locust's collector is set: frozen heap (verify's default), none, frozen + no full GC."""


def _body() -> bytes:
    row = [((i * 37) % 100) / 100 for i in range(TINY_SIZES[0])]
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, TINY_SIZES[0]], "data": row}
    return json.dumps({"inputs": [tensor]}).encode()


def _policy(listener: int, backend: int) -> str:
    return f"""version: 1
listeners:
  - {{name: main, address: 127.0.0.1, port: {listener}}}
services:
  - name: model
    endpoints: ["127.0.0.1:{backend}"]
routes:
  - name: all
    backends: [{{service: model}}]
"""


def _wait(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 90) -> None:
    body = _body()
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            request = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url} within {timeout_s:.0f} s")
        time.sleep(0.3)


def _full_gc_ms(result: dict[str, Any]) -> str:
    full = result["load_generator"]["gc"].get("2")
    return f"{full['max_ms']:.1f}" if full else "none"


def _lag(result: dict[str, Any], which: str) -> str:
    """The load generator's own loop lateness (generator_health.py), formatted."""
    generator = result["load_generator"]
    value = generator["loop_lag_max_ms"] if which == "max" else generator["loop_lag_ms"][which]
    return "-" if value is None else f"{value:.1f}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _cpu_split(pin: bool) -> tuple[tuple[int, ...], set[int]]:
    """(locust's CPUs, the servers' CPUs); both empty when not pinning."""
    if not pin:
        return (), set()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    return (cpus[0],), set(cpus[1:])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", default="1000,2000")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--spawn-rate", type=float, default=200.0, help="users started per s")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--targets",
        default="gateway,direct,floor",
        help="gateway (Envoy + backend), direct (backend), floor (static answers: what locust "
        "itself adds), direct-nofill (backend, the model without batching.fill_when_busy)",
    )
    parser.add_argument("--sla-p99-ms", type=float, default=50.0)
    parser.add_argument("--serve-arg", action="append", default=[], help="extra serve option")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="locust on CPU 0, the gateway and the backend on the other CPUs (needs 2+)",
    )
    parser.add_argument(
        "--include-ramp",
        action="store_true",
        help="judge the ramp too (default: only requests sent once every user has started, "
        "as locust's --reset-stats; the ramp's figures are reported beside)",
    )
    parser.add_argument(
        "--locust-heaps",
        default="frozen",
        help="frozen (locust's start-up heap kept from its collector, as verify does), plain "
        "(not), deferred (frozen, and locust's full collections kept out of the run), or a "
        "list (frozen,deferred): every target run with each, side by side",
    )
    parser.add_argument("--quick", action="store_true", help="200 users, 10 s")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results)")
    args = parser.parse_args(argv)
    if args.quick:
        args.users, args.duration, args.spawn_rate = "200", 10.0, 100.0
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    users = [int(u) for u in args.users.split(",")]
    targets = [t for t in args.targets.split(",") if t]
    heaps = [h for h in args.locust_heaps.split(",") if h]
    if not heaps or set(heaps) - set(HEAPS):
        raise SystemExit(f"--locust-heaps: a list of {', '.join(HEAPS)}")
    cli = [sys.executable, "-m", "inferway.cli.entry"]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="inferway-locust-") as scratch:
        root = Path(scratch)
        build_bench_repository(root / "models", {"tiny": TINY_SIZES})
        http, listener = free_port(), free_port()
        serve = [*cli, "serve", "--model-repository", str(root / "models")]
        serve += ["--http-port", str(http), "--grpc-port", str(free_port()), *args.serve_arg]
        (root / "policy.yaml").write_text(_policy(listener, http))
        run = [*cli, "run", "-f", str(root / "policy.yaml"), "--workdir", str(root / "gw")]
        run += ["--xds-port", str(free_port()), "--admin-port", str(free_port())]
        run += ["--envoy-admin-port", str(free_port())]
        logs = (root / "serve.log").open("wb"), (root / "run.log").open("wb")
        locust_cpus, server_cpus = _cpu_split(args.pin)
        pin = None if not server_cpus else (lambda: os.sched_setaffinity(0, server_cpus))
        backend = subprocess.Popen(serve, stdout=logs[0], stderr=subprocess.STDOUT, preexec_fn=pin)
        gateway = subprocess.Popen(run, stdout=logs[1], stderr=subprocess.STDOUT, preexec_fn=pin)
        floor_port = free_port()
        static = Path(__file__).with_name("static_http_server.py")
        floor = subprocess.Popen(
            [sys.executable, str(static), str(floor_port)],
            preexec_fn=pin,
        )
        urls = {
            "direct": f"http://127.0.0.1:{http}",
            "gateway": f"http://127.0.0.1:{listener}",
            "floor": f"http://127.0.0.1:{floor_port}",
            "direct-nofill": f"http://127.0.0.1:{http}",
        }
        unknown = set(targets) - set(urls)
        if unknown:
            raise SystemExit(f"--targets: unknown {', '.join(sorted(unknown))}")
        try:
            path = f"/v2/models/{MODEL}/infer"
            _wait(urls["direct"] + path, backend, "inferway serve")
            _wait(urls["gateway"] + path, gateway, "inferway run")
            _wait(urls["floor"] + path, floor, "the static floor server")
            probes = {
                t: Probe(
                    "infer",
                    f"/v2/models/{MODEL_NOFILL}/infer" if t == "direct-nofill" else path,
                    (("content-type", "application/json"),),
                    _body(),
                )
                for t in urls
            }
            for round_ in range(args.rounds):
                runs_ = [(t, h) for t in targets for h in heaps]
                order = runs_[round_ % len(runs_) :] + runs_[: round_ % len(runs_)]
                for n in users:
                    for target, heap in order:
                        settings = LoadSettings(
                            users=n,
                            duration_s=args.duration,
                            spawn_rate=args.spawn_rate,
                            think_time_s=1.0,
                            sla_p99_ms=args.sla_p99_ms,
                            steady_only=not args.include_ramp,
                            cpus=locust_cpus,
                            freeze_heap=heap != "plain",
                            defer_full_gc=heap == "deferred",
                        )
                        report = run_load(urls[target], [probes[target]], settings)
                        result = report.result
                        latency = result["latency_ms"]
                        runs.append(
                            {
                                "round": round_,
                                "target": target,
                                "locust_heap": heap,
                                "users": n,
                                "requests": result["requests"],
                                "failures": result["failures"],
                                "throughput_rps": result["throughput_rps"],
                                "p50_ms": latency["p50"],
                                "p95_ms": latency["p95"],
                                "p99_ms": latency["p99"],
                                "ramp_s": result["spawned_after_s"],
                                "ramp_requests": result["ramp"]["requests"],
                                "ramp_p99_ms": result["ramp"]["latency_ms"]["p99"],
                                "all_p99_ms": result["all_latency_ms"]["p99"],
                                "sla_met": report.ok,
                                "load_generator": result["load_generator"],
                                "timeline": result["timeline"],
                            }
                        )
                        print(
                            f"{target:8} {heap:8} {n:5} users: "
                            f"{result['throughput_rps']:7.0f} req/s, "
                            f"p99 {latency['p99']:.1f} ms (with the ramp "
                            f"{result['all_latency_ms']['p99']:.1f} ms), "
                            f"failures {result['failures']}; locust's loop late by p99 "
                            f"{_lag(result, 'p99')} ms, at most {_lag(result, 'max')} ms; "
                            f"longest full GC {_full_gc_ms(result)} ms, peak memory "
                            f"{result['load_generator'].get('peak_rss_mb') or 0:.0f} MB",
                            flush=True,
                        )
        finally:
            _stop(floor)
            _stop(gateway)
            _stop(backend)
            for log in logs:
                log.close()
    rows = [
        (
            r["target"],
            r["locust_heap"],
            r["users"],
            r["round"] + 1,
            f"{r['throughput_rps']:.0f}",
            f"{r['p50_ms']:.1f}",
            f"{r['p95_ms']:.1f}",
            f"{r['p99_ms']:.1f}",
            f"{r['ramp_p99_ms']:.1f}" if r["ramp_p99_ms"] is not None else "-",
            f"{r['all_p99_ms']:.1f}",
            _lag(r, "p99"),
            _lag(r, "max"),
            r["failures"],
            "met" if r["sla_met"] else "MISSED",
        )
        for r in runs
    ]
    print_table(
        f"locust, 1 req/s per user, {args.duration:g} s per run (SLA p99 < {args.sla_p99_ms:g} ms)",
        (
            "target",
            "locust heap",
            "users",
            "round",
            "req/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "ramp p99",
            "all p99",
            "locust lag p99",
            "lag max",
            "failures",
            "SLA",
        ),
        rows,
    )
    settings = {**vars(args), "out": None if args.out is None else str(args.out)}
    data = {"environment": environment(), "args": settings, "runs": runs}
    print(f"wrote {write_results('locust_acceptance', data, args.out)}")
    return data


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
