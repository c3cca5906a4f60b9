"""The LLM gateway's overhead on streamed chat completions, side by side in one run:
straight to an OpenAI-style engine, through Envoy on a plain route (no external processor,
no Lua), and through Envoy on an ``openai`` route (inferway: the LLM processor reads the
body and rewrites it for ``include_usage``; Envoy's Lua filter counts the answer's chunks,
drops the usage chunk and reports once per stream), once per ``llm.transport`` (``http``,
the default: the Lua filter asks the processor; ``ext_proc``: Envoy's external processing
filter does, over gRPC; two gateways, each with its own Envoy); at each concurrency, targets
rotated each round, medians over rounds.

Per stream two figures: time to first token (TTFT, client send to the first chunk with
content) and the path time (TTFT less the engine's own wait between having the request and
writing its first chunk, from CLOCK_MONOTONIC stamps the engine sends back; bench/_llm_fast.py):
what the path between client and engine costs, without the engine's timer lateness. "Added"
is a target's figure less direct's, per round, then the median over rounds; with five rounds
or more, the table gives a 95% interval for the added TTFT p99 (rounds resampled: a round is
what the machine's drift moves, so it says where another run's median may land). Plus the
gateway's CPU per stream: the processor (this process: control plane + LLM processor) and
Envoy, each less its idle rate.

The engine and the client are raw asyncio protocols on uvloop (bench/_llm_fast.py), each in
its own process, so at 100 streams they stay cheap next to the path measured.

    .venv/bin/python bench/llm_gateway_overhead.py                  # c=1, 16, 100; 4 s, 3 rounds
    .venv/bin/python bench/llm_gateway_overhead.py --quick          # 2 s each, one round
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    environment,
    free_port,
    median_interval,
    percentile,
    print_table,
    write_results,
)
from _llm_fast import client_main, engine_main
from gateway_overhead import spawn_server, stop_server

from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.backends.process_tuning import freeze_startup_heap
from inferway.gateway.foreground import run_event_loop
from inferway.gateway.runtime import GatewayOptions, start_gateway
from inferway.xds import type_urls
from inferway.xds.translate.llm_stream import SSE_MODULE_FILTER

__all__ = ["main"]

POLICY = """\
version: 1
listeners:
  - name: bench
    port: {listener_port}
llm:
  port: {llm_port}
  reports_port: {reports_port}
  transport: {transport}
  stream_reader: {reader}
services:
  - name: engine
    endpoints: ["127.0.0.1:{engine_port}"]
routes:
  - name: llm
    openai:
      model: bench
    backends: [{{service: engine}}]
  - name: plain
    match:
      path: {{prefix: /plain/}}
    backends: [{{service: engine}}]
"""
TARGETS = {
    "direct": "/v1/chat/completions",
    "envoy, plain route": "/plain/v1/chat/completions",
    "inferway": "/v1/chat/completions",
    "inferway, ext_proc": "/v1/chat/completions",
    "inferway, lua reader": "/v1/chat/completions",
}
"""``inferway`` is the default policy: ``llm.transport: http`` (the Lua filter asks the
processor) and ``stream_reader: auto`` (its Envoy reads streams with inferway's native module
when a C compiler built it; the table's header says which); ``inferway, ext_proc`` the same
policy with ``transport: ext_proc``, a second gateway; ``inferway, lua reader`` (with
``--lua-reader``) the default policy with ``stream_reader: lua``, a third."""
EXT_PROC = "inferway, ext_proc"
LUA_READER = "inferway, lua reader"
GATEWAY_OF = {
    "envoy, plain route": "http",
    "inferway": "http",
    "inferway, ext_proc": "ext_proc",
    LUA_READER: "http-lua",
}
"""Target -> its gateway: ``transport`` or ``transport-reader``."""
BODY = json.dumps(
    {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hello " * 64}]}
).encode()


def run_client(
    port: int, path: str, concurrency: int, duration: float, stagger: float = 0.0
) -> dict[str, Any]:
    context = mp.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=client_main,
        args=("127.0.0.1", port, path, BODY, concurrency, duration, stagger, sender),
    )
    process.start()
    deadline = time.monotonic() + duration + 60
    while not receiver.poll(0.2):
        if not process.is_alive() or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the client of 127.0.0.1:{port}{path} did not report")
    result: dict[str, Any] = receiver.recv()
    process.join(5)
    return result


def _cpu_s(pid: int | None) -> float:
    """A process's user+system CPU seconds (Linux /proc)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round_figures(result: dict[str, Any], wall: float, cpu: dict[str, float]) -> dict[str, Any]:
    ttft = [v / 1e6 for v in result["ttft_ns"]]
    path = [v / 1e6 for v in result["path_ns"]]
    streams = len(ttft) or 1
    return {
        "streams": len(ttft),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "path_p50_ms": percentile(path, 50),
        "path_p99_ms": percentile(path, 99),
        # the path's two halves: client to engine (the request side: Envoy, the processor)
        # and the engine's first chunk to the client (Envoy, the Lua stream reader)
        "request_leg_p50_ms": percentile([v / 1e6 for v in result["request_leg_ns"]], 50),
        "request_leg_p99_ms": percentile([v / 1e6 for v in result["request_leg_ns"]], 99),
        "answer_leg_p50_ms": percentile([v / 1e6 for v in result["answer_leg_ns"]], 50),
        "answer_leg_p99_ms": percentile([v / 1e6 for v in result["answer_leg_ns"]], 99),
        "tokens_per_s": result["tokens"] / result["elapsed"],
        "errors": result["errors"],
        "usage_seen": result["usage_seen"],
        "processor_cpu_ms_per_stream": cpu["processor_s"] * 1000 / streams,
        "envoy_cpu_ms_per_stream": cpu["envoy_s"] * 1000 / streams,
        "wall_s": wall,
        "slowest_paths": [  # where a tail sits: (ms, s into the round)
            (round(ms, 3), round((sent - result["started_ns"]) / 1e9, 3))
            for ms, sent in sorted(zip(path, result["path_sent_ns"], strict=True))[-5:]
        ],
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    engine, engine_conn, engine_port = spawn_server(
        engine_main, args.first_token_ms / 1000, args.token_ms / 1000, args.tokens
    )
    rounds: dict[tuple[str, int], list[dict[str, Any]]] = {}
    readers: dict[str, str] = {}
    wanted = [n for n in TARGETS if args.lua_reader or n != LUA_READER]
    with tempfile.TemporaryDirectory(prefix="inferway-bench-") as workdir:
        gateways: dict[str, Any] = {}
        listeners: dict[str, int] = {}
        try:
            for key in sorted({GATEWAY_OF[n] for n in wanted if n != "direct"}):
                transport, _, reader = key.partition("-")
                listeners[key] = free_port()
                policy = Path(workdir) / f"policy-{key}.yaml"
                policy.write_text(
                    POLICY.format(
                        listener_port=listeners[key],
                        llm_port=free_port(),
                        reports_port=free_port(),
                        engine_port=engine_port,
                        transport=transport,
                        reader=reader or "auto",
                    )
                )
                gateways[key] = await start_gateway(
                    GatewayOptions(
                        policy_path=policy,
                        xds_port=0,
                        admin_port=0,
                        envoy_admin_port=free_port(),
                        workdir=Path(workdir) / f"gw-{key}",
                        envoy_log_level="error",
                        envoy_concurrency=args.envoy_concurrency,
                    )
                )
            envoy_pids: dict[str, int | None] = {"direct": None}
            for name in (n for n in wanted if n != "direct"):
                transport = GATEWAY_OF[name]
                gateway = gateways[transport]
                assert gateway.supervisor is not None and gateway.llm is not None
                envoy_pids[name] = gateway.supervisor.pid
                if not await gateway.supervisor.wait_ready(30):
                    raise RuntimeError(f"Envoy of the {transport} gateway did not become ready")
            if args.freeze_heap:  # as `inferway run` does once started (gateway/foreground.py)
                freeze_startup_heap()
            ports = {n: engine_port if n == "direct" else listeners[GATEWAY_OF[n]] for n in wanted}
            readers.update({key: _stream_reader(g) for key, g in gateways.items()})
            for name in wanted:  # warm up, and check every target answers
                path = TARGETS[name]
                check = await asyncio.to_thread(run_client, ports[name], path, 2, 0.5)
                if check["errors"] or not check["ttft_ns"]:
                    raise RuntimeError(f"{name} did not answer a stream: {check['errors']} errors")
            # the idle CPU of both (health checks, stats, the control plane) is not the traffic's
            envoys = sorted({pid for pid in envoy_pids.values() if pid is not None})
            idle_started = time.perf_counter(), time.process_time()
            idle_envoy = {pid: _cpu_s(pid) for pid in envoys}
            await asyncio.sleep(2.0)
            span = time.perf_counter() - idle_started[0]
            processor_idle = (time.process_time() - idle_started[1]) / span
            envoy_idle = {pid: (_cpu_s(pid) - idle_envoy[pid]) / span for pid in envoys}
            idle_rate = (processor_idle, statistics.mean(envoy_idle.values()))
            names = [n for n in wanted if args.ext_proc or n != EXT_PROC]
            stream_s = (args.first_token_ms + (args.tokens - 1) * args.token_ms) / 1000
            for concurrency in args.concurrency:
                for number in range(args.rounds):
                    shift = number % len(names)
                    for name in names[shift:] + names[:shift]:
                        envoy_pid = envoy_pids[name]
                        started = time.perf_counter()
                        before = time.process_time(), _cpu_s(envoy_pid)
                        result = await asyncio.to_thread(
                            run_client,
                            ports[name],
                            TARGETS[name],
                            concurrency,
                            args.duration,
                            stream_s,
                        )
                        wall = time.perf_counter() - started
                        cpu = {
                            "processor_s": max(
                                0.0, time.process_time() - before[0] - idle_rate[0] * wall
                            ),
                            "envoy_s": max(
                                0.0,
                                _cpu_s(envoy_pid)
                                - before[1]
                                - envoy_idle.get(envoy_pid or 0, 0.0) * wall,
                            ),
                        }
                        figures = _round_figures(result, wall, cpu)
                        rounds.setdefault((name, concurrency), []).append(figures)
            processed = sum(g.llm.processor.requests for g in gateways.values())
        finally:
            for gateway in gateways.values():
                await gateway.stop()
            stop_server(engine, engine_conn)
    report = _report(rounds, idle_rate, processed)
    report["stream_readers"] = {
        name: readers[GATEWAY_OF[name]] for name in wanted if GATEWAY_OF.get(name) in readers
    }
    return report


def _stream_reader(gateway: Any) -> str:
    """``native`` when the gateway's Envoy got inferway's SSE module, else ``lua``."""
    cache = gateway.control_plane.cache
    for node in cache.node_status():
        snapshot = cache.get_snapshot(node.group)
        if snapshot is None:
            continue
        for listener in snapshot.resources_of(type_urls.LISTENER).values():
            for chain in listener.filter_chains:
                for network_filter in chain.filters:
                    manager = hcm_pb2.HttpConnectionManager()
                    if network_filter.typed_config.Unpack(manager) and any(
                        f.name == SSE_MODULE_FILTER for f in manager.http_filters
                    ):
                        return "native"
    return "lua"


_MEDIANS = (
    "ttft_p50_ms",
    "ttft_p99_ms",
    "path_p50_ms",
    "path_p99_ms",
    "request_leg_p50_ms",
    "request_leg_p99_ms",
    "answer_leg_p50_ms",
    "answer_leg_p99_ms",
    "tokens_per_s",
    "processor_cpu_ms_per_stream",
    "envoy_cpu_ms_per_stream",
)


def _report(
    rounds: dict[tuple[str, int], list[dict[str, Any]]],
    idle_rate: tuple[float, float],
    processed: int,
) -> dict[str, Any]:
    rows = []
    for (name, concurrency), figures in rounds.items():
        direct = rounds[("direct", concurrency)]
        row: dict[str, Any] = {
            "target": name,
            "concurrency": concurrency,
            "streams": sum(f["streams"] for f in figures),
            "errors": sum(f["errors"] for f in figures),
            "usage_chunks_seen": sum(f["usage_seen"] for f in figures),
        }
        for key in _MEDIANS:
            row[key] = round(statistics.median(f[key] for f in figures), 3)
        for key in ("ttft_p50_ms", "ttft_p99_ms", "path_p50_ms", "path_p99_ms"):
            added = [f[key] - d[key] for f, d in zip(figures, direct, strict=True)]
            row["added_" + key] = round(statistics.median(added), 3)
            row["added_" + key + "_rounds"] = [round(a, 3) for a in added]
            row["added_" + key + "_ci95"] = median_interval(added)
        row["gateway_cpu_ms_per_stream"] = round(
            row["processor_cpu_ms_per_stream"] * name.startswith("inferway")
            + row["envoy_cpu_ms_per_stream"] * (name != "direct"),
            3,
        )
        row["rounds"] = figures
        rows.append(row)
    return {
        "rows": rows,
        "idle_cpu_per_s": {"processor": idle_rate[0], "envoy": idle_rate[1]},
        "processor_streams": processed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 100])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-token-ms", type=float, default=20.0)
    parser.add_argument("--token-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument(
        "--envoy-concurrency",
        type=int,
        default=None,
        help="the gateways' Envoy worker threads (default: one per core, as `inferway run`)",
    )
    parser.add_argument(
        "--no-ext-proc",
        dest="ext_proc",
        action="store_false",
        help="leave the ext_proc gateway's target out of the rounds (it is still started and "
        "checked): three targets a round, a quarter less time",
    )
    parser.add_argument(
        "--lua-reader",
        action="store_true",
        help="add the target `inferway, lua reader`: the default policy with "
        "`llm.stream_reader: lua` (a third gateway), beside `inferway` (the native reader "
        "where it builds)",
    )
    parser.add_argument("--quick", action="store_true", help="2 s per target, one round")
    parser.add_argument(
        "--no-freeze-heap",
        dest="freeze_heap",
        action="store_false",
        help="leave the start-up heap to the collector (as before `inferway run` froze it)",
    )
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 2.0, 1
    load = Path("/proc/loadavg").read_text().split()[:3]
    result = run_event_loop(measure(args))  # the gateway's loop, as `inferway run` runs it
    result["loadavg"] = {"before": load, "after": Path("/proc/loadavg").read_text().split()[:3]}
    result["envoy_concurrency"] = args.envoy_concurrency or os.cpu_count()
    columns = [
        "target",
        "c",
        "streams",
        "TTFT p50",
        "TTFT p99",
        "path p50",
        "path p99",
        "+TTFT p50",
        "+TTFT p99",
        "95% interval",
        "+path p50",
        "+path p99",
        "tok/s",
        "gw CPU ms",
        "err",
    ]
    print_table(
        "streamed chat completions (ms, medians over rounds; + is less direct's, per round)",
        columns,
        [
            [
                r["target"],
                r["concurrency"],
                r["streams"],
                r["ttft_p50_ms"],
                r["ttft_p99_ms"],
                r["path_p50_ms"],
                r["path_p99_ms"],
                r["added_ttft_p50_ms"],
                r["added_ttft_p99_ms"],
                _interval_text(r["added_ttft_p99_ms_ci95"]),
                r["added_path_p50_ms"],
                r["added_path_p99_ms"],
                r["tokens_per_s"],
                r["gateway_cpu_ms_per_stream"],
                r["errors"],
            ]
            for r in result["rows"]
        ],
    )
    print_table(
        "the path's legs (ms, medians): client to engine / engine's first chunk to client",
        ["target", "c", "request p50", "request p99", "answer p50", "answer p99"],
        [
            [
                r["target"],
                r["concurrency"],
                r["request_leg_p50_ms"],
                r["request_leg_p99_ms"],
                r["answer_leg_p50_ms"],
                r["answer_leg_p99_ms"],
            ]
            for r in result["rows"]
        ],
    )
    for r in result["rows"]:
        if r["target"].startswith("inferway"):
            print(
                f"{r['target']}, c={r['concurrency']}: "
                f"processor CPU {r['processor_cpu_ms_per_stream']} ms, "
                f"Envoy CPU {r['envoy_cpu_ms_per_stream']} ms per stream "
                f"(Envoy alone: {_envoy_alone(result['rows'], r['concurrency'])} ms)"
            )
    readers = ", ".join(f"{n}: {r}" for n, r in result["stream_readers"].items())
    print(f"stream readers: {readers}")
    print(
        f"Envoy workers {result['envoy_concurrency']}; load average before / after: "
        f"{result['loadavg']['before']} / {result['loadavg']['after']}"
    )
    path = write_results(
        "llm_gateway_overhead",
        {
            **result,
            "args": {k: str(v) for k, v in vars(args).items()},
            "environment": environment(),
        },
        args.output,
    )
    print(f"wrote {path}")
    return 0


def _interval_text(interval: list[float] | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def _envoy_alone(rows: list[dict[str, Any]], concurrency: int) -> float:
    return next(
        float(r["envoy_cpu_ms_per_stream"])
        for r in rows
        if r["target"] == "envoy, plain route" and r["concurrency"] == concurrency
    )


if __name__ == "__main__":
    sys.exit(main())
