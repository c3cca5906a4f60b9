"""The fleet the fleet benchmarks measure: a real 3-member etcd cluster (tests/etcd_cluster.py)
and control-plane replicas as their own processes, started as a user would
(``inferway run --no-envoy --store etcd://...``), so each replica's CPU and memory are its
own and a decision crosses etcd exactly as in production. Decisions are rollout commands sent
to the leader's admin API: the leader decides in the request, stores the state (fenced) and
pushes it; the other replicas pick it up from their etcd watch and push it to their Envoys.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from inferway.free_ports import free_ports
from tests.etcd_cluster import EtcdCluster

__all__ = ["ROLLOUT", "TOKEN", "FleetCluster", "Replica", "render_fleet_policy"]

ROLLOUT = "canary"
TOKEN = "fleet-bench-token"
ROOT = Path(__file__).resolve().parents[1]


def render_fleet_policy(
    *,
    listener_port: int,
    backend_port: int,
    interval: str = "1h",
    max_error_rate: str = "2%",
    min_requests: int = 50,
) -> str:
    """One listener, a stable and a canary service and a rollout between them; step 0 (20%)
    is held for an hour, so only commands or a failed check move the weights."""
    return f"""version: 1
listeners:
  - {{name: edge, port: {listener_port}}}
services:
  - {{name: v1, endpoints: ["127.0.0.1:{backend_port}"]}}
  - {{name: v2, endpoints: ["127.0.0.1:{backend_port}"]}}
routes:
  - name: models
    backends:
      - {{service: v1, weight: 100}}
      - {{service: v2, weight: 0}}
rollouts:
  - name: {ROLLOUT}
    route: models
    stable: v1
    canary: v2
    steps: [{{weight: 20, pause: 1h}}, 50]
    analysis:
      interval: {interval}
      min_requests: {min_requests}
      metrics:
        - {{name: error-rate-max, max: {max_error_rate}}}
"""


@dataclass
class Replica:
    name: str
    xds_port: int
    admin_port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


class FleetCluster:
    """``async with FleetCluster(workdir, policy_text, replicas=3) as fleet``: etcd, then the
    replicas; ``fleet.command(...)`` decides on the leader."""

    def __init__(self, workdir: Path, policy_text: str, *, replicas: int, ttl: float = 5.0) -> None:
        self.workdir = workdir
        self.policy = workdir / "policy.yaml"
        self.policy.write_text(policy_text)
        self.token = workdir / "admin-token"
        self.token.write_text(TOKEN + "\n")
        self.token.chmod(0o600)
        self.count = replicas
        self.ttl = ttl
        self.etcd = EtcdCluster(workdir, members=3)
        self.replicas: dict[str, Replica] = {}
        self.http = httpx.AsyncClient(timeout=10.0)

    @property
    def url(self) -> str:
        return self.etcd.url + "/bench"

    def spawn(self, name: str) -> Replica:
        """Replica ``name`` as its own process (an empty workdir of its own)."""
        xds_port, admin_port = free_ports("127.0.0.1", "127.0.0.1")
        workdir = self.workdir / name
        workdir.mkdir(exist_ok=True)
        log = self.workdir / f"{name}.log"
        command = [
            sys.executable, "-m", "inferway.cli.entry", "run", "--file", str(self.policy),
            "--no-envoy",
            "--store", self.url, "--replica-id", name, "--lease-ttl", str(self.ttl),
            "--xds-port", str(xds_port), "--admin-port", str(admin_port),
            "--workdir", str(workdir), "--admin-token-file", str(self.token),
            "--log-level", "warning",
        ]  # fmt: skip
        with log.open("ab") as out:
            process = subprocess.Popen(
                command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        replica = Replica(name, xds_port, admin_port, process, log)
        self.replicas[name] = replica
        return replica

    async def status(self, replica: Replica) -> dict[str, Any]:
        answer = await self.http.get(f"{replica.admin}/status")
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result

    async def wait_up(self, timeout: float = 60.0) -> str:
        """Every replica answers and one leads; returns the leader's name."""
        deadline = time.monotonic() + timeout
        for replica in self.replicas.values():
            while True:
                if replica.process.poll() is not None:
                    raise RuntimeError(f"replica {replica.name} exited:\n{replica.log_tail()}")
                try:
                    leader = (await self.status(replica))["fleet"]["leader"]
                    if leader is not None:
                        break
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"replica {replica.name} not up:\n{replica.log_tail()}")
                await asyncio.sleep(0.1)
        return await self.leader()

    async def leader(self) -> str:
        for replica in self.replicas.values():
            if replica.process.poll() is None:
                leader = (await self.status(replica))["fleet"]["leader"]
                if isinstance(leader, str):
                    return leader
        raise RuntimeError("no replica names a leader")

    async def rollout(self, replica: Replica) -> dict[str, Any]:
        answer = await self.http.get(f"{replica.admin}/rollouts/{ROLLOUT}")
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result

    async def wait_leader(self, timeout: float = 30.0) -> str:
        """The leader's name, once one leads (a replica that lost its lease campaigns again)."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(RuntimeError, httpx.HTTPError, KeyError):
                return await self.leader()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no leader within {timeout}s")
            await asyncio.sleep(0.1)

    def leadership_lost(self) -> int:
        """How often a replica gave its leadership up (its log says so): under load its lease
        renewals can starve behind the xDS streams of many Envoys."""
        return sum(r.log_tail(10**7).count("no longer leads") for r in self.replicas.values())

    async def command(self, leader: str, command: str) -> None:
        """``rollout <command>`` on the leader's admin API (it decides within the request)."""
        answer = await self.http.post(
            f"{self.replicas[leader].admin}/rollouts/{ROLLOUT}/{command}",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        if answer.status_code != 200:
            logs = "\n".join(f"--- {r.name}:\n{r.log_tail()}" for r in self.replicas.values())
            raise RuntimeError(f"{command} on {leader}: {answer.status_code} {answer.text}\n{logs}")

    def stop(self, name: str) -> None:
        replica = self.replicas.pop(name)
        if replica.process.poll() is None:
            os.killpg(replica.process.pid, signal.SIGTERM)
            try:
                replica.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(replica.process.pid, signal.SIGKILL)
                replica.process.wait(5)

    async def __aenter__(self) -> FleetCluster:
        await self.etcd.__aenter__()
        try:
            for i in range(self.count):
                self.spawn(f"r{i}")
            await self.wait_up()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        for name in list(self.replicas):
            self.stop(name)
        self.etcd.close()
        await self.http.aclose()
