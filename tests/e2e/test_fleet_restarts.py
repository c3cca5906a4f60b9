"""State survives any pod: two control-plane replicas on a real 3-member etcd, gateway pods
(``inferway envoy``, each in its own network namespace on port 10000) against them.

In each phase of a rollout (progressing at 20%, promoted, rolled back), a gateway pod started
with an empty workdir loads the fleet's weights with its first route update (Envoy counts one
route reload, of the fleet's version), and a replica restarted with an empty workdir serves
the fleet's weights from its first snapshot (its Envoy's routes are not reloaded when it
reconnects). Under keep-alive loads through two pods, a leader failover, replica restarts and
a pod's drain fail no request: the drained pod's clients are told to go (``Connection:
close``), the other pod's clients are served throughout."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from inferway.gateway.runtime import Gateway
from inferway.xds import type_urls
from tests.e2e.fleet_helpers import (
    FLEET_TOKEN,
    canary_weight,
    envoy_admin_json,
    fleet_policy,
    start_gateway_pod,
    start_replica,
    version_backends,
)
from tests.etcd_cluster import EtcdCluster
from tests.keep_alive_client import KeepAliveClient, wait_until_flowing
from tests.netns import HostFleet, require_netns

pytestmark = pytest.mark.needs_binary("etcd", "a real 3-member etcd cluster")

PODS = ("pod-a", "pod-b", "pod-c")
"""pod-a on replica r1, pod-b on r2; pod-c is the gateway pod started fresh."""
HELD = "[{weight: 20, pause: 1h}, 50]"
"""Step 0 (20%) is held for an hour: only commands move the rollout."""
ROLLOUT = "v2-rollout"


@dataclass
class _Fleet:
    hosts: HostFleet
    tmp: Path
    url: str
    policy: Path
    replicas: dict[str, Gateway] = field(default_factory=dict)
    pods: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    pod_replica: dict[str, str] = field(default_factory=dict)
    restarts: int = 0

    @property
    def address(self) -> str:
        return self.hosts.gateway_address

    def leader(self) -> str | None:
        leading = [n for n, g in self.replicas.items() if g.fleet and g.fleet.leader.status.leading]
        assert len(leading) <= 1, leading
        return leading[0] if leading else None

    async def wait_leader(self, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while (leader := self.leader()) is None:
            assert time.monotonic() < deadline, "no replica leads"
            await asyncio.sleep(0.05)
        return leader

    async def command(self, command: str) -> None:
        leader = self.replicas[await self.wait_leader()]
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.post(
                f"{leader.admin.url}/rollouts/{ROLLOUT}/{command}",
                headers={"Authorization": f"Bearer {FLEET_TOKEN}"},
            )
        assert answer.status_code == 200, answer.text

    def route_version(self, name: str) -> str:
        snapshot = self.replicas[name].cache.get_snapshot()
        assert snapshot is not None
        return snapshot.versions[type_urls.ROUTE]

    async def pod_routes(self, pod: str) -> tuple[str, int]:
        """The pod's Envoy: its route version and how often it reloaded its routes."""
        path = "/stats?format=json&filter=^http\\.edge\\.rds\\.edge\\."
        stats = (await envoy_admin_json(self.hosts, pod, path))["stats"]
        by_name = {s["name"].rsplit(".", 1)[1]: s.get("value") for s in stats if "name" in s}
        return str(by_name.get("version_text", "")), int(by_name.get("config_reload", 0))

    async def start_pod(self, pod: str, replica: str) -> None:
        self.restarts += 1
        target = f"{self.address}:{self.replicas[replica].xds.port}"
        self.pods[pod] = start_gateway_pod(
            self.hosts, pod, target, self.tmp / f"{pod}-{self.restarts}"
        )
        self.pod_replica[pod] = replica
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                assert self.pods[pod].poll() is None, f"{pod} exited"
                try:
                    if (await client.get(f"http://{self.hosts.address(pod)}:10000/")).is_success:
                        return
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"{pod} never served"
                await asyncio.sleep(0.2)

    async def drain_pod(self, pod: str) -> int:
        process = self.pods.pop(pod)
        process.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(process.wait, 30)

    async def restart_replica(self, name: str) -> Gateway:
        """``name`` stopped and started again on its xDS port with an empty workdir."""
        port = self.replicas[name].xds.port
        await self.replicas.pop(name).stop()
        self.restarts += 1
        workdir = self.tmp / f"{name}-{self.restarts}"
        fresh = await start_replica(self.policy, workdir, self.url, self.address, name,
                                    xds_port=port)  # fmt: skip
        self.replicas[name] = fresh
        return fresh

    async def in_phase(self, phase: str) -> str:
        """Every replica serves ``phase`` and every pod carries its routes; their version."""
        deadline = time.monotonic() + 15
        while True:
            phases = {n: g.rollouts.status(ROLLOUT)["phase"] for n, g in self.replicas.items()}
            versions = {self.route_version(n) for n in self.replicas}
            pods = {(await self.pod_routes(p))[0] for p in self.pods}
            if set(phases.values()) == {phase} and len(versions) == 1 and pods == versions:
                return versions.pop()
            assert time.monotonic() < deadline, (phases, versions, pods)
            await asyncio.sleep(0.3)


@asynccontextmanager
async def _fleet(tmp_path: Path) -> AsyncIterator[_Fleet]:
    require_netns()
    with HostFleet(list(PODS)) as hosts:
        async with AsyncExitStack() as stack:
            cluster = await stack.enter_async_context(EtcdCluster(tmp_path, members=3))
            backends = version_backends(hosts.gateway_address)
            ports = await backends.__anext__()
            stack.push_async_callback(backends.aclose)
            policy = tmp_path / "policy.yaml"
            policy.write_text(fleet_policy(hosts.gateway_address, ports, steps=HELD, interval="1h"))
            fleet = _Fleet(hosts, tmp_path, cluster.url + "/restarts", policy)

            async def stop_all() -> None:
                for process in fleet.pods.values():
                    process.kill()
                    process.wait()
                for replica in fleet.replicas.values():
                    await replica.stop()

            stack.push_async_callback(stop_all)
            for name in ("r1", "r2"):
                fleet.replicas[name] = await start_replica(
                    policy, tmp_path / name, fleet.url, hosts.gateway_address, name
                )
            await fleet.wait_leader()
            await fleet.start_pod("pod-a", "r1")
            await fleet.start_pod("pod-b", "r2")
            yield fleet


async def test_a_fresh_gateway_pod_and_a_fresh_replica_serve_the_fleets_weights_in_each_phase(
    tmp_path: Path,
) -> None:
    async with _fleet(tmp_path) as fleet:
        for phase, command, weight in (
            ("progressing", None, 20.0),
            ("promoted", "promote", 100.0),
            ("rolled_back", "abort", 0.0),
        ):
            if command is not None:
                await fleet.command(command)
            version = await fleet.in_phase(phase)

            # a gateway pod with an empty workdir: its first route update is the fleet's
            await fleet.start_pod("pod-c", "r1")
            assert await fleet.pod_routes("pod-c") == (version, 1), phase
            dump = await envoy_admin_json(
                fleet.hosts, "pod-c", "/config_dump?resource=dynamic_route_configs"
            )
            assert canary_weight(dump) == weight, phase
            assert await fleet.drain_pod("pod-c") == 0

            # the replica that does not lead, restarted with an empty workdir: its first
            # snapshot is the fleet's, and its Envoy (pod-b or pod-a) reconnects without
            # reloading its routes
            follower = next(n for n in fleet.replicas if n != fleet.leader())
            pod = next(p for p, r in fleet.pod_replica.items() if r == follower and p in fleet.pods)
            before = await fleet.pod_routes(pod)
            fresh = await fleet.restart_replica(follower)
            assert fleet.route_version(follower) == version, phase
            assert fresh.rollouts.status(ROLLOUT)["phase"] == phase
            deadline = time.monotonic() + 20
            while (acked := _acked_route(fresh, pod)) != version:
                assert time.monotonic() < deadline, f"{phase}: {pod} acked {acked!r}"
                await asyncio.sleep(0.1)
            assert await fleet.pod_routes(pod) == before, f"{phase}: {pod} reloaded its routes"


def _acked_route(replica: Gateway, node: str) -> str | None:
    for status in replica.cache.node_status():
        if status.node_id == node and status.connected:
            return status.acked.get(type_urls.ROUTE)
    return None


async def test_no_request_fails_across_failover_replica_restarts_and_a_pods_drain(
    tmp_path: Path,
) -> None:
    async with _fleet(tmp_path) as fleet:
        await fleet.command("promote")  # every request to v2 (a route change under load, too)
        await fleet.command("restart")  # back to 20%: both versions serve
        await fleet.in_phase("progressing")
        clients = {
            pod: [
                KeepAliveClient(
                    10000, "/infer", host=fleet.hosts.address(pod), seconds=120, limit=10**6
                )
                for _ in range(4)
            ]
            for pod in ("pod-a", "pod-b")
        }
        everyone = [c for group in clients.values() for c in group]
        for client in everyone:
            client.start()
        try:
            await asyncio.to_thread(wait_until_flowing, everyone, 20, 20.0)

            leader = await fleet.wait_leader()  # failover: the leader goes
            port = fleet.replicas[leader].xds.port
            await fleet.replicas.pop(leader).stop()
            other = next(n for n in fleet.replicas if n != leader)
            deadline = time.monotonic() + 10
            while fleet.leader() != other:
                assert time.monotonic() < deadline, "no takeover"
                await asyncio.sleep(0.05)
            fleet.replicas[leader] = await start_replica(  # back, with an empty workdir
                fleet.policy, tmp_path / f"{leader}-back", fleet.url, fleet.address, leader,
                xds_port=port,
            )  # fmt: skip
            await fleet.restart_replica(other)  # the new leader restarted fresh as well
            await fleet.wait_leader()
            await fleet.command("promote")  # decided and pushed while traffic flows
            await fleet.in_phase("promoted")

            served = {pod: sum(c.ok for c in group) for pod, group in clients.items()}
            assert await fleet.drain_pod("pod-b") == 0
            await asyncio.sleep(1.0)  # pod-a goes on serving
            assert sum(c.ok for c in clients["pod-a"]) > served["pod-a"]
        finally:
            for client in everyone:
                client.stop()
            for client in everyone:
                await asyncio.to_thread(client.join, 15)
        failures = [f for c in everyone for f in c.failures]
        assert not failures, failures
        assert all(c.told_to_go for c in clients["pod-b"]), "the drained pod's clients"
        assert not any(c.told_to_go for c in clients["pod-a"])
        assert all(c.ok > 20 for c in everyone)
