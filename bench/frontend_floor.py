"""What an HTTP front end costs per request before any model is run, and inferway's whole path
beside it: the CPU per request of each server on a core of its own (issue 15 goal 4).

Every server is pinned to CPU 1 and the load generator (``loadgen.py``, closed loop,
keep-alive) to CPU 0; each server's CPU time is read from ``/proc`` over its process tree for
the timed window only, so "CPU per request" is what one answer costs on the server's core:

- ``httptools``: ``static_http_server.py`` (httptools + uvloop protocol callbacks, a fixed
  answer): the floor of any Python-on-asyncio design;
- ``aiohttp``: an aiohttp handler that reads the body and answers a fixed body;
- ``granian``: granian (a Rust HTTP server, RSGI) calling a Python coroutine per request that
  reads the body and views its tensor (``peer_servers/granian_static.py``, granian's own venv):
  what moving the HTTP parsing out of Python leaves per request;
- ``inferway``: ``inferway serve`` (the fast front end, adaptive batching) with a model that
  costs almost nothing (``width -> 16``): decode, validate, queue, batch, ONNX Runtime, split,
  encode, write;
- ``mosec``: Mosec (Rust HTTP, Python worker processes fed over IPC, dynamic batching: max 64,
  5 ms) on the same ``256 -> 16`` model, ``peer_servers/mosec_mlp.py`` in Mosec's venv; JSON
  only (that script decodes KServe v2 JSON): the architecture the issue points at, on one core.

Bodies: ``binary-16k`` (the heavy model's input, 4,096 floats, binary extension) and
``json-1k`` (the tiny model's input, 256 floats, JSON). Rounds rotate the server order; the
table shows medians and each server's CPU per request against httptools' of the same round.
It is a benchmark, not a test:

    .venv/bin/python bench/frontend_floor.py            # ~4 min (granian installs once)
    .venv/bin/python bench/frontend_floor.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from _common import environment, free_port, percentile, print_table, write_results
from loadgen import LoadSpec, LoadWorker
from loadgen_http import http_request_bytes
from loadgen_spec import request_row
from peer_procs import (
    GRANIAN_PACKAGES,
    PeerProcess,
    ensure_venv,
    granian_command,
    pytriton_command,
)
from peer_procs import versions as _versions
from peers import DEFAULT_VENVS, MAX_BATCH, MAX_WAIT_MS, PEER_PACKAGES

from inferway.devtools.demo_models import build_mlp

HERE = Path(__file__).resolve().parent
SERVERS = ("httptools", "aiohttp", "granian", "inferway", "mosec", "pytriton")
JSON_ONLY = {"mosec"}
PER_BODY = {"pytriton"}
"""Servers of one model (PyTriton's script binds one): one process per body's model."""
BODIES = {"binary-16k": ("http-binary", 4096), "json-1k": ("http-json", 256)}
LOADGEN_CPU, SERVER_CPU = 0, 1


def _tree(pid: int) -> list[int]:
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                for child in children.read().split():
                    pids += _tree(int(child))
    except OSError:  # exited meanwhile
        pass
    return pids


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant."""
    ticks = 0
    for one in _tree(pid):
        try:
            with open(f"/proc/{one}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class Server(PeerProcess):
    """One server under test in its own session, pinned to ``SERVER_CPU``."""

    def __init__(
        self,
        name: str,
        command: list[str],
        port: int,
        path: str,
        log: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(command, env, log, cpus={SERVER_CPU})
        self.name, self.port, self.path = name, port, path

    def wait_ready(self, request: bytes, timeout_s: float = 120.0) -> None:
        """Until the port takes connections and answers the benchmark's request with 200."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}")
            try:
                if _status(self.port, request) == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not answer 200 on :{self.port}")
            time.sleep(0.2)


def _status(port: int, request: bytes) -> int:
    """The status of one answer to ``request`` (the status line is all it reads)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _inferway_repository(root: Path) -> None:
    settings = {
        "batching": {
            "mode": "adaptive",
            "max_batch_size": 64,
            "max_queue_delay_s": 0.040,
            "latency_slo_s": 0.050,
            "max_queue_size": 2048,
        },
        "provider": "cpu",
    }
    for _, width in BODIES.values():
        version = root / f"floor-{width}" / "1"
        version.mkdir(parents=True)
        build_mlp(version / "model.onnx", (width, 16))
        (version.parent / "config.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))


def start(
    name: str, body: str, root: Path, venvs: Path, logs: Path
) -> tuple[Server, dict[str, str]]:
    """``name`` on a free port (``body``: which model a one-model server serves)."""
    port = free_port()
    path = "/v2/models/floor-{width}/infer"
    log = logs / f"{name}-{body}.log"
    if name == "httptools":
        command = [sys.executable, str(HERE / "static_http_server.py"), str(port)]
        return Server(name, command, port, path, log), {}
    if name == "aiohttp":
        command = [sys.executable, str(HERE / "peer_servers" / "aiohttp_static.py"), str(port)]
        return Server(name, command, port, path, log), {}
    if name == "granian":
        python = ensure_venv(venvs / "granian", GRANIAN_PACKAGES)
        command = granian_command(python, port)
        return Server(name, command, port, path, log), _versions(python, ["granian"])
    if name == "inferway":
        inferway = Path(sys.executable).with_name("inferway")
        command = [str(inferway), "serve", str(root), "--http-port", str(port)]
        command += ["--grpc-port", str(free_port()), "--log-level", "warning"]
        return Server(name, command, port, path, log), {}
    if name == "mosec":
        python = ensure_venv(venvs / name, PEER_PACKAGES[name])
        env = dict(os.environ, PEER_MODEL=str(root / "floor-256" / "1" / "model.onnx"))
        env |= {"PEER_MAX_BATCH": str(MAX_BATCH), "PEER_MAX_WAIT_MS": str(MAX_WAIT_MS)}
        env |= {"PEER_ORT_INTRA": "1", "PEER_ORT_INTER": "1"}  # as its harness always had
        script = str(HERE / "peer_servers" / "mosec_mlp.py")
        command = [str(python), script, "--port", str(port), "--address", "127.0.0.1"]
        server = Server(name, command, port, "/inference", log, env)
        return server, _versions(python, ["mosec", "onnxruntime"])
    if name == "pytriton":
        python = ensure_venv(venvs / name, PEER_PACKAGES[name])
        onnx = root / f"floor-{BODIES[body][1]}" / "1" / "model.onnx"
        env = dict(os.environ, PEER_MODEL=str(onnx), PEER_MAX_BATCH=str(MAX_BATCH))
        env["PEER_MAX_WAIT_MS"] = str(MAX_WAIT_MS)
        env |= {"PEER_ORT_INTRA": "1", "PEER_ORT_INTER": "1"}  # as its harness always had
        command, env = pytriton_command(python, env, port, free_port())
        server = Server(name, command, port, "/v2/models/mlp/infer", log, env)
        return server, _versions(python, ["nvidia-pytriton", "onnxruntime"])
    raise ValueError(f"unknown server {name!r}; choose from {', '.join(SERVERS)}")


def _spec(server: Server, body: str, duration_s: float, concurrency: int) -> LoadSpec:
    protocol, width = BODIES[body]
    return LoadSpec(
        protocol=protocol,
        host="127.0.0.1",
        http_port=server.port,
        grpc_port=0,
        model=f"floor-{width}",
        width=width,
        kind="closed",
        duration_s=duration_s,
        concurrency=concurrency,
        path=server.path.format(width=width),
    )


def _request(server: Server, body: str) -> bytes:
    spec = _spec(server, body, 0.0, 1)
    return http_request_bytes(spec, request_row(spec.width, spec.seed))


def _bodies(server: str, bodies: Sequence[str]) -> list[str]:
    return [b for b in bodies if server not in JSON_ONLY or BODIES[b][0] == "http-json"]


def measure(
    worker: LoadWorker, server: Server, body: str, args: argparse.Namespace
) -> dict[str, Any]:
    spec = _spec(server, body, args.warmup, args.concurrency)
    worker.run(spec)  # warm-up, outside the window
    timed = dataclasses.replace(spec, duration_s=args.duration)
    cpu0 = tree_cpu_seconds(server.proc.pid)
    result = worker.run(timed)
    cpu = tree_cpu_seconds(server.proc.pid) - cpu0
    ms = [s * 1000 for s in result["latencies_s"]]
    answered = len(ms)
    return {
        "server": server.name,
        "body": body,
        "requests_s": answered / result["elapsed_s"],
        "server_cpu_us": 1e6 * cpu / answered if answered else None,
        "server_busy": cpu / result["elapsed_s"],
        "p50_ms": percentile(ms, 50) if ms else None,
        "p99_ms": percentile(ms, 99) if ms else None,
        "errors": len(result["errors"]),
        "client_cpu_s": result["client_cpu_s"],
    }


def summarize(points: list[dict[str, Any]], servers: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for body in BODIES:
        for name in servers:
            mine = [p for p in points if p["server"] == name and p["body"] == body]
            if not mine:
                continue
            ratios = []
            for p in mine:
                floor = [
                    q
                    for q in points
                    if (q["round"], q["server"], q["body"]) == (p["round"], "httptools", body)
                ]
                if floor and floor[0]["server_cpu_us"] and p["server_cpu_us"]:
                    ratios.append(p["server_cpu_us"] / floor[0]["server_cpu_us"])
            cpu = [p["server_cpu_us"] for p in mine if p["server_cpu_us"] is not None]
            out.append(
                {
                    "server": name,
                    "body": body,
                    "requests_s": statistics.median(p["requests_s"] for p in mine),
                    "server_cpu_us": statistics.median(cpu) if cpu else None,
                    "cpu_to_httptools": statistics.median(ratios) if ratios else None,
                    "server_busy": statistics.median(p["server_busy"] for p in mine),
                    "p99_ms": statistics.median(p["p99_ms"] or 0.0 for p in mine),
                    "errors": sum(p["errors"] for p in mine),
                }
            )
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--bodies", default=",".join(BODIES))
    parser.add_argument("--concurrency", type=int, default=64, help="closed-loop clients")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--venvs", type=Path, default=DEFAULT_VENVS)
    parser.add_argument("--quick", action="store_true", help="1 round of 1.5 s points")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 1.5, 0.5
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    if "httptools" not in servers:
        servers.insert(0, "httptools")  # every ratio needs it
    bodies = [b for b in args.bodies.split(",") if b]
    for name in (*servers, *bodies):
        if name not in (*SERVERS, *BODIES):
            raise SystemExit(f"unknown server or body {name!r}")
    if {LOADGEN_CPU, SERVER_CPU} - os.sched_getaffinity(0):
        raise SystemExit(f"needs CPUs {LOADGEN_CPU} and {SERVER_CPU} (Linux)")
    points: list[dict[str, Any]] = []
    versions: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="inferway-floor-") as tmp:
        root, logs = Path(tmp) / "repo", Path(tmp)
        _inferway_repository(root)
        running: dict[tuple[str, str], Server] = {}
        worker = LoadWorker()
        os.sched_setaffinity(worker.pid, {LOADGEN_CPU})
        try:
            for name in servers:
                shared: Server | None = None
                for body in _bodies(name, bodies):
                    if shared is None or name in PER_BODY:
                        shared, versions[name] = start(name, body, root, args.venvs, logs)
                    running[name, body] = shared
            for name in servers:
                for body in _bodies(name, bodies):
                    running[name, body].wait_ready(_request(running[name, body], body), 240)
            for round_no in range(args.rounds):
                order = servers[round_no % len(servers) :] + servers[: round_no % len(servers)]
                for name in order:
                    for body in _bodies(name, bodies):
                        point = measure(worker, running[name, body], body, args) | {
                            "round": round_no
                        }
                        points.append(point)
                        print(
                            f"round {round_no + 1} {name:9} {body:10}: "
                            f"{point['requests_s']:8.0f} req/s, "
                            f"{point['server_cpu_us']:6.1f} us of server CPU a request, "
                            f"server busy {100 * point['server_busy']:.0f}%, "
                            f"p99 {point['p99_ms']:.2f} ms, errors {point['errors']}",
                            flush=True,
                        )
        finally:
            worker.close()
            for server in {id(s): s for s in running.values()}.values():
                server.stop()
    summary = summarize(points, servers)
    print_table(
        f"server CPU per request, one core each, c={args.concurrency} keep-alive "
        f"(medians of {args.rounds} rounds)",
        ["server", "body", "req/s", "CPU us/request", "x httptools", "server busy", "p99 ms"],
        [
            [
                s["server"],
                s["body"],
                f"{s['requests_s']:.0f}",
                f"{s['server_cpu_us']:.1f}",
                f"{s['cpu_to_httptools']:.2f}",
                f"{100 * s['server_busy']:.0f}%",
                f"{s['p99_ms']:.2f}",
            ]
            for s in summary
        ],
    )
    results = {
        "environment": environment(),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "versions": versions,
        "points": points,
        "summary": summary,
    }
    print(f"wrote {write_results('frontend_floor', results, args.out)}")
    return results


if __name__ == "__main__":
    main()
