"""The targets' side of bench/llm_stream.py: inferway's gateway in front of the engine (its
composition root: Envoy, the control plane and the LLM processor), with an ``openai`` route
(routing on the body's model, tokens counted by the processor over ext_proc) on one listener
and a plain prefix route (Envoy alone) on another; and the CPU meters (psutil) that charge each
proxy its own processes' CPU and tell when a proxy has gone quiet."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil
from _common import free_port

from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway

__all__ = ["CpuMeter", "settle", "start_inferway"]

POLICY = """\
version: 1
listeners:
  - {{name: llm, port: {llm_listener}}}
  - {{name: plain, port: {plain_listener}}}
llm:
  port: {processor_port}
  reports_port: {reports_port}
services:
  - name: engine
    endpoints: ["{engine_host}:{engine_port}"]
routes:
  - name: openai
    listeners: [llm]
    openai: {{model: {model}}}
    backends: [{{service: engine}}]
  - name: plain
    listeners: [plain]
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

    def __init__(self, pid: int | None, tree: bool, *, also: int | None = None) -> None:
        self.root = psutil.Process(pid) if pid is not None else None
        self.tree = tree
        self.also = psutil.Process(also) if also is not None else None

    def seconds(self) -> float:
        if self.root is None:
            return 0.0
        processes = [self.root, *(self.root.children(recursive=True) if self.tree else [])]
        if self.also is not None:
            processes.append(self.also)
        total = 0.0
        for p in processes:
            try:
                times = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total


async def start_inferway(
    host: str, port: int, model: str, workdir: Path, concurrency: int
) -> tuple[Gateway, int, int]:
    """The gateway and its two listeners' ports: (gateway, openai route's, plain route's)."""
    llm_listener, plain_listener = free_port(), free_port()
    policy = workdir / "llm-bench.yaml"
    policy.write_text(
        POLICY.format(
            llm_listener=llm_listener, plain_listener=plain_listener, processor_port=free_port(),
            reports_port=free_port(),
            engine_host=host, engine_port=port, model=model,
        )
    )  # fmt: skip
    gateway = await start_gateway(
        GatewayOptions(
            policy_path=policy,
            xds_port=0,
            admin_port=0,
            envoy_admin_port=free_port(),
            workdir=workdir / "gateway",
            envoy_log_level="error",
            envoy_concurrency=concurrency,
        )
    )
    assert gateway.supervisor is not None
    if not await gateway.supervisor.wait_ready(30):
        await gateway.stop()
        raise RuntimeError("Envoy did not become ready")
    return gateway, llm_listener, plain_listener
