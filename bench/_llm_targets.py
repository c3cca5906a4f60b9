"""The targets' side of bench/llm_stream.py: Envoy configured by inferway's control plane in
front of the engine (a plain prefix route with a stream-friendly timeout), and the CPU meters
(psutil) that charge each proxy its own processes' CPU and tell when a proxy has gone quiet."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psutil
from _common import free_port

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.supervisor import EnvoySupervisor
from inferway.policies import load_policy_text
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import start_xds_server

__all__ = ["CpuMeter", "settle", "start_envoy"]

POLICY = """\
version: 1
listeners:
  - {{name: llm, port: {listener_port}}}
services:
  - name: engine
    endpoints: ["{engine_host}:{engine_port}"]
routes:
  - name: openai
    match: {{path: {{prefix: /v1/}}}}
    backends: [{{service: engine}}]
    timeout: 300s
"""


async def settle(meters: list[CpuMeter], *, quiet: float = 0.05, limit_s: float = 60.0) -> None:
    """Until every meter's process uses under ``quiet`` of a core over half a second: a proxy
    still working off a backlog (LiteLLM keeps streaming requests whose clients left) must
    not run into the next target's measurement."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = [m.seconds() for m in meters]
        await asyncio.sleep(0.5)
        if all(m.seconds() - b < quiet * 0.5 for m, b in zip(meters, before, strict=True)):
            return


class CpuMeter:
    """CPU seconds (user + system) of a process and, optionally, its descendants."""

    def __init__(self, pid: int | None, tree: bool) -> None:
        self.root = psutil.Process(pid) if pid is not None else None
        self.tree = tree

    def seconds(self) -> float:
        if self.root is None:
            return 0.0
        processes = [self.root, *(self.root.children(recursive=True) if self.tree else [])]
        total = 0.0
        for p in processes:
            try:
                times = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total


async def start_envoy(
    host: str, port: int, workdir: Path, concurrency: int
) -> tuple[EnvoySupervisor, Any, int]:
    listener_port = free_port()
    text = POLICY.format(listener_port=listener_port, engine_host=host, engine_port=port)
    cache = SnapshotCache()
    ControlPlane(cache).apply_policy(load_policy_text(text, "llm-bench.yaml"), "llm-bench")
    server = await start_xds_server(cache)
    bootstrap = build_bootstrap(node_id="llm-bench", xds_port=server.port, admin_port=free_port())
    envoy = EnvoySupervisor(bootstrap, workdir=workdir, log_level="error", concurrency=concurrency)
    await envoy.start()
    if not await envoy.wait_ready(30):
        await envoy.stop()
        await server.stop(0)
        raise RuntimeError("Envoy did not become ready")
    return envoy, server, listener_port
