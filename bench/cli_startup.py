"""CLI start-up: how long ``inferway --version``, ``--help`` and the admin-API commands that
operators and scripts poll (``status``, ``scale status``, ``rollout status``) take, wall and
CPU, each a fresh process as a shell runs it.

A real gateway answers them: ``inferway run --no-envoy`` on a policy with a rollout and an
autoscaled service (a published-metric target, so no replica processes), started once. Each
command runs once to warm the page cache, then ``--runs`` times; CPU is the child's user +
system time (``getrusage``), which these shared machines disturb far less than wall time.
The target (docs/cli.md, issue 30) is 0.3 s wall for every command measured here.

    .venv/bin/python bench/cli_startup.py --runs 10
    .venv/bin/python bench/cli_startup.py --python /other/checkout/.venv/bin/python \\
        --cwd /other/checkout --label before      # another checkout's code, same machine
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _common import environment, percentile, print_table, write_results

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.3

POLICY = """\
version: 1
listeners: [{{name: edge, port: {listener}}}]
services:
  - name: v1
    endpoints: ["127.0.0.1:{backend}"]
    autoscale:
      scale_target: metric
      algorithm: proportional
      metric: in_flight
      target: 2
      sampling_interval: 1
      min_replicas: 1
      max_replicas: 4
  - name: v2
    endpoints: ["127.0.0.1:{backend}"]
routes:
  - name: inference
    listeners: [edge]
    match: {{path: {{prefix: /}}}}
    backends: [{{service: v1, weight: 100}}, {{service: v2, weight: 0}}]
rollouts:
  - {{name: canary, route: inference, stable: v1, canary: v2, steps: [10, 50, 100]}}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _commands(admin: str) -> list[tuple[str, list[str]]]:
    return [
        ("--version", ["--version"]),
        ("--help", ["--help"]),
        ("status", ["status", "--admin", admin]),
        ("status -o json", ["status", "--admin", admin, "-o", "json"]),
        ("scale status", ["scale", "status", "--admin", admin]),
        ("rollout status", ["rollout", "status", "--admin", admin]),
    ]


def _wait_for_status(url: str, gateway: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gateway.poll() is not None:
            raise SystemExit(f"the gateway exited with {gateway.returncode} before answering")
        try:
            with urllib.request.urlopen(f"{url}/status", timeout=1) as response:
                if json.loads(response.read()).get("policy"):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url}/status did not show a policy within {timeout_s:.0f} s")


def _time_once(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run; SystemExit when the command fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(python: str, cwd: Path, runs: int) -> dict[str, Any]:
    env = {**os.environ, "COLUMNS": "120"}
    inferway = [python, "-m", "inferway.cli.entry"]
    admin_port = _free_port()
    url = f"http://127.0.0.1:{admin_port}"
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as scratch:
        policy = Path(scratch) / "policy.yaml"
        policy.write_text(POLICY.format(listener=_free_port(), backend=_free_port()))
        run = [*inferway, "run", "-f", str(policy), "--no-envoy", "--workdir", scratch]
        run += ["--xds-port", str(_free_port()), "--admin-port", str(admin_port)]
        gateway = subprocess.Popen(
            run,
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_status(url, gateway)
            results: dict[str, Any] = {}
            for label, args in _commands(url):
                _time_once([*inferway, *args], cwd, env)  # warm the page cache
                walls, cpus = [], []
                for _ in range(runs):
                    wall, cpu = _time_once([*inferway, *args], cwd, env)
                    walls.append(wall)
                    cpus.append(cpu)
                results[label] = {
                    "runs": runs,
                    "wall_p50_s": round(percentile(walls, 50), 3),
                    "wall_max_s": round(max(walls), 3),
                    "cpu_p50_s": round(percentile(cpus, 50), 3),
                    "cpu_max_s": round(max(cpus), 3),
                }
            return results
        finally:
            gateway.send_signal(signal.SIGTERM)
            try:
                gateway.wait(20)
            except subprocess.TimeoutExpired:
                gateway.kill()
                gateway.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="measured runs per command")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the CLI")
    parser.add_argument("--cwd", type=Path, default=ROOT, help="checkout whose code is measured")
    parser.add_argument("--label", default="", help="a name for this run in the JSON")
    parser.add_argument("--json", default=None, help="results path (default bench/results/)")
    args = parser.parse_args()
    results = measure(args.python, args.cwd, args.runs)
    rows = [
        [
            label,
            f"{r['wall_p50_s']:.3f}",
            f"{r['wall_max_s']:.3f}",
            f"{r['cpu_p50_s']:.3f}",
            "yes" if r["wall_p50_s"] <= TARGET_S else "NO",
        ]
        for label, r in results.items()
    ]
    print_table(
        f"inferway CLI start-up, {args.runs} runs each ({args.label or args.cwd})",
        ["command", "wall p50 s", "wall max s", "CPU p50 s", f"p50 <= {TARGET_S} s"],
        rows,
    )
    path = write_results(
        "cli_startup" + (f"_{args.label}" if args.label else ""),
        {
            "label": args.label,
            "checkout": str(args.cwd),
            "target_wall_s": TARGET_S,
            "commands": results,
            "environment": environment() | {"load_average": os.getloadavg()},
        },
        Path(args.json) if args.json else None,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
