"""``inferway envoy``: Envoy alone against a remote control plane. Started as a user would (the
CLI, its own process), it gets its config from a control plane running elsewhere, serves
traffic, reports its stats with its zone, and on SIGTERM drains and exits 0."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from aiohttp import web

from inferway.gateway.runtime import GatewayOptions, start_gateway
from tests.aiohttp_sites import answer_every_path, start_site
from tests.envoy_process import free_port


async def test_an_envoy_alone_serves_the_remote_control_planes_config(tmp_path: Path) -> None:
    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"served": "yes"})

    runner, backend = await start_site(answer_every_path(answer))
    listener = free_port()
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"""version: 1
listeners:
  - {{name: edge, port: {listener}}}
services:
  - {{name: model, endpoints: ["127.0.0.1:{backend}"]}}
routes:
  - {{name: all, backends: [{{service: model}}]}}
"""
    )
    gateway = await start_gateway(
        GatewayOptions(
            policy_path=policy, xds_port=0, admin_port=0, with_envoy=False, workdir=tmp_path / "cp"
        )
    )
    edge = subprocess.Popen(
        [
            sys.executable, "-m", "inferway.cli.entry", "envoy",
            "--control-plane", f"127.0.0.1:{gateway.xds.port}",
            "--node-id", "edge-1", "--zone", "zone-a",
            "--envoy-admin-port", str(free_port()), "--workdir", str(tmp_path / "edge"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                try:
                    answer_ = await client.get(f"http://127.0.0.1:{listener}/infer")
                    if answer_.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert edge.poll() is None, edge.communicate()[0].decode()[-2000:]
                assert time.monotonic() < deadline, "the edge Envoy never served"
                await asyncio.sleep(0.2)
        assert answer_.json() == {"served": "yes"}
        assert "edge-1" in {node.node_id for node in gateway.cache.node_status()}
        assert gateway.envoy_reports is not None
        while "edge-1" not in gateway.envoy_reports.reports():
            assert time.monotonic() < deadline + 10, "the edge Envoy never pushed its stats"
            await asyncio.sleep(0.2)
        assert gateway.envoy_reports.reports()["edge-1"].zone == "zone-a"

        edge.send_signal(signal.SIGTERM)
        output, _ = await asyncio.to_thread(edge.communicate, timeout=20)
        assert edge.returncode == 0, output.decode()[-2000:]
    finally:
        if edge.poll() is None:
            edge.kill()
            edge.wait()
        await gateway.stop()
        await runner.cleanup()
