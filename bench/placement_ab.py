"""Where a batch computes on one CPU (``placement.py``), as shipped against the rule before it,
side by side, with the server on one core: a lone client's batches, and 16 or 64 clients'
(issue 37; docs/serving-performance.md, "A lone client on one core").

While the process may use one CPU, ``compute_thread: auto`` computes on the event loop's
thread a CPU model's batch expected to take under 0.2 ms or 5-50 ms, and (the quiet rule) one
of 0.2-5 ms expected to end before the model's next request is expected (``shipped``). Before
the quiet rule, a 0.2-5 ms batch always went to the worker thread (``band``: the same server
with that rule patched back in). Both serve the tiny model under the fast front end (ONNX
Runtime at one intra-op thread), each on a core of its own, the clients on another (so the
machine needs three cores for both servers to have one each; with two, both servers share the
second core, and are measured one at a time as always).

Each cell is ``client:connections@concurrency`` (``threads`` or ``loadgen``; ``new`` or
``keepalive``), every round both servers in a rotated order; medians of the rounds. Besides
the rate and the p99 it reports the server's CPU a request (its process's user and system
time over the cell) and the share of its batches computed on the loop.

    .venv/bin/python bench/placement_ab.py                  # ~3 min
    .venv/bin/python bench/placement_ab.py --rounds 6 -o json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil
from _common import environment, print_table, write_results
from accept_ab import measure_cell, start_servers
from core_pinning import pin_tree
from servers import fast_backend_server_main

SERVERS = ("shipped", "band")
CLIENTS = ("loadgen", "threads")
CONNECTIONS = ("new", "keepalive")
DEFAULT_CELLS = (
    "threads:new@1,loadgen:keepalive@1,threads:keepalive@16,threads:new@64,loadgen:new@64"
)
BAND_FROM_S = 0.005
"""The rule before: on one CPU, a batch from INLINE_BELOW_S up to this went to the worker."""


def band_server_main(root: str, conn: Connection) -> None:
    """``fast_backend_server_main`` with the one-CPU placement as it was before the quiet rule:
    a batch expected to take 0.2-5 ms on the worker thread, whatever the CPUs."""
    from inferway.backends.batching import placement

    shipped = placement.BatchPlacement.on_loop

    def band(self: Any, rows: int, now: float) -> bool:
        predicted = self._cost.predict(rows)
        if self._where != "auto" or predicted is None:
            return shipped(self, rows, now)
        if placement.INLINE_BELOW_S <= predicted < BAND_FROM_S:
            return False
        return shipped(self, rows, now)

    placement.BatchPlacement.on_loop = band  # type: ignore[method-assign]
    fast_backend_server_main(root, conn)


def parse_cell(text: str) -> tuple[str, int]:
    """``client:connections@concurrency`` -> (``client:connections``, concurrency)."""
    kind, _, level = text.partition("@")
    client, _, connections = kind.partition(":")
    if client not in CLIENTS or connections not in CONNECTIONS or not level.isdigit():
        raise ValueError(text)
    if int(level) < 1:
        raise ValueError(text)
    return kind, int(level)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--cells",
        default=DEFAULT_CELLS,
        help="client:connections@concurrency, comma-separated (client: loadgen or threads; "
        "connections: new or keepalive)",
    )
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=2000, help="threads: requests per cell")
    p.add_argument("--warmup-requests", type=int, default=200)
    p.add_argument("--duration", type=float, default=3.0, help="loadgen: seconds per cell")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results)")
    args = p.parse_args(argv)
    args.cell_list = []
    for text in (c for c in args.cells.split(",") if c):
        try:
            args.cell_list.append(parse_cell(text))
        except ValueError:
            p.error(f"--cells: {text!r} is not client:connections@concurrency ({DEFAULT_CELLS})")
    if not args.cell_list:
        p.error("--cells: none given")
    if min(args.rounds, args.requests) < 1:
        p.error("--rounds and --requests must be >= 1")
    return args


def pick_cores() -> tuple[set[int], dict[str, set[int]]]:
    """The clients' core, and a core for each server (shared when only two are usable)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit(f"placement_ab.py needs two cores or more; this process may use {cpus}")
    rest = cpus[1:]
    return {cpus[0]}, {name: {rest[i % len(rest)]} for i, name in enumerate(SERVERS)}


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    client_core, server_cores = pick_cores()
    results: dict[str, Any] = {"cells": []}
    with tempfile.TemporaryDirectory(prefix="inferway-placement-") as tmp:
        targets = {"shipped": fast_backend_server_main, "band": band_server_main}
        clients, servers = start_servers(Path(tmp), targets)
        try:
            os.sched_setaffinity(0, client_core)
            for worker in clients:
                pin_tree(worker.pid, client_core)
            for name, server in servers.items():
                pin_tree(server.process.pid, server_cores[name])
            per: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for round_ in range(args.rounds):
                order = SERVERS if round_ % 2 == 0 else SERVERS[::-1]
                for kind, level in args.cell_list:
                    cell_args = argparse.Namespace(**{**vars(args), "concurrency": level})
                    for name in order:
                        pid = servers[name].process.pid
                        cpu0 = _cpu_s(pid)
                        got = measure_cell(kind, servers[name], clients, cell_args)
                        # the cell's whole run (warm-up included) over every row it batched
                        got["server_cpu_us"] = (_cpu_s(pid) - cpu0) / max(got["rows"], 1) * 1e6
                        got["on_loop_share"] = got["batches_on_loop"] / max(got["batches"], 1)
                        per.setdefault((f"{kind}@{level}", name), []).append(got)
                        print(
                            f"round {round_ + 1}/{args.rounds} {kind}@{level:<3} {name:9} "
                            f"{got['throughput']:7.0f} req/s p99 {got['p99_ms']:6.1f} ms "
                            f"{got['server_cpu_us']:5.0f} us CPU a request, "
                            f"{got['on_loop_share']:.0%} of batches on the loop",
                            file=sys.stderr,
                            flush=True,
                        )
            for kind, level in args.cell_list:
                for name in SERVERS:
                    runs = per[(f"{kind}@{level}", name)]
                    results["cells"].append(
                        {
                            "cell": f"{kind}@{level}",
                            "server": name,
                            **{
                                key: round(statistics.median(r[key] for r in runs), digits)
                                for key, digits in (
                                    ("throughput", 0),
                                    ("p99_ms", 1),
                                    ("server_cpu_us", 0),
                                    ("rows_per_batch", 1),
                                    ("on_loop_share", 2),
                                )
                            },
                            "errors": sum(r["errors"] for r in runs),
                            "rounds": runs,
                        }
                    )
        finally:
            for server in servers.values():
                server.stop()
            for worker in clients:
                worker.close()
    results.update(
        environment=environment(),
        args={k: str(v) for k, v in vars(args).items()},
        cores={"clients": sorted(client_core), **{k: sorted(v) for k, v in server_cores.items()}},
    )
    path = write_results("placement_ab", results, args.out)
    if args.output == "json":
        print(json.dumps(results, indent=2, default=str))
        return results
    rows = []
    for kind, level in args.cell_list:
        both = {c["server"]: c for c in results["cells"] if c["cell"] == f"{kind}@{level}"}
        new, old = both["shipped"], both["band"]
        rows.append(
            [
                f"{kind}@{level}",
                f"{new['throughput']:.0f} / {old['throughput']:.0f}",
                f"{new['throughput'] / old['throughput']:.2f}",
                f"{new['p99_ms']} / {old['p99_ms']}",
                f"{new['server_cpu_us']:.0f} / {old['server_cpu_us']:.0f}",
                f"{new['on_loop_share']:.0%} / {old['on_loop_share']:.0%}",
                f"{new['rows_per_batch']} / {old['rows_per_batch']}",
            ]
        )
    print_table(
        f"one CPU: 0.2-5 ms batches on the loop when quiet (shipped) / on the worker (band), "
        f"each server on one core; medians of {args.rounds} "
        f"rotated rounds; load average {os.getloadavg()[0]:.1f}",
        ["cell", "req/s", "ratio", "p99 ms", "server CPU us a req", "on the loop", "rows a batch"],
        rows,
    )
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
