"""Triton's ``perf_analyzer``, unmodified, against ``inferway serve`` over HTTP and gRPC.

perf_analyzer asks the server for the model's metadata and Triton model config before it
sends anything and reads Triton's statistics around every measurement window (the "Server:"
lines and the queue/compute columns), so a run exercises the extensions as Triton's own
tool uses them. The PyPI ``perf-analyzer`` name is a placeholder; the binary ships inside the
tritonclient 2.46 wheel and needs Debian's ``libb64-0d`` and the CUDA runtime library
(``nvidia-cuda-runtime-cu12`` wheel), even for a CPU-only server. ``--setup`` makes that
environment (a venv, default under ~/.cache) with pip; libb64 comes from apt.

    python bench/perf_analyzer.py --setup
    python bench/perf_analyzer.py --concurrency 1:9:4
    python bench/perf_analyzer.py --servers inferway,triton   # beside PyTriton (peers.py's venv)

Writes bench/results/perf_analyzer.json (perf_analyzer's CSV rows per protocol).
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import venv
from pathlib import Path
from typing import Any

from _common import environment, free_port, print_table, write_results

from inferway.devtools.demo_models import write_demo_repository

TOOL_PACKAGES = ("tritonclient==2.46.0", "nvidia-cuda-runtime-cu12")
DEFAULT_TOOL_VENV = Path.home() / ".cache" / "inferway-bench" / "perf-analyzer"
COLUMNS = (
    "Concurrency",
    "Inferences/Second",
    "Server Queue",
    "Server Compute Infer",
    "p50 latency",
    "p99 latency",
)


def setup_tool(root: Path) -> None:
    """A venv holding perf_analyzer (tritonclient 2.46's wheel, without its Python deps: only
    the binary is used) and the CUDA runtime library it links against."""
    venv.EnvBuilder(with_pip=True).create(root)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--no-deps", TOOL_PACKAGES[0]], check=True)
    subprocess.run([*pip, TOOL_PACKAGES[1]], check=True)


def tool_env(root: Path) -> tuple[Path, dict[str, str]]:
    """The binary and an environment where its shared libraries resolve; exits saying what is
    missing otherwise."""
    binary = root / "bin" / "perf_analyzer"
    if not binary.exists():
        sys.exit(f"{binary} not found: run with --setup first (pip installs {TOOL_PACKAGES})")
    libs = sorted(root.glob("lib/python*/site-packages/nvidia/cuda_runtime/lib"))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([*(str(p) for p in libs), env.get("LD_LIBRARY_PATH", "")])
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env)
    missing = [line.split()[0] for line in ldd.stdout.splitlines() if "not found" in line]
    if missing:
        hint = " (apt-get install libb64-0d)" if any("b64" in m for m in missing) else ""
        sys.exit(f"perf_analyzer cannot start, missing {', '.join(missing)}{hint}")
    return binary, env


def start_serve(models: Path) -> tuple[subprocess.Popen[str], int, int]:
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve", str(models)]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            sys.exit(f"inferway serve exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            url = f"http://127.0.0.1:{http_port}/v2/health/ready"
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return proc, http_port, grpc_port
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit("inferway serve did not become ready within 120 s")
        time.sleep(0.2)


def run_tool(
    binary: Path,
    env: dict[str, str],
    protocol: str,
    port: int,
    args: argparse.Namespace,
    model: str | None = None,
) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.csv"
        name = model or args.model
        command = [str(binary), "-m", name, "-u", f"127.0.0.1:{port}", "-i", protocol]
        command += ["--concurrency-range", args.concurrency, "-f", str(report)]
        command += ["--measurement-interval", str(args.interval_ms)]
        command += ["--stability-percentage", str(args.stability), "--max-trials", "8"]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        print(done.stdout[-3000:])
        if done.returncode != 0:
            sys.exit(f"perf_analyzer failed ({done.returncode}): {done.stderr[-2000:]}")
        with report.open() as f:
            return list(csv.DictReader(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tool-venv",
        type=Path,
        default=DEFAULT_TOOL_VENV,
        help="the venv holding tritonclient's perf_analyzer (default %(default)s)",
    )
    parser.add_argument("--setup", action="store_true", help="create the tool venv and exit")
    parser.add_argument("--model", default="demo", help="the model name perf_analyzer asks for")
    parser.add_argument(
        "--concurrency", default="1:9:4", help="perf_analyzer's range, start:end:step"
    )
    parser.add_argument(
        "--interval-ms", type=int, default=3000, help="perf_analyzer's measurement window"
    )
    parser.add_argument(
        "--stability", type=int, default=25, help="percent the windows may differ by"
    )
    parser.add_argument("--protocols", default="http,grpc", help="http, grpc or both")
    parser.add_argument(
        "--servers",
        default="inferway",
        help="inferway and/or triton (PyTriton in its own venv, bench/peers.py's set-up), "
        "measured one after the other per protocol, the order alternating",
    )
    parser.add_argument("--venvs", type=Path, default=None, help="peers.py's venvs folder")
    args = parser.parse_args()
    if args.setup:
        setup_tool(args.tool_venv)
        return
    binary, env = tool_env(args.tool_venv)
    servers = [s for s in args.servers.split(",") if s]
    results: dict[str, Any] = {"environment": environment(), "model": "demo MLP 256-1024-1024-10"}
    with tempfile.TemporaryDirectory(prefix="inferway-pa-") as tmp:
        models = Path(tmp) / "models"
        write_demo_repository(models, name=args.model)
        ports: dict[str, tuple[int, int, str]] = {}
        stops = []
        try:
            if "inferway" in servers:
                proc, http_port, grpc_port = start_serve(models)
                ports["inferway"] = (http_port, grpc_port, args.model)
                stops.append(
                    lambda: (proc.send_signal(signal.SIGTERM), proc.communicate(timeout=30))
                )
            if "triton" in servers:
                from peers import DEFAULT_VENVS, start_peer

                onnx = next(models.glob(f"{args.model}/*/model.onnx"))
                peer = start_peer(
                    "pytriton",
                    {True: models, False: models},
                    onnx,
                    args.venvs or DEFAULT_VENVS,
                    Path(tmp),
                    1,  # ONNX Runtime's intra-op threads, as its harness always had
                )
                ports["triton"] = (peer.port, peer.grpc_port, "mlp")
                stops.append(peer.stop)
                results["triton_versions"] = peer.versions
            for i, protocol in enumerate(args.protocols.split(",")):
                order = servers if i % 2 == 0 else servers[::-1]
                for server in order:
                    http_port, grpc_port, model = ports[server]
                    port = http_port if protocol == "http" else grpc_port
                    rows = run_tool(binary, env, protocol, port, args, model)
                    results[protocol if server == "inferway" else f"{server}-{protocol}"] = rows
                    print_table(
                        f"perf_analyzer over {protocol} against {server} (latencies in us)",
                        COLUMNS,
                        [[row.get(c, "") for c in COLUMNS] for row in rows],
                    )
                if {"inferway", "triton"} <= set(servers):
                    ours, theirs = results[protocol], results[f"triton-{protocol}"]
                    ratios = [
                        (
                            a["Concurrency"],
                            a["Inferences/Second"],
                            b["Inferences/Second"],
                            f"{float(a['Inferences/Second']) / float(b['Inferences/Second']):.2f}",
                        )
                        for a, b in zip(ours, theirs, strict=False)
                    ]
                    results[f"ratio-{protocol}"] = ratios
                    print_table(
                        f"{protocol}: inferway / Triton throughput",
                        ("concurrency", "inferway inf/s", "Triton inf/s", "ratio"),
                        ratios,
                    )
        finally:
            for stop in reversed(stops):
                stop()
    print(f"wrote {write_results('perf_analyzer', results)}")


if __name__ == "__main__":
    main()
