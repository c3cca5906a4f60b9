"""inferway beside Mosec and Triton (PyTriton) on the same model and the same clients.

Every server runs the tiny MLP (256 -> 1024 -> 1024 -> 10, ONNX Runtime on the CPU) and gets
the same KServe v2 JSON request bytes from the same closed-loop clients, with a new connection
per request and with keep-alive, at c = 1, 16, 64. Two kinds of client (``--clients``), each in
a process of its own:

- ``loadgen``: the benchmark's own (``loadgen.py``), one asyncio process with a hand-rolled
  HTTP client that takes as little CPU from the machine as it can; a point is ``--duration``
  seconds after ``--warmup`` seconds;
- ``threads``: a thread per connection, as most users' Python code calls a server
  (``thread_clients.py``): ``http.client`` kept alive, or ``urllib`` with a new connection per
  request; a point is ``--requests`` requests after ``--warmup-requests`` (issue 37's harness).

ONNX Runtime's threads are stated and the same in every server (``--ort-threads``: intra-op
threads, inter-op 1); ``--server-defaults`` adds each server again as ``NAME@defaults`` with its
own defaults (inferway: the cores split between instances; Mosec and PyTriton's harnesses and
the aiohttp yardstick: ONNX Runtime's). ``--pin-cores`` puts the client processes on the first
core and every server on the others, as if the client ran on a host of its own: the thread
clients' threads then cannot move onto the server's core, and the cells measure the server
rather than how it paces the client (docs/serving-performance.md). Servers:

- ``aiohttp``: the yardstick, ONNX Runtime inline in a bare aiohttp handler, no batching;
- ``inferway``: ``start_backend`` with adaptive batching (one process), aiohttp front end;
- ``inferway-fast``: the same with the fast HTTP front end (``--http-frontend fast``);
- ``inferway-fast-nofill``: ``inferway-fast`` with ``batching.fill_when_busy: false`` (an A/B
  of that rule in the same run);
- ``inferway-fast-worker``: ``inferway-fast`` with ``batching.compute_thread: worker``: every
  batch on the worker thread, also where the server may use one CPU only (``--pin-cores``),
  where ``auto`` computes on the loop's thread (an A/B in the same run);
- ``inferway-fast-loop``: ``inferway-fast`` with ``batching.compute_thread: loop``: every batch
  on the event loop's thread, a serial server however many cores (an A/B);
- ``inferway-w2`` / ``inferway-fast-w2``: ``inferway serve --workers 2`` with either;
- ``mosec``: Mosec with dynamic batching (max batch 64, wait 5 ms), one worker, in its venv;
- ``pytriton``: Triton's server and dynamic batcher through PyTriton (same limits), its venv;
- ``floor``: ``static_http_server.py``, the same fixed answer to every request, no model: what
  each client kind does against a server that costs (almost) nothing (its answers are not
  checked);
- ``floor-close``: the same, closing a connection whose request asked for ``Connection: close``
  after the answer, as RFC 9112 requires (the client closes first against ``floor``);
- ``floor-busy``: ``floor-close`` spending 200 µs of CPU on its loop before each answer, one
  request at a time: a serial server, the bottleneck at 5,000 requests a second less its I/O;
- ``floor-spin``: ``floor-close`` polling its loop without sleeping for 1 ms after each
  request: it answers at once and keeps a core busy while load lasts;
- ``floor-sleep``: ``floor-busy`` sleeping its 200 µs instead of spending them: paced alike,
  its core left free;
- ``floor-native``: ``floor-close``'s fixed answer from a native HTTP server, granian (Rust,
  one runtime thread; ``peer_servers/granian_static.py``, its own venv): whether a server with
  a native core lifts a client that ``floor-close`` does not.
  These three show that a co-located thread client's speed depends on the server's shape as
  well as its cost (docs/serving-performance.md), so ``floor`` is no ceiling for it.

Mosec and PyTriton are installed into their own venvs (``--venvs``, default
``~/.cache/inferway-bench/peers``) on first use, so their dependencies never meet inferway's.
All servers start once and stay up; each round measures them in a rotated order and every
ratio is to the aiohttp server *of the same round*, so the machine's drift cancels; the table
shows medians over rounds. It is a benchmark, not a test: ``python bench/peers.py``
(``--quick`` for a smoke run). Writes ``bench/results/peers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from _common import environment, free_port, percentile, print_table, write_results
from batching_models import (
    LOOP,
    NOFILL,
    TINY_SIZES,
    WORKER,
    build_bench_repository,
    served_name,
)
from core_pinning import pin_tree, split_cores
from loadgen import LoadSpec, LoadWorker
from loadgen_http import http_request_bytes
from loadgen_spec import request_row
from peer_procs import (
    GRANIAN_PACKAGES,
    PeerProcess,
    ensure_venv,
    granian_command,
    pytriton_command,
    versions,
    wait_http,
)
from peers_report import report_rows, summarize
from servers import (
    ServerProcess,
    WorkersServer,
    backend_server_main,
    fast_backend_server_main,
    plain_server_threads_main,
)
from thread_clients import ThreadCell, ThreadClientWorker

HERE = Path(__file__).resolve().parent
DEFAULT_VENVS = Path.home() / ".cache" / "inferway-bench" / "peers"
PEER_PACKAGES = {
    "mosec": ["mosec", "onnxruntime", "numpy"],
    "pytriton": ["nvidia-pytriton", "onnxruntime", "numpy"],
}
SERVERS = (
    "aiohttp",
    "inferway",
    "inferway-fast",
    "inferway-fast-nofill",
    "inferway-fast-worker",
    "inferway-fast-loop",
    "inferway-w2",
    "inferway-fast-w2",
    "mosec",
    "pytriton",
    "floor",
    "floor-close",
    "floor-busy",
    "floor-spin",
    "floor-sleep",
    "floor-native",
)
MAX_BATCH, MAX_WAIT_MS = 64, 5
FLOOR_OPTIONS = {
    "floor": [],
    "floor-close": ["--close"],
    "floor-busy": ["--close", "--busy-us", "200"],
    "floor-spin": ["--close", "--spin-us", "1000"],
    "floor-sleep": ["--close", "--sleep-us", "200"],
}
"""``static_http_server.py``'s options for each floor server."""
FAST_VARIANTS = {
    "inferway-fast-nofill": NOFILL,
    "inferway-fast-worker": WORKER,
    "inferway-fast-loop": LOOP,
}
"""``inferway-fast`` serving the adaptive model with one setting changed (an A/B): its mode."""
CLIENTS = ("loadgen", "threads")
DEFAULTS = "@defaults"
"""A server name's suffix: that server with its own ONNX Runtime thread defaults."""


@dataclass
class Peer:
    """One server under test: where its KServe v2 JSON endpoint is and how to stop it."""

    name: str
    port: int
    path: str
    stop: Callable[[], None]
    versions: dict[str, str] = field(default_factory=dict)
    grpc_port: int = 0
    model: str = "mlp"
    pid: int = 0
    """The server's process (its children are the server's too), for CPU accounting."""


def state_threads(root: Path, intra: int) -> None:
    """Every model of the repository at ``root`` runs ONNX Runtime with ``intra`` intra-op
    threads (inferway's inter-op threads are always 1)."""
    for config in root.glob("*/config.yaml"):
        settings = yaml.safe_load(config.read_text())
        settings["intra_op_threads"] = intra
        config.write_text(yaml.safe_dump(settings, sort_keys=False))


def start_peer(
    label: str, roots: dict[bool, Path], onnx: Path, venvs: Path, logs: Path, intra: int
) -> Peer:
    """Start server ``label`` (a name of SERVERS, ``@defaults`` for its own ORT threads);
    ``roots[True]``: the repository with its threads stated, ``roots[False]``: without."""
    name, own = label.removesuffix(DEFAULTS), label.endswith(DEFAULTS)
    peer = _start(name, roots[not own], onnx, venvs, logs, 0 if own else intra)
    peer.name = label
    return peer


def _start(name: str, root: Path, onnx: Path, venvs: Path, logs: Path, intra: int) -> Peer:
    model = served_name("tiny", "adaptive")
    if name == "aiohttp":
        plain = ServerProcess(plain_server_threads_main, (str(onnx), "mlp", intra), metrics=False)
        peer = Peer(name, plain.http_port, "/v2/models/mlp/infer", plain.stop)
        peer.pid = plain.process.pid
        return peer
    if name == "inferway":
        server = ServerProcess(backend_server_main, (str(root),), metrics=True)
        peer = Peer(name, server.http_port, f"/v2/models/{model}/infer", server.stop)
        peer.pid = server.process.pid
        return peer
    if name == "inferway-fast" or name in FAST_VARIANTS:
        if name in FAST_VARIANTS:
            model = served_name("tiny", FAST_VARIANTS[name])
        server = ServerProcess(fast_backend_server_main, (str(root),), metrics=True)
        peer = Peer(name, server.http_port, f"/v2/models/{model}/infer", server.stop)
        peer.pid = server.process.pid
        return peer
    if name in ("inferway-w2", "inferway-fast-w2"):
        frontend = "fast" if "fast" in name else "aiohttp"
        workers = WorkersServer(root, 2, frontend=frontend)
        peer = Peer(name, workers.http_port, f"/v2/models/{model}/infer", workers.stop)
        peer.pid = workers.process.pid
        return peer
    if name in FLOOR_OPTIONS:
        port = free_port()
        command = [sys.executable, str(HERE / "static_http_server.py"), str(port)]
        command += FLOOR_OPTIONS[name]
        process = PeerProcess(command, None, logs / f"{name}.log")
        wait_http(f"http://127.0.0.1:{port}/", process.proc, 30, name)
        return Peer(name, port, "/v2/models/mlp/infer", process.stop, pid=process.proc.pid)
    if name == "floor-native":
        python = ensure_venv(venvs / "granian", GRANIAN_PACKAGES)
        port = free_port()
        process = PeerProcess(granian_command(python, port), None, logs / f"{name}.log")
        wait_http(f"http://127.0.0.1:{port}/", process.proc, 60, name)
        found = versions(python, ["granian"])
        return Peer(name, port, "/v2/models/mlp/infer", process.stop, found, pid=process.proc.pid)
    python = ensure_venv(venvs / name, PEER_PACKAGES[name])
    env = dict(os.environ, PEER_MODEL=str(onnx), PEER_MAX_BATCH=str(MAX_BATCH))
    env["PEER_MAX_WAIT_MS"] = str(MAX_WAIT_MS)
    env["PEER_ORT_INTRA"], env["PEER_ORT_INTER"] = str(intra), str(1 if intra else 0)
    port = free_port()
    if name == "mosec":
        script = str(HERE / "peer_servers" / "mosec_mlp.py")
        command = [str(python), script, "--port", str(port), "--address", "127.0.0.1"]
        process = PeerProcess(command, env, logs / f"mosec-{intra}.log")
        wait_http(f"http://127.0.0.1:{port}/", process.proc, 120, "mosec")
        found = versions(python, ["mosec", "onnxruntime"])
        return Peer(name, port, "/inference", process.stop, found, pid=process.proc.pid)
    if name == "pytriton":
        grpc_port = free_port()
        command, env = pytriton_command(python, env, port, grpc_port)
        process = PeerProcess(command, env, logs / f"pytriton-{intra}.log")
        wait_http(f"http://127.0.0.1:{port}/v2/models/mlp/ready", process.proc, 240, "pytriton")
        found = versions(python, ["nvidia-pytriton", "onnxruntime"])
        return Peer(
            name, port, "/v2/models/mlp/infer", process.stop, found, grpc_port, pid=process.proc.pid
        )
    raise ValueError(f"unknown server {name!r}; choose from {', '.join(SERVERS)}")


def check_answer(peer: Peer, onnx: Path) -> None:
    """The server answers the benchmark's row with ONNX Runtime's own output (or it is not
    measured): a fast wrong answer would win."""
    import onnxruntime as ort

    row = np.random.default_rng(0).random((1, TINY_SIZES[0]), dtype=np.float32)
    expected = ort.InferenceSession(str(onnx)).run(None, {"x": row})[0]
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, TINY_SIZES[0]]}
    tensor["data"] = row.ravel().tolist()
    request = urllib.request.Request(
        f"http://127.0.0.1:{peer.port}{peer.path}",
        data=json.dumps({"inputs": [tensor]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        output = json.loads(answer.read())["outputs"][0]
    got = np.asarray(output["data"], dtype=np.float32).reshape(expected.shape)
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
        raise RuntimeError(f"{peer.name} answered {got.ravel()[:4]}, expected {expected[:4]}")


@dataclass
class Clients:
    """The client processes: the benchmark's own and the thread-per-connection one."""

    loadgen: LoadWorker
    threads: ThreadClientWorker

    def close(self) -> None:
        self.loadgen.close()
        self.threads.close()

    def pin(self, cpus: set[int]) -> None:
        """Both client processes on ``cpus`` (``--pin-cores``)."""
        pin_tree(self.loadgen.pid, cpus)
        pin_tree(self.threads.pid, cpus)


def measure(
    clients: Clients, client: str, peer: Peer, concurrency: int, keepalive: bool, args: Any
) -> dict[str, Any]:
    """One point: ``concurrency`` closed-loop clients of kind ``client`` against ``peer``."""
    if client == "threads":
        spec0 = LoadSpec("http-json", "127.0.0.1", peer.port, 0, "mlp", TINY_SIZES[0], "closed", 0)
        raw = http_request_bytes(spec0, request_row(TINY_SIZES[0], 0))
        cell = ThreadCell(
            "127.0.0.1",
            peer.port,
            peer.path,
            raw[raw.index(b"\r\n\r\n") + 4 :],  # the same JSON body as loadgen's
            concurrency,
            keepalive,
            args.warmup_requests,
            args.requests,
        )
        result: dict[str, Any] = clients.threads.run(cell)
    else:
        result = clients.loadgen.run(_load_spec(peer, concurrency, keepalive, args))
    ms = [s * 1000 for s in result["latencies_s"]]
    point = {
        "throughput": len(ms) / result["elapsed_s"],
        "p50_ms": percentile(ms, 50) if ms else None,
        "p99_ms": percentile(ms, 99) if ms else None,
        "errors": len(result["errors"]),
    }
    if result.get("sched") and ms:  # the thread clients' scheduler counts, a request
        point["client_sched_per_request"] = {k: v / len(ms) for k, v in result["sched"].items()}
    return point


def _load_spec(peer: Peer, concurrency: int, keepalive: bool, args: Any) -> LoadSpec:
    return LoadSpec(
        protocol="http-json",
        host="127.0.0.1",
        http_port=peer.port,
        grpc_port=0,
        model="mlp",
        width=TINY_SIZES[0],
        kind="closed",
        duration_s=args.duration,
        concurrency=concurrency,
        warmup_s=args.warmup,
        path=peer.path,
        keepalive=keepalive,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help=f"comma-separated, of {', '.join(SERVERS)}; aiohttp, the yardstick, always runs",
    )
    parser.add_argument("--concurrency", default="1,16,64", help="closed-loop clients, a list")
    parser.add_argument(
        "--connections", default="new,keepalive", help="new (one per request), keepalive or both"
    )
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help="loadgen (the benchmark's own), threads (a thread per connection: http.client "
        "keep-alive, urllib new connections) or both",
    )
    parser.add_argument(
        "--ort-threads",
        type=int,
        default=1,
        help="ONNX Runtime intra-op threads in every server (inter-op: 1); default %(default)s",
    )
    parser.add_argument(
        "--server-defaults",
        action="store_true",
        help="also run each server as NAME@defaults, with its own ONNX Runtime thread defaults",
    )
    parser.add_argument(
        "--pin-cores",
        action="store_true",
        help="the clients on the first core, every server on the others",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each in a rotated order")
    parser.add_argument("--duration", type=float, default=8.0, help="loadgen: seconds per point")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="loadgen: seconds before each point"
    )
    parser.add_argument("--requests", type=int, default=2000, help="threads: requests per point")
    parser.add_argument(
        "--warmup-requests", type=int, default=200, help="threads: requests before each point"
    )
    parser.add_argument(
        "--venvs",
        type=Path,
        default=DEFAULT_VENVS,
        help="where Mosec's and PyTriton's own venvs are made on first use (default %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=None, help="the JSON (default bench/results)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 round; loadgen 2 s points; threads 500 requests after 100",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 2.0, 0.5
        args.requests, args.warmup_requests = 500, 100
    if args.ort_threads < 1:
        parser.error("--ort-threads: at least 1 (--server-defaults runs each server's own)")
    unknown = set(args.clients.split(",")) - set(CLIENTS)
    if unknown:
        parser.error(f"--clients: unknown {', '.join(sorted(unknown))}; choose from {CLIENTS}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    if "aiohttp" not in servers:
        servers.insert(0, "aiohttp")  # every ratio needs it
    if args.server_defaults:
        servers += [
            s + DEFAULTS for s in servers if not s.endswith(DEFAULTS) and not s.startswith("floor")
        ]
    levels = [int(c) for c in args.concurrency.split(",")]
    connections = [c for c in args.connections.split(",") if c]
    kinds = [(client, mode) for client in args.clients.split(",") if client for mode in connections]
    points: list[dict[str, Any]] = []
    peers: list[Peer] = []
    with tempfile.TemporaryDirectory(prefix="inferway-peers-") as scratch:
        roots = {True: Path(scratch) / "models", False: Path(scratch) / "models-defaults"}
        logs = Path(scratch)
        onnx = build_bench_repository(roots[True], {"tiny": TINY_SIZES})["tiny"]
        state_threads(roots[True], args.ort_threads)
        build_bench_repository(roots[False], {"tiny": TINY_SIZES})
        clients = Clients(LoadWorker(), ThreadClientWorker())
        cores = split_cores() if args.pin_cores else None
        try:
            if cores is not None:
                clients.pin(cores[0])
            for name in servers:
                print(f"starting {name}...", flush=True)
                peer = start_peer(name, roots, onnx, args.venvs, logs, args.ort_threads)
                peers.append(peer)
                if cores is not None:
                    pin_tree(peer.pid, cores[1])
                if not name.startswith("floor"):  # a fixed answer, by design
                    check_answer(peer, onnx)
            for round_ in range(args.rounds):
                order = peers[round_ % len(peers) :] + peers[: round_ % len(peers)]
                for peer in order:
                    for client, mode in kinds:
                        for c in levels:
                            point = measure(clients, client, peer, c, mode == "keepalive", args)
                            point |= {"server": peer.name, "round": round_, "client": client}
                            point |= {"connections": mode, "concurrency": c}
                            points.append(point)
                            print(
                                f"round {round_ + 1}/{args.rounds} {peer.name:16} {client:7} "
                                f"{mode:9} c={c:<3} {point['throughput']:8.0f} req/s "
                                f"p99 {point['p99_ms'] or 0:7.2f} ms",
                                flush=True,
                            )
        finally:
            clients.close()
            for peer in reversed(peers):
                peer.stop()
    summary = summarize(points, servers)
    print_table(
        f"tiny MLP, KServe v2 JSON, closed loop, ONNX Runtime intra-op threads "
        f"{args.ort_threads} (@defaults: the server's own), medians of {args.rounds} rotated "
        f"rounds{'; clients and servers on cores of their own' if args.pin_cores else ''}; "
        f"load average {os.getloadavg()[0]:.1f}",
        (
            "server",
            "client",
            "connections",
            "c",
            "req/s",
            "x aiohttp",
            "x mosec",
            "p50 ms",
            "p99 ms",
            "mosec p99",
            "errors",
        ),
        report_rows(summary),
    )
    data = {
        "environment": environment(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "load_average_at_end": os.getloadavg(),
        "versions": {p.name: p.versions for p in peers},
        "summary": summary,
        "points": points,
    }
    print(f"wrote {write_results('peers', data, args.out)}")
    return data


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
