"""Endpoint picker overhead end to end (issue 35: "< 1 ms p99 per request at 500 req/s"): real
Envoy configured by a real gateway, fast OpenAI-style upstreams, open-loop Poisson load, and
the same service with no picker, with the picker in the gateway's process, with the picker
in a supervised sidecar process (``picker: {process: sidecar}``), every picker asked over
``--transport`` (``http``, the policy's default, or ``ext_proc``, GAIE's protocol), and picked
in Envoy (``picker: {process: envoy}``: prefix hash and Maglev, the gateway scraping the
upstreams and leaving saturated ones out), and scored in Envoy (``pick: score``: the scoring
picker in Envoy's Lua filter), side by side in one run. Each target is a route of one listener
(``/plain/``, ``/gateway/``, ``/sidecar/``, ``/envoy/``, ``/scored/``) to its own service over
the same upstreams; rounds rotate the targets' order;
figures are medians over rounds. Added latency = a picker target's p50/p99 minus ``/plain/``'s
in the same round (the round trip to the picker, the body buffering and the pick). CPU per
request: each process's CPU seconds over the round / requests sent (``/proc``: the gateway's,
the sidecar's and Envoy's); added CPU = all three together minus ``/plain/``'s in the same
round.

Then the same rounds during a policy reload storm (``--storm-rate`` edits/s, each resolved,
translated, pushed to Envoy and followed by the picker keeper: a busy control plane), where
an in-process picker shares its event loop with that work and a sidecar does not.

Then robustness: under the same load the sidecar process of a ``fail: open`` and of a ``fail:
closed`` service is SIGKILLed mid-round: the answers by status, the slowest 200, requests with
no answer at all, and the supervisor's restart time (death seen to the new process serving).

    .venv/bin/python bench/picker_overhead.py                 # 3 rounds x 10 s per target
    .venv/bin/python bench/picker_overhead.py --quick         # 2 rounds x 4 s
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import psutil
from _common import (
    add_choice_list,
    choice_list,
    environment,
    free_port,
    percentile,
    print_table,
    write_results,
)
from _picker_procs import STORM_ENDPOINT, backends_main, chat_payloads, gateway_main, load_main

__all__ = ["main"]

TARGETS = ("plain", "gateway", "sidecar", "envoy", "scored")
SERVICE = """  - name: {name}
    endpoints: [{endpoints}]
{picker}"""
PICKER = """    picker:
      listen: 127.0.0.1:{port}
      http_listen: 127.0.0.1:{http_port}
      transport: {transport}
      process: {process}
      fail: {fail}
      metrics_path: null
"""


def build_policy(
    listener: int, endpoints: list[int], ports: dict[str, int], transport: str = "http"
) -> str:
    """One listener; a route and a service per target (and the fail-closed sidecar's), each
    picker asked over ``transport``."""
    listed = ", ".join(f'"127.0.0.1:{p}"' for p in endpoints)

    def picker(name: str, process: str, fail: str) -> str:
        return PICKER.format(port=ports[name], http_port=ports[f"{name}_http"],
                             transport=transport, process=process, fail=fail)  # fmt: skip

    pickers = {
        "plain": "",
        "gateway": picker("gateway", "gateway", "open"),
        "sidecar": picker("sidecar", "sidecar", "open"),
        "closed": picker("closed", "sidecar", "closed"),
        # Envoy picks (prefix hash, Maglev); the gateway scrapes the upstreams every second
        "envoy": "    picker:\n      process: envoy\n",
        # the scoring picker in Envoy's Lua filter; the load scraped and pushed the same way
        "scored": "    picker:\n      process: envoy\n      pick: score\n",
    }
    services = "".join(
        SERVICE.format(name=name, endpoints=listed, picker=picker)
        for name, picker in pickers.items()
    )
    routes = "".join(
        f"  - name: {name}\n    match: {{path: {{prefix: /{name}/}}}}\n"
        f"    backends: [{{service: {name}}}]\n"
        for name in pickers
    )
    services += f'  - name: storm\n    endpoints: ["{STORM_ENDPOINT}"]\n'
    return (
        f"version: 1\nlisteners:\n  - name: ingress\n    port: {listener}\n"
        f"services:\n{services}routes:\n{routes}"
    )


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    times: dict[str, float] = {}
    for name, pid in pids.items():
        t = psutil.Process(pid).cpu_times()
        times[name] = t.user + t.system
    return times


def _start(target: Any, *args: Any) -> tuple[mp.process.BaseProcess, Connection]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(*args, child), daemon=True)
    process.start()
    child.close()
    return process, parent


def _stop(process: mp.process.BaseProcess, conn: Connection, message: Any) -> None:
    with contextlib.suppress(OSError):
        conn.send(message)
    process.join(15)
    if process.is_alive():
        process.kill()
        process.join(5)


def measure_round(
    args: argparse.Namespace, load: Connection, payloads: dict[str, list[bytes]],
    pids: dict[str, int], target: str, seed: int,
) -> dict[str, Any]:  # fmt: skip
    before = _cpu(pids)
    started = time.perf_counter()
    load.send((payloads[target], args.listener, args.rate, args.duration, args.warmup, seed))
    result = load.recv()
    elapsed = time.perf_counter() - started
    spent = {k: v - before[k] for k, v in _cpu(pids).items()}
    latencies = result["latencies_s"]
    requests = result["sent"] * (args.duration + args.warmup) / args.duration
    return {
        "target": target,
        "sent": result["sent"],
        "ok": len(latencies),
        "errors": len(result["errors"]),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "cpu_us_per_request": {k: v / requests * 1e6 for k, v in spent.items()},
        "wall_s": elapsed,
        "send_lag_p99_ms": result["send_lag_p99_ms"],
    }


def robustness(
    args: argparse.Namespace, load: Connection, gateway: Connection,
    payloads: dict[str, list[bytes]], pids: dict[str, int], target: str, port: int,
) -> dict[str, Any]:  # fmt: skip
    load.send((payloads[target], args.listener, args.rate, args.kill_duration, 0.0, 99))
    time.sleep(args.kill_duration / 3)
    os.kill(pids[f"sidecar:{port}"], signal.SIGKILL)
    result = load.recv()
    gateway.send("sidecars")
    status = gateway.recv()[port]
    latencies = result["latencies_s"]
    unanswered = sum(1 for e in result["errors"] if e in ("unanswered", "TimeoutError"))
    return {
        "target": target,
        "sent": result["sent"],
        "statuses": result["statuses"],
        "unanswered": unanswered,
        "max_ok_ms": max(latencies) * 1000 if latencies else None,
        "restart_s": status["last_restart_s"],
        "restarts": status["restarts"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--upstreams", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--prefix-chars", type=int, default=4000)
    parser.add_argument("--kill-duration", type=float, default=6.0)
    parser.add_argument(
        "--storm-rate", type=float, default=20.0,
        help="policy edits/s applied during the busy-control-plane rounds (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--transport", choices=("http", "ext_proc"), default="http",
        help="how Envoy asks the pickers (http: the policy's default; ext_proc: GAIE's)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="2 rounds of 4 s")
    add_choice_list(
        parser,
        "--targets",
        TARGETS,
        "comma-separated, plain always included; the kill test runs when sidecar is among them",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration = 2, 4.0
    asked = choice_list(parser, "--targets", args.targets, TARGETS)
    targets = tuple(t for t in TARGETS if t == "plain" or t in asked)
    args.listener = free_port()
    names = ("gateway", "sidecar", "closed")
    ports = {name: free_port() for name in (*names, *(f"{n}_http" for n in names))}
    backends, backend_conn = _start(backends_main, args.upstreams)
    endpoints = backend_conn.recv()
    gateway, gateway_conn = _start(
        gateway_main, build_policy(args.listener, endpoints, ports, args.transport), free_port()
    )
    load, load_conn = _start(load_main)
    rounds: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    storm: list[dict[str, Any]] = []
    storm_edits: dict[str, int] = {}
    try:
        if gateway_conn.recv() != "ready":
            raise RuntimeError("picker bench: the gateway did not start")
        gateway_conn.send("pids")
        pids = gateway_conn.recv()
        cpu_pids = {"gateway": pids["gateway"], "envoy": pids["envoy"],
                    "sidecar": pids[f"sidecar:{ports['sidecar']}"]}  # fmt: skip
        payloads = {
            name: chat_payloads(args.listener, f"/{name}/v1/chat/completions",
                                args.tenants, args.prefix_chars)
            for name in (*TARGETS, "closed")
        }  # fmt: skip
        for r in range(args.rounds):
            order = targets[r % len(targets) :] + targets[: r % len(targets)]
            for target in order:
                rounds.append(measure_round(args, load_conn, payloads, cpu_pids, target, r))
                rounds[-1]["round"] = r
        if args.storm_rate > 0:
            gateway_conn.send(f"storm {args.storm_rate}")
            gateway_conn.recv()
            for r in range(args.rounds):
                order = targets[r % len(targets) :] + targets[: r % len(targets)]
                for target in order:
                    storm.append(measure_round(args, load_conn, payloads, cpu_pids, target, r))
                    storm[-1]["round"] = r
            gateway_conn.send("storm 0")
            storm_edits = gateway_conn.recv()
        for target in ("sidecar", "closed") if "sidecar" in targets else ():
            kills.append(robustness(args, load_conn, gateway_conn, payloads, pids, target,
                                    ports[target]))  # fmt: skip
    finally:
        _stop(load, load_conn, None)
        _stop(gateway, gateway_conn, "stop")
        _stop(backends, backend_conn, "stop")
    summary = summarize(rounds, args.rounds, targets)
    stormy = summarize(storm, args.rounds, targets) if storm else {}
    _table(f"Picker overhead at {args.rate:.0f} req/s open loop through Envoy, transport "
           f"{args.transport} (medians of {args.rounds} rounds x {args.duration:.0f} s)",
           summary)  # fmt: skip
    if stormy:
        _table(
            f"The same during a policy reload storm ({args.storm_rate:.0f} edits/s asked; "
            f"{storm_edits['edits']} applied, {storm_edits['versions']} distinct versions)",
            stormy,
        )
    if kills:
        print_table(
            "A picker process SIGKILLed under load",
            ["service", "sent", "statuses", "no answer", "slowest 200 ms", "restart s"],
            [[k["target"], k["sent"], k["statuses"], k["unanswered"],
              f"{k['max_ok_ms']:.1f}" if k["max_ok_ms"] is not None else "-",
              f"{k['restart_s']:.2f}" if k["restart_s"] is not None else "-"] for k in kills],
        )  # fmt: skip
    path = write_results(
        "picker_overhead",
        {"environment": environment(), "args": {k: v for k, v in vars(args).items()},
         "summary": summary, "rounds": rounds, "kills": kills,
         "storm_summary": stormy, "storm_rounds": storm, "storm_edits": storm_edits,
         "target_p99_added_ms": 1.0},
    )  # fmt: skip
    print(f"wrote {path}")
    return 0


def _table(title: str, summary: dict[str, dict[str, Any]]) -> None:
    rows = [
        [t, f"{s['p50_ms']:.3f}", f"{s['p99_ms']:.3f}", f"{s['added_p50_ms']:+.3f}",
         f"{s['added_p99_ms']:+.3f}", f"{s['cpu_us']['gateway']:.0f}",
         f"{s['cpu_us']['sidecar']:.0f}", f"{s['cpu_us']['envoy']:.0f}",
         f"{s['added_cpu_us']:+.0f}", s["errors"]]
        for t, s in summary.items()
    ]  # fmt: skip
    print_table(
        title,
        ["target", "p50 ms", "p99 ms", "added p50", "added p99", "gateway CPU us/req",
         "sidecar CPU us/req", "envoy CPU us/req", "added CPU us/req", "errors"],
        rows,
    )  # fmt: skip


def summarize(
    rounds: list[dict[str, Any]], count: int, targets: tuple[str, ...] = TARGETS
) -> dict[str, dict[str, Any]]:
    """Per target: medians over rounds, the added latency paired with /plain/ per round."""
    by = {(r["round"], r["target"]): r for r in rounds}
    summary: dict[str, dict[str, Any]] = {}
    for target in targets:
        mine = [by[(i, target)] for i in range(count)]
        plain = [by[(i, "plain")] for i in range(count)]
        summary[target] = {
            "p50_ms": statistics.median(r["p50_ms"] for r in mine),
            "p99_ms": statistics.median(r["p99_ms"] for r in mine),
            "added_p50_ms": statistics.median(
                m["p50_ms"] - p["p50_ms"] for m, p in zip(mine, plain, strict=True)
            ),
            "added_p99_ms": statistics.median(
                m["p99_ms"] - p["p99_ms"] for m, p in zip(mine, plain, strict=True)
            ),
            "cpu_us": {
                k: statistics.median(r["cpu_us_per_request"][k] for r in mine)
                for k in mine[0]["cpu_us_per_request"]
            },
            "added_cpu_us": statistics.median(
                sum(m["cpu_us_per_request"].values()) - sum(p["cpu_us_per_request"].values())
                for m, p in zip(mine, plain, strict=True)
            ),
            "errors": sum(r["errors"] for r in mine),
        }
    return summary


if __name__ == "__main__":
    sys.exit(main())
