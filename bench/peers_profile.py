"""Where the CPU goes per request at one load point, per server and client kind (issue 37).

``peers.py`` gives wall-clock ratios, which on a shared 2-core host move with the other load.
This script runs the same servers and clients and records what moves much less: CPU seconds
per request of the server (each of its processes, the main thread apart from the others: the
event loop against ONNX Runtime / batch threads) and of the client process, and how batches
formed (the server's own batch-size histogram from /metrics: inferway's and Mosec's), and
what the scheduler did with a thread client's threads (CPU migrations and context switches a
request: how much its GIL hand-offs cost, which depends on how the server answers), and
where a thread client's requests waited (thread_states.py: at the server, on the client's own
GIL, or on a core; the first over the rate is the time a request spent at the server, the same
measure for every server). With ``--py-spy DIR`` it also samples the server's Python stacks
during each cell (py-spy, raw collapsed stacks, one file per cell).

    .venv/bin/python bench/peers_profile.py --servers inferway-fast,mosec --concurrency 64

Writes ``bench/results/peers_profile.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from _common import environment, print_table, write_results
from batching_models import TINY_SIZES, build_bench_repository
from core_pinning import pin_tree, split_cores
from loadgen import LoadWorker
from peers import DEFAULT_VENVS, Clients, check_answer, measure, start_peer, state_threads
from prometheus_client.parser import text_string_to_metric_families
from thread_clients import THREAD_NAME, ThreadClientWorker
from thread_states import ThreadStateSampler

__all__ = ["main"]

Cpu = dict[str, float]


def thread_cpu(pid: int) -> Cpu:
    """CPU seconds so far of every process in ``pid``'s tree: ``name:main`` (the thread that
    runs the event loop, or Mosec's Python worker's main thread) and ``name:other``."""
    found: Cpu = {}
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return found
    for i, proc in enumerate(tree):
        try:
            label = f"{i}:{proc.name()}"
            for thread in proc.threads():
                part = "main" if thread.id == proc.pid else "other"
                key = f"{label}:{part}"
                found[key] = found.get(key, 0.0) + thread.user_time + thread.system_time
        except psutil.Error:
            continue
    return found


_BATCHER_KEYS = {
    "_loop_busy": -1.0,
    "_batch_fill_waits": -2.0,
    "_batch_return_waits": -3.0,
    "_batches_on_loop": -4.0,
    "batch_size_sum": -5.0,
}
"""inferway's batcher series, kept beside the buckets under negative keys: the loop's busy
share it saw, its waits to fill (fill_when_busy), its holds for returning clients
(wait_for_returns), its batches computed on the loop's thread (compute_thread), the rows its
batches held (the batch-size histogram's sum; the model with the most, where several serve)."""


def batch_histogram(port: int) -> dict[float, float]:
    """Cumulative batch-size bucket counts (upper bound -> count) from the server's /metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    if not text.startswith("#"):  # a server without /metrics (the floors answer anything)
        return {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("batch_size_bucket"):
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            else:
                for suffix, key in _BATCHER_KEYS.items():
                    if sample.name.endswith(suffix):
                        buckets[key] = max(buckets.get(key, 0.0), sample.value)
    return buckets


def batch_shape(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """Batches in the cell and how many rows the batches held, from two histogram scrapes."""
    extra = {
        "loop_busy": after.get(-1.0),
        "fill_waits": after.get(-2.0, 0) - before.get(-2.0, 0),
        "return_waits": after.get(-3.0, 0) - before.get(-3.0, 0),
        "batches_on_loop": after.get(-4.0, 0) - before.get(-4.0, 0),
        "rows": after.get(-5.0, 0) - before.get(-5.0, 0),
    }
    delta = {b: after[b] - before.get(b, 0.0) for b in sorted(after) if b >= 0}
    total = delta.get(float("inf"), 0.0)
    if not total:
        return {"batches": 0, **extra}
    shares, below = {}, 0.0
    for bound, cumulative in delta.items():
        shares[str(bound)] = round((cumulative - below) / total, 3)
        below = cumulative
    return {"batches": total, "share_per_bucket": shares, **extra}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="inferway-fast,mosec")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--kinds", default="loadgen:keepalive,loadgen:new,threads:keepalive,threads:new"
    )
    parser.add_argument("--ort-threads", type=int, default=1)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup-requests", type=int, default=200)
    parser.add_argument("--duration", type=float, default=4.0, help="loadgen seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--venvs", type=Path, default=DEFAULT_VENVS)
    parser.add_argument("--py-spy", type=Path, default=None, help="folder for py-spy stacks")
    parser.add_argument(
        "--pin-cores",
        action="store_true",
        help="the clients on the first core, every server on the others (as peers.py)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    rows, cells = [], []
    with tempfile.TemporaryDirectory(prefix="inferway-peers-profile-") as scratch:
        roots = {True: Path(scratch) / "models", False: Path(scratch) / "models-defaults"}
        onnx = build_bench_repository(roots[True], {"tiny": TINY_SIZES})["tiny"]
        state_threads(roots[True], args.ort_threads)
        roots[False] = roots[True]
        clients = Clients(LoadWorker(), ThreadClientWorker())
        cores = split_cores() if args.pin_cores else None
        try:
            if cores is not None:
                clients.pin(cores[0])
            for name in args.servers.split(","):
                peer = start_peer(name, roots, onnx, args.venvs, Path(scratch), args.ort_threads)
                try:
                    if cores is not None:
                        pin_tree(peer.pid, cores[1])
                    if not name.startswith("floor"):  # a fixed answer, by design
                        check_answer(peer, onnx)
                    for kind in args.kinds.split(","):
                        client, mode = kind.split(":")
                        client_pid = (
                            clients.threads.pid if client == "threads" else clients.loadgen.pid
                        )
                        spy = None
                        if args.py_spy is not None:
                            args.py_spy.mkdir(parents=True, exist_ok=True)
                            out = args.py_spy / f"{name}-{client}-{mode}.txt"
                            spy = subprocess.Popen(
                                [
                                    py_spy,
                                    "record",
                                    "--pid",
                                    str(peer.pid),
                                    "--format",
                                    "raw",
                                    "--rate",
                                    "200",
                                    "--subprocesses",
                                    "--threads",
                                    "-o",
                                    str(out),
                                ],
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            )
                            time.sleep(1.0)
                        hist0, cpu0 = batch_histogram(peer.port), thread_cpu(peer.pid)
                        client0 = sum(psutil.Process(client_pid).cpu_times()[:2])
                        places = (
                            ThreadStateSampler(
                                client_pid, comm=THREAD_NAME, threads=args.concurrency
                            )
                            if client == "threads"
                            else None
                        )
                        with places or contextlib.nullcontext():
                            point = measure(
                                clients, client, peer, args.concurrency, mode == "keepalive", args
                            )
                        waits = _waits(places, point["throughput"])
                        cpu1, hist1 = thread_cpu(peer.pid), batch_histogram(peer.port)
                        client1 = sum(psutil.Process(client_pid).cpu_times()[:2])
                        if spy is not None:
                            spy.send_signal(2)
                            spy.wait(30)
                        n = point["throughput"] and point["throughput"]
                        # the cell's requests include the warm-up: CPU is per measured+warm-up
                        served = _served(args, client, point)
                        per = {k: (cpu1[k] - cpu0.get(k, 0.0)) / served * 1e6 for k in cpu1}
                        server_us = sum(per.values())
                        client_us = (client1 - client0) / served * 1e6
                        cell = {
                            "server": name,
                            "client": client,
                            "connections": mode,
                            **point,
                            "server_cpu_us_per_request": server_us,
                            "client_cpu_us_per_request": client_us,
                            "server_cpu_by_thread_us": per,
                            "batches": batch_shape(hist0, hist1),
                            "client_threads": waits,
                            "requests_counted": served,
                        }
                        cells.append(cell)
                        top = ", ".join(
                            f"{k} {v:.0f}"
                            for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:3]
                        )
                        batches = cell["batches"].get("batches", 0)
                        rows.append(
                            (
                                name,
                                client,
                                mode,
                                f"{n:.0f}",
                                f"{point['p99_ms']:.1f}",
                                f"{server_us:.0f}",
                                f"{client_us:.0f}",
                                _sched_text(point.get("client_sched_per_request")),
                                f"{served / batches:.1f}" if batches else "-",
                                _waits_text(waits),
                                top,
                            )
                        )
                        print(rows[-1], cell["batches"], flush=True)
                finally:
                    peer.stop()
        finally:
            clients.close()
    print_table(
        f"c={args.concurrency}, CPU per request (us)"
        f"{', clients and servers on cores of their own' if args.pin_cores else ''}, "
        f"load average {os.getloadavg()[0]:.1f}",
        (
            "server",
            "client",
            "conn",
            "req/s",
            "p99 ms",
            "server us/req",
            "client us/req",
            "client migr / cs a req",
            "rows/batch",
            "client threads: at server / GIL / CPU (server ms a req)",
            "top threads us/req",
        ),
        rows,
    )
    data = {"environment": environment(), "cells": cells}
    data["args"] = {k: str(v) for k, v in vars(args).items()}
    print(f"wrote {write_results('peers_profile', data)}")
    return 0


def _waits(places: ThreadStateSampler | None, throughput: float) -> dict[str, Any] | None:
    """Where the thread client's threads waited on average (thread_states.py) and, by Little's
    law, the time a request spent at the server as the client saw it; None for loadgen (one
    thread) or where the kernel showed nothing (the reason is printed)."""
    if places is None:
        return None
    means = places.means()
    if means is None:
        print(f"no thread states: {places.failure or 'no sample'}", flush=True)
        return None
    return {
        **{k: round(v, 2) for k, v in means.items()},
        "samples": places.samples,
        "unshown_share": round(places.unshown_share, 4),
        "server_ms_per_request": means["server"] / throughput * 1e3 if throughput else None,
    }


def _waits_text(waits: dict[str, Any] | None) -> str:
    if waits is None:
        return "-"
    at = waits["server_ms_per_request"]
    return (
        f"{waits['server']:.1f} / {waits['gil']:.1f} / {waits['cpu']:.1f} ({at:.1f})"
        if at is not None
        else "-"
    )


def _sched_text(sched: dict[str, float] | None) -> str:
    """The thread client's CPU migrations and context switches (voluntary + not) a request."""
    if not sched:
        return "-"
    switches = sched["voluntary_switches"] + sched["involuntary_switches"]
    return f"{sched['migrations']:.1f} / {switches:.1f}"


def _served(args: argparse.Namespace, client: str, point: dict[str, Any]) -> float:
    """Requests the server answered during the cell (warm-up included: CPU counts it too)."""
    if client == "threads":
        return float(args.requests + args.warmup_requests)
    return float(point["throughput"] * (args.duration + args.warmup))


if __name__ == "__main__":
    sys.exit(main())
