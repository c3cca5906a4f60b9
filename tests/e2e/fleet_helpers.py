"""What the fleet's end-to-end tests share: the policy (a route with a canary rollout served on
every gateway pod's port 10000), the two version backends, the canary's weight as an Envoy's
config dump shows it, a control-plane replica on the store (in this process, as ``inferway
run --no-envoy --store ...`` builds it), and a gateway pod (``inferway envoy``, in a network
namespace) with its Envoy's admin read from inside that namespace."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from tests.envoy_process import free_port
from tests.netns import HostFleet

__all__ = [
    "ENVOY_ADMIN_PORT",
    "FLEET_TOKEN",
    "canary_weight",
    "envoy_admin_json",
    "fleet_policy",
    "start_gateway_pod",
    "start_replica",
    "version_backends",
]

FLEET_TOKEN = "fleet-token"
ENVOY_ADMIN_PORT = 9901
"""A gateway pod's Envoy admin, on the loopback of its own namespace."""


def fleet_policy(
    backend_host: str, ports: dict[str, int], *, steps: str = "[20, 50]", interval: str = "1s"
) -> str:
    return f"""version: 1
listeners:
  - {{name: edge, address: 0.0.0.0, port: 10000}}
services:
  - {{name: v1, endpoints: ["{backend_host}:{ports["v1"]}"]}}
  - {{name: v2, endpoints: ["{backend_host}:{ports["v2"]}"]}}
routes:
  - name: models
    backends:
      - {{service: v1, weight: 100}}
      - {{service: v2, weight: 0}}
rollouts:
  - name: v2-rollout
    route: models
    stable: v1
    canary: v2
    steps: {steps}
    analysis:
      interval: {interval}
      metrics:
        - {{name: error-rate, max_increase: 2%}}
"""


async def version_backends(host: str, *, bad_every: int = 0) -> AsyncIterator[dict[str, int]]:
    """v1 and v2 on ``host``; with ``bad_every`` every n-th v2 answer is a 503."""
    served = {"v2": 0}

    async def v1(_: web.Request) -> web.Response:
        return web.json_response({"version": "v1"})

    async def v2(_: web.Request) -> web.Response:
        served["v2"] += 1
        if bad_every and served["v2"] % bad_every == 0:
            return web.Response(status=503, text="injected")
        return web.json_response({"version": "v2"})

    runners, ports = [], {}
    for name, handler in (("v1", v1), ("v2", v2)):
        app = web.Application()
        app.router.add_get("/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        ports[name] = free_port()
        await web.TCPSite(runner, host, ports[name]).start()
        runners.append(runner)
    try:
        yield ports
    finally:
        for runner in runners:
            await runner.cleanup()


def canary_weight(dump: dict[str, Any]) -> float | None:
    """The canary's share of the route, from ``config_dump?resource=dynamic_route_configs``."""
    routes = [
        route
        for entry in dump.get("configs", [])
        for host in entry.get("route_config", {}).get("virtual_hosts", [])
        for route in host.get("routes", [])
    ]
    for route in routes:
        action = route.get("route", {})
        if "cluster" in action:  # one backend left: all or nothing to the canary
            return 100.0 if action["cluster"] == "v2" else 0.0
        weighted = action.get("weighted_clusters")
        if weighted:
            weights = {c["name"]: c.get("weight", 0) for c in weighted["clusters"]}
            return round(100 * weights.get("v2", 0) / (sum(weights.values()) or 1), 1)
    return None


async def start_replica(
    policy: Path, workdir: Path, url: str, host: str, name: str, *, xds_port: int = 0
) -> Gateway:
    """A control-plane replica on the store ``url`` (its admin token the fleet's: commands
    are forwarded to the leader)."""
    token = policy.parent / "admin-token"
    if not token.exists():
        token.write_text(FLEET_TOKEN + "\n")
        token.chmod(0o600)
    return await start_gateway(
        GatewayOptions(
            policy_path=policy,
            host=host,
            xds_port=xds_port,
            admin_port=0,
            with_envoy=False,
            workdir=workdir,
            store=url,
            replica_id=name,
            lease_ttl_s=2.0,
            stats_push_s=0.5,
            admin_token_file=token,
        )
    )


def start_gateway_pod(
    fleet: HostFleet, host: str, control_plane: str, workdir: Path
) -> subprocess.Popen[bytes]:
    """``inferway envoy`` in ``host``'s namespace against ``control_plane`` (HOST:PORT), with
    an empty workdir; stop it by its pid (SIGTERM drains)."""
    workdir.mkdir(parents=True)
    log = (workdir.parent / f"{workdir.name}.log").open("wb")
    argv = [
        sys.executable, "-m", "inferway.cli.entry", "envoy", "--control-plane", control_plane,
        "--node-id", host, "--zone", host, "--envoy-admin-port", str(ENVOY_ADMIN_PORT),
        "--workdir", str(workdir),
    ]  # fmt: skip
    try:
        return fleet.popen(host, argv, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


_FETCH = (
    "import sys, urllib.request; "
    "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
)


async def envoy_admin_json(fleet: HostFleet, host: str, path: str) -> Any:
    """A gateway pod's Envoy admin ``path`` (JSON), read from inside its namespace (by a
    child process: the event loop, which runs the replicas, is not held up)."""
    url = f"http://127.0.0.1:{ENVOY_ADMIN_PORT}{path}"
    process = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", fleet.namespace(host), sys.executable, "-c", _FETCH, url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 15)
    if process.returncode != 0:
        raise RuntimeError(f"{host}: GET {path}: {err.decode(errors='replace')[-500:]}")
    return json.loads(out)
