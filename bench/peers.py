"""inferway beside Mosec and Triton (PyTriton) on the same model and the same clients.

Every server runs the tiny MLP (256 -> 1024 -> 1024 -> 10, ONNX Runtime on the CPU) and gets
the same KServe v2 JSON request bytes from the same closed-loop clients (``loadgen.py`` in its
own process), with a new connection per request and with keep-alive, at c = 1, 16, 64.
Servers:

- ``aiohttp``: the yardstick, ONNX Runtime inline in a bare aiohttp handler, no batching;
- ``inferway``: ``start_backend`` with adaptive batching (one process), aiohttp front end;
- ``inferway-fast``: the same with the fast HTTP front end (``--http-frontend fast``);
- ``inferway-fast-nofill``: ``inferway-fast`` with ``batching.fill_when_busy: false`` (an A/B
  of that rule in the same run);
- ``inferway-w2`` / ``inferway-fast-w2``: ``inferway serve --workers 2`` with either;
- ``mosec``: Mosec with dynamic batching (max batch 64, wait 5 ms), one worker, in its venv;
- ``pytriton``: Triton's server and dynamic batcher through PyTriton (same limits), its venv.

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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import venv
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _common import environment, free_port, percentile, print_table, write_results
from batching_models import NOFILL, TINY_SIZES, build_bench_repository, served_name
from loadgen import LoadSpec, LoadWorker
from servers import (
    ServerProcess,
    WorkersServer,
    backend_server_main,
    fast_backend_server_main,
    plain_server_main,
)

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
    "inferway-w2",
    "inferway-fast-w2",
    "mosec",
    "pytriton",
)
MAX_BATCH, MAX_WAIT_MS = 64, 5


def ensure_venv(root: Path, packages: Sequence[str]) -> Path:
    """A venv at ``root`` with ``packages`` (created and installed once); its python."""
    python = root / "bin" / "python"
    marker = root / ".installed"
    if not marker.exists():
        print(f"installing {' '.join(packages)} into {root} (once)...", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
        marker.write_text(" ".join(packages) + "\n")
    return python


def _versions(python: Path, names: Sequence[str]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready at {url} after {timeout_s:.0f} s")
        time.sleep(0.2)


def pytriton_command(
    python: Path, env: dict[str, str], http_port: int, grpc_port: int
) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``peer_servers/pytriton_mlp.py`` in PyTriton's
    venv (``env`` holds PEER_MODEL and the batching limits)."""
    env = dict(env, PEER_HTTP_PORT=str(http_port), PEER_GRPC_PORT=str(grpc_port))
    # Triton's Python-backend stub links libpython3.X.so: make it the venv interpreter's
    # own (a distribution's older libpython beside a newer stdlib breaks multiprocessing)
    libdir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p)
    env["PEER_METRICS_PORT"] = str(free_port())
    return [str(python), str(HERE / "peer_servers" / "pytriton_mlp.py")], env


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


class PeerProcess:
    """A server command in a session of its own (so ``stop`` reaches its children), its output
    in ``log``; ``cpus``: the CPUs it (and what it starts) may run on."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str] | None,
        log: Path,
        cpus: set[int] | None = None,
    ) -> None:
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            command,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if cpus is None else (lambda: os.sched_setaffinity(0, cpus)),
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()


def start_peer(name: str, root: Path, onnx: Path, venvs: Path, logs: Path) -> Peer:
    model = served_name("tiny", "adaptive")
    if name == "aiohttp":
        plain = ServerProcess(plain_server_main, (str(onnx), "mlp"), metrics=False)
        return Peer(name, plain.http_port, "/v2/models/mlp/infer", plain.stop)
    if name == "inferway":
        server = ServerProcess(backend_server_main, (str(root),), metrics=True)
        return Peer(name, server.http_port, f"/v2/models/{model}/infer", server.stop)
    if name in ("inferway-fast", "inferway-fast-nofill"):
        if name.endswith("nofill"):
            model = served_name("tiny", NOFILL)
        server = ServerProcess(fast_backend_server_main, (str(root),), metrics=True)
        return Peer(name, server.http_port, f"/v2/models/{model}/infer", server.stop)
    if name in ("inferway-w2", "inferway-fast-w2"):
        frontend = "fast" if "fast" in name else "aiohttp"
        workers = WorkersServer(root, 2, frontend=frontend)
        return Peer(name, workers.http_port, f"/v2/models/{model}/infer", workers.stop)
    python = ensure_venv(venvs / name, PEER_PACKAGES[name])
    env = dict(os.environ, PEER_MODEL=str(onnx), PEER_MAX_BATCH=str(MAX_BATCH))
    env["PEER_MAX_WAIT_MS"] = str(MAX_WAIT_MS)
    port = free_port()
    if name == "mosec":
        script = str(HERE / "peer_servers" / "mosec_mlp.py")
        command = [str(python), script, "--port", str(port), "--address", "127.0.0.1"]
        process = PeerProcess(command, env, logs / "mosec.log")
        _wait_http(f"http://127.0.0.1:{port}/", process.proc, 120, "mosec")
        versions = _versions(python, ["mosec", "onnxruntime"])
        return Peer(name, port, "/inference", process.stop, versions)
    if name == "pytriton":
        grpc_port = free_port()
        command, env = pytriton_command(python, env, port, grpc_port)
        process = PeerProcess(command, env, logs / "pytriton.log")
        _wait_http(f"http://127.0.0.1:{port}/v2/models/mlp/ready", process.proc, 240, "pytriton")
        versions = _versions(python, ["nvidia-pytriton", "onnxruntime"])
        return Peer(name, port, "/v2/models/mlp/infer", process.stop, versions, grpc_port)
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


def measure(
    worker: LoadWorker, peer: Peer, concurrency: int, keepalive: bool, args: Any
) -> dict[str, Any]:
    spec = LoadSpec(
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
    result = worker.run(spec)
    ms = [s * 1000 for s in result["latencies_s"]]
    return {
        "throughput": len(ms) / result["elapsed_s"],
        "p50_ms": percentile(ms, 50) if ms else None,
        "p99_ms": percentile(ms, 99) if ms else None,
        "errors": len(result["errors"]),
    }


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
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each in a rotated order")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before each point")
    parser.add_argument(
        "--venvs",
        type=Path,
        default=DEFAULT_VENVS,
        help="where Mosec's and PyTriton's own venvs are made on first use (default %(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s points")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 2.0, 0.5
    return args


def summarize(points: list[dict[str, Any]], servers: Sequence[str]) -> list[dict[str, Any]]:
    """Per (server, connections, c): medians over rounds, ratio to aiohttp of the same round."""
    out = []
    keys = sorted({(p["connections"], p["concurrency"]) for p in points})
    for server in servers:
        for connections, c in keys:
            mine = [
                p
                for p in points
                if (p["server"], p["connections"], p["concurrency"]) == (server, connections, c)
            ]
            ratios = []
            for p in mine:
                base = [
                    q
                    for q in points
                    if q["round"] == p["round"]
                    and q["server"] == "aiohttp"
                    and (q["connections"], q["concurrency"]) == (connections, c)
                ]
                if base and base[0]["throughput"] > 0:
                    ratios.append(p["throughput"] / base[0]["throughput"])
            out.append(
                {
                    "server": server,
                    "connections": connections,
                    "concurrency": c,
                    "throughput": statistics.median(p["throughput"] for p in mine),
                    "ratio_to_aiohttp": statistics.median(ratios) if ratios else None,
                    "p50_ms": statistics.median(
                        p["p50_ms"] for p in mine if p["p50_ms"] is not None
                    ),
                    "p99_ms": statistics.median(
                        p["p99_ms"] for p in mine if p["p99_ms"] is not None
                    ),
                    "errors": sum(p["errors"] for p in mine),
                }
            )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    if "aiohttp" not in servers:
        servers.insert(0, "aiohttp")  # every ratio needs it
    levels = [int(c) for c in args.concurrency.split(",")]
    connections = [c for c in args.connections.split(",") if c]
    points: list[dict[str, Any]] = []
    peers: list[Peer] = []
    with tempfile.TemporaryDirectory(prefix="inferway-peers-") as scratch:
        root, logs = Path(scratch) / "models", Path(scratch)
        onnx = build_bench_repository(root, {"tiny": TINY_SIZES})["tiny"]
        worker = LoadWorker()
        try:
            for name in servers:
                print(f"starting {name}...", flush=True)
                peer = start_peer(name, root, onnx, args.venvs, logs)
                peers.append(peer)
                check_answer(peer, onnx)
            for round_ in range(args.rounds):
                order = peers[round_ % len(peers) :] + peers[: round_ % len(peers)]
                for peer in order:
                    for mode in connections:
                        for c in levels:
                            point = measure(worker, peer, c, mode == "keepalive", args)
                            point |= {"server": peer.name, "round": round_}
                            point |= {"connections": mode, "concurrency": c}
                            points.append(point)
                            print(
                                f"round {round_ + 1}/{args.rounds} {peer.name:12} {mode:9} "
                                f"c={c:<3} {point['throughput']:8.0f} req/s "
                                f"p99 {point['p99_ms'] or 0:7.2f} ms",
                                flush=True,
                            )
        finally:
            worker.close()
            for peer in reversed(peers):
                peer.stop()
    summary = summarize(points, servers)
    rows = [
        (
            s["server"],
            s["connections"],
            s["concurrency"],
            f"{s['throughput']:.0f}",
            f"{s['ratio_to_aiohttp']:.2f}" if s["ratio_to_aiohttp"] is not None else "-",
            f"{s['p50_ms']:.2f}",
            f"{s['p99_ms']:.2f}",
            s["errors"],
        )
        for s in summary
    ]
    print_table(
        f"tiny MLP, KServe v2 JSON, closed loop, medians of {args.rounds} rotated rounds",
        ("server", "connections", "c", "req/s", "x aiohttp", "p50 ms", "p99 ms", "errors"),
        rows,
    )
    data = {
        "environment": environment(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "versions": {p.name: p.versions for p in peers},
        "summary": summary,
        "points": points,
    }
    print(f"wrote {write_results('peers', data)}")
    return data


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
