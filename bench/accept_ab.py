"""The fast front end taking every waiting connection a pass of the loop (``AcceptAll``, as
shipped) against uvloop's own accept (one a pass, as before), side by side, and the ramp that
used to leave the server in its one-row state (issue 37; docs/serving-performance.md).

Both servers are the tiny model under ``inferway serve``'s fast front end (ONNX Runtime at one
intra-op thread); ``accept-one`` differs only in how its listening socket is served. Two parts:

- **cells**: closed loops at c=64 (``loadgen`` or ``threads``, ``new`` or ``keepalive``), each
  round both servers in a rotated order; medians of the rounds;
- **ramps**: one client sending back to back on new connections for ``--ramp-s`` seconds, then
  64 ``urllib`` threads: the batches of the second phase (about one row each in the one-row
  state) and the connections waiting in the kernel's accept queue meanwhile.

    .venv/bin/python bench/accept_ab.py                        # shared cores, ~4 min
    .venv/bin/python bench/accept_ab.py --pin-cores --rounds 4  # the server on a core of its own
    .venv/bin/python bench/accept_ab.py --cells threads:new --ramps 6 -o json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
from _common import environment, percentile, print_table, write_results
from batching_models import TINY_SIZES, build_bench_repository, served_name
from core_pinning import pin_tree, split_cores
from loadgen import LoadSpec, LoadWorker
from peers import state_threads
from peers_profile import batch_histogram, batch_shape
from servers import ServerProcess, fast_backend_server_main
from thread_clients import ThreadCell, ThreadClientWorker

SERVERS = ("accept-all", "accept-one")
KINDS = ("loadgen:new", "threads:new", "loadgen:keepalive", "threads:keepalive")


def accept_one_server_main(root: str, conn: Connection) -> None:
    """``fast_backend_server_main`` with the listening socket served by uvloop itself."""
    from inferway.backends.protocol import fast_http

    async def start(
        self: Any, host: str, port: int, *, ssl_context: Any, backlog: int, reuse_port: bool
    ) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: fast_http.FastHttpConnection(self),
            host,
            port,
            ssl=ssl_context,
            backlog=backlog,
            reuse_port=reuse_port or None,
        )
        self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        return int(self._server.sockets[0].getsockname()[1])

    fast_http.FastHttpServer.start = start  # type: ignore[method-assign]
    fast_backend_server_main(root, conn)


def accept_queue(port: int) -> int | None:
    """Connections waiting in the kernel's accept queue of ``port`` (``ss``; None without)."""
    try:
        out = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=5
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(out[1]) if len(out) > 1 else None


class QueueWatch:
    """Samples ``accept_queue(port)`` every ``every_s`` in a thread while in a ``with``."""

    def __init__(self, port: int, every_s: float = 0.05) -> None:
        self._port, self._every = port, every_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            found = accept_queue(self._port)
            if found is not None:
                self.samples.append(found)
            self._stop.wait(self._every)

    def __enter__(self) -> QueueWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def mean(self) -> float | None:
        return round(statistics.mean(self.samples), 1) if self.samples else None


def request_body() -> bytes:
    """The tiny model's one-row KServe v2 JSON request."""
    row = np.random.default_rng(0).random((1, TINY_SIZES[0]), dtype=np.float32)
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, TINY_SIZES[0]]}
    tensor["data"] = row.ravel().tolist()
    return json.dumps({"inputs": [tensor]}).encode()


def start_servers(
    root: Path, targets: Mapping[str, Callable[[str, Connection], None]]
) -> tuple[tuple[LoadWorker, ThreadClientWorker], dict[str, ServerProcess]]:
    """The tiny model's repository under ``root`` (ONNX Runtime at one intra-op thread), the
    two client workers, and a server process for each of ``targets`` (name -> server main)."""
    build_bench_repository(root, {"tiny": TINY_SIZES})
    state_threads(root, 1)
    clients = (LoadWorker(), ThreadClientWorker())
    servers = {
        name: ServerProcess(target, (str(root),), metrics=True) for name, target in targets.items()
    }
    return clients, servers


def measure_cell(
    kind: str, server: ServerProcess, clients: tuple[LoadWorker, ThreadClientWorker], args: Any
) -> dict[str, Any]:
    """One closed loop of ``kind`` (``client:connections``) against the tiny model of
    ``server`` at ``args.concurrency``: its rate, p99 and how the batches formed."""
    client, connections = kind.split(":")
    keepalive = connections == "keepalive"
    model = served_name("tiny", "adaptive")
    before = batch_histogram(server.http_port)
    if client == "threads":
        cell = ThreadCell(
            "127.0.0.1",
            server.http_port,
            f"/v2/models/{model}/infer",
            request_body(),
            args.concurrency,
            keepalive,
            warmup=args.warmup_requests,
            requests=args.requests,
        )
        out = clients[1].run(cell)
    else:
        spec = LoadSpec(
            "http-json",
            "127.0.0.1",
            server.http_port,
            0,
            model,
            TINY_SIZES[0],
            "closed",
            args.duration,
            concurrency=args.concurrency,
            warmup_s=args.warmup,
            keepalive=keepalive,
        )
        out = clients[0].run(spec)
    shape = batch_shape(before, batch_histogram(server.http_port))
    latencies = out["latencies_s"]
    if not latencies:
        raise RuntimeError(f"{kind}: no request answered ({out.get('errors')})")
    answered = len(latencies)
    return {
        "throughput": answered / out["elapsed_s"],
        "p99_ms": percentile(latencies, 99) * 1e3,
        "errors": len(out.get("errors", [])),
        # the rows every batch of the cell held (the warm-up's too), from the server's counts
        "rows_per_batch": (shape["rows"] or answered) / max(shape["batches"], 1),
        "batches_on_loop": shape["batches_on_loop"],
        "batches": shape["batches"],
        "rows": shape["rows"],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cells", default="loadgen:new,threads:new", help=f"of {', '.join(KINDS)}")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--ramps", type=int, default=3, help="ramps per server (0: none)")
    p.add_argument("--ramp-s", type=float, default=3.0, help="the one client's seconds")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=3000, help="threads: requests per cell")
    p.add_argument("--warmup-requests", type=int, default=200)
    p.add_argument("--duration", type=float, default=3.0, help="loadgen: seconds per cell")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument(
        "--pin-cores", action="store_true", help="clients on one core, servers on the rest"
    )
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results)")
    args = p.parse_args(argv)
    args.kinds = [k for k in args.cells.split(",") if k]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown or not args.kinds:
        p.error(f"--cells: {', '.join(unknown) or 'none given'}; choose from {', '.join(KINDS)}")
    if min(args.rounds, args.concurrency, args.requests) < 1 or args.ramps < 0:
        p.error("--rounds, --concurrency and --requests must be >= 1, --ramps >= 0")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cores = split_cores() if args.pin_cores else None
    results: dict[str, Any] = {"cells": [], "ramps": []}
    with tempfile.TemporaryDirectory(prefix="inferway-accept-") as tmp:
        targets = {"accept-all": fast_backend_server_main, "accept-one": accept_one_server_main}
        clients, servers = start_servers(Path(tmp), targets)
        try:
            if cores is not None:
                os.sched_setaffinity(0, cores[0])
                for worker in clients:
                    pin_tree(worker.pid, cores[0])
                for server in servers.values():
                    pin_tree(server.process.pid, cores[1])
            per: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for round_ in range(args.rounds):
                order = SERVERS if round_ % 2 == 0 else SERVERS[::-1]
                for kind in args.kinds:
                    for name in order:
                        got = measure_cell(kind, servers[name], clients, args)
                        per.setdefault((kind, name), []).append(got)
                        print(
                            f"round {round_ + 1}/{args.rounds} {kind:18} {name:10} "
                            f"{got['throughput']:7.0f} req/s p99 {got['p99_ms']:6.1f} ms "
                            f"{got['rows_per_batch']:5.1f} rows a batch",
                            file=sys.stderr,
                            flush=True,
                        )
            for kind in args.kinds:
                for name in SERVERS:
                    runs = per[(kind, name)]
                    results["cells"].append(
                        {
                            "cell": kind,
                            "server": name,
                            "throughput": round(statistics.median(r["throughput"] for r in runs)),
                            "p99_ms": round(statistics.median(r["p99_ms"] for r in runs), 1),
                            "rows_per_batch": round(
                                statistics.median(r["rows_per_batch"] for r in runs), 1
                            ),
                            "errors": sum(r["errors"] for r in runs),
                            "rounds": runs,
                        }
                    )
            for ramp in range(args.ramps):
                for name in SERVERS if ramp % 2 == 0 else SERVERS[::-1]:
                    server = servers[name]
                    lone = argparse.Namespace(**{**vars(args), "concurrency": 1})
                    lone.duration, lone.warmup = args.ramp_s, 0.0
                    measure_cell("loadgen:new", server, clients, lone)
                    with QueueWatch(server.http_port) as watch:
                        got = measure_cell("threads:new", server, clients, args)
                    got.update(server=name, ramp=ramp + 1, accept_queue_mean=watch.mean())
                    results["ramps"].append(got)
                    print(
                        f"ramp {ramp + 1}/{args.ramps} {name:10} then c={args.concurrency}: "
                        f"{got['throughput']:7.0f} req/s {got['rows_per_batch']:5.1f} rows a "
                        f"batch, {got['batches_on_loop']:.0f} of {got['batches']:.0f} on the "
                        f"loop, accept queue {got['accept_queue_mean']}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            for server in servers.values():
                server.stop()
            for worker in clients:
                worker.close()
    results.update(environment=environment(), args={k: str(v) for k, v in vars(args).items()})
    path = write_results("accept_ab", results, args.out)
    if args.output == "json":
        print(json.dumps(results, indent=2, default=str))
        return results
    where = "server on a core of its own" if args.pin_cores else "shared cores"
    rows = []
    for kind in args.kinds:
        both = {c["server"]: c for c in results["cells"] if c["cell"] == kind}
        one, every = both["accept-one"], both["accept-all"]
        rows.append(
            [
                kind,
                every["throughput"],
                one["throughput"],
                f"{every['throughput'] / one['throughput']:.2f}",
                f"{every['p99_ms']} / {one['p99_ms']}",
                f"{every['rows_per_batch']} / {one['rows_per_batch']}",
            ]
        )
    print_table(
        f"accept every waiting connection a pass vs uvloop's one, c={args.concurrency}, "
        f"{where}; medians of {args.rounds} rotated rounds",
        ["cell", "all req/s", "one req/s", "all / one", "p99 ms all / one", "rows a batch"],
        rows,
    )
    if results["ramps"]:
        print_table(
            f"after {args.ramp_s:g} s of one client: the {args.concurrency} urllib threads",
            ["ramp", "server", "req/s", "rows a batch", "on the loop", "accept queue"],
            [
                [
                    r["ramp"],
                    r["server"],
                    round(r["throughput"]),
                    round(r["rows_per_batch"], 1),
                    f"{r['batches_on_loop']:.0f} of {r['batches']:.0f}",
                    r["accept_queue_mean"],
                ]
                for r in results["ramps"]
            ],
        )
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
