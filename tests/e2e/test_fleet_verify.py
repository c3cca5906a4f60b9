"""``inferway verify --admin`` against a fleet: two control-plane replicas (``inferway run
--no-envoy --store file:...``, in this process) and two gateway pods (``inferway envoy``, each
in its own network namespace on port 10000), pod-a on replica r1 and pod-b on r2. pod-a is
reached at the address its xDS stream comes from; pod-b advertises its address
(``--advertise-address``) because its xDS connection goes through a relay this test can hold,
as a link that stops delivering does.

verify, asked at r1 only, checks both pods (pod-b through r2, which r1's fleet lists), each at
its own listener: both pass. Then the policy's split moves from 50/50 to 10/90 while pod-b's
xDS is held: pod-a takes the new split, pod-b keeps routing 50/50, and verify fails naming
pod-b only (its config is not in sync and its activation frequencies miss the split it is
served), while pod-a passes; ``--envoy pod-a`` alone passes. With pod-b's link cut, verify
refuses it by name as unreachable (exit 3)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.fleet_helpers import start_replica, version_backends
from tests.netns import HostFleet, require_netns

PODS = ("pod-a", "pod-b")


def _policy(host: str, ports: dict[str, int], v1: int, v2: int) -> str:
    return f"""version: 1
listeners:
  - {{name: edge, address: 0.0.0.0, port: 10000}}
services:
  - {{name: v1, endpoints: ["{host}:{ports["v1"]}"]}}
  - {{name: v2, endpoints: ["{host}:{ports["v2"]}"]}}
routes:
  - name: models
    backends:
      - {{service: v1, weight: {v1}}}
      - {{service: v2, weight: {v2}}}
"""


class HeldRelay:
    """A TCP relay to the control plane's xDS port; while ``held``, nothing the control plane
    sends is passed on (the connection stays open, as on a link that stops delivering)."""

    def __init__(self, host: str, upstream: tuple[str, int]) -> None:
        self.host, self.upstream = host, upstream
        self.released = asyncio.Event()
        self.released.set()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gated: bool
    ) -> None:
        with suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if gated:
                    await self.released.wait()
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        for task in (
            asyncio.create_task(self._pump(reader, up_writer, gated=False)),
            asyncio.create_task(self._pump(up_reader, writer, gated=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        self.released.set()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()


def _start_pod(
    fleet: HostFleet, pod: str, control_plane: str, workdir: Path, *extra: str
) -> subprocess.Popen[bytes]:
    workdir.mkdir(parents=True)
    argv = [
        sys.executable, "-m", "inferway.cli.entry", "envoy", "--control-plane", control_plane,
        "--node-id", pod, "--zone", pod, "--envoy-admin-port", "9901",
        "--workdir", str(workdir), *extra,
    ]  # fmt: skip
    with (workdir.parent / f"{pod}.log").open("wb") as log:
        return fleet.popen(pod, argv, stdout=log, stderr=subprocess.STDOUT)


async def _status(admin: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5) as client:
        answer: dict[str, Any] = (await client.get(f"{admin}/status")).json()
        return answer


async def _wait(admins: list[str], check: Any, what: str, timeout: float = 30.0) -> dict[str, Any]:
    """The nodes every replica in ``admins`` holds a stream of, once ``check`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = {n["node_id"]: n for a in admins for n in (await _status(a))["nodes"]}
        if check(nodes):
            return nodes
        assert time.monotonic() < deadline, f"{what}: {json.dumps(nodes, indent=1)}"
        await asyncio.sleep(0.2)


async def _registry_lists(admin: str, other: str, timeout: float = 30.0) -> None:
    """Until the replica at ``admin`` lists the replica whose admin API is ``other``."""
    deadline = time.monotonic() + timeout
    while True:
        replicas = ((await _status(admin)).get("fleet") or {}).get("replicas") or []
        if any(r.get("admin") == other for r in replicas):
            return
        assert time.monotonic() < deadline, f"{admin} does not list {other}: {replicas}"
        await asyncio.sleep(0.2)


async def _verify(policy: Path, admin: str, *extra: str) -> tuple[int, dict[str, Any]]:
    """``--alpha 1e-6``: a pod on its split fails the chi-square once in a million runs, while
    400 requests split 50/50 against an expected 10/90 give p far below it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferway.cli.entry", "verify", "-f", str(policy),
        "--admin", admin, "--requests", "400", "--alpha", "1e-6", "-o", "json", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    assert out, f"verify printed nothing (exit {process.returncode}): {err.decode()[-2000:]}"
    return process.returncode, json.loads(out)


def _bar(row: dict[str, Any], name: str) -> dict[str, Any]:
    return next(b for b in row["run"]["bars"] if b["name"] == name)


async def test_verify_checks_every_envoy_and_names_the_one_that_differs(tmp_path: Path) -> None:
    require_netns()
    with HostFleet(list(PODS)) as fleet:
        async with AsyncExitStack() as stack:
            host = fleet.gateway_address
            gen = version_backends(host)
            ports = await gen.__anext__()
            stack.push_async_callback(gen.aclose)
            policy = tmp_path / "policy.yaml"
            policy.write_text(_policy(host, ports, 50, 50))
            store = f"file:{tmp_path / 'store'}"
            r1 = await start_replica(policy, tmp_path / "r1", store, host, "r1")
            stack.push_async_callback(r1.stop)
            r2 = await start_replica(policy, tmp_path / "r2", store, host, "r2")
            stack.push_async_callback(r2.stop)
            admin = r1.admin.url
            admins = [r1.admin.url, r2.admin.url]
            relay = HeldRelay(host, (host, r2.xds.port))
            await relay.start()
            stack.push_async_callback(relay.stop)
            pods = {
                "pod-a": _start_pod(fleet, "pod-a", f"{host}:{r1.xds.port}", tmp_path / "a"),
                "pod-b": _start_pod(
                    fleet, "pod-b", f"{host}:{relay.port}", tmp_path / "b",
                    "--advertise-address", fleet.address("pod-b"),
                ),
            }  # fmt: skip
            for process in pods.values():
                stack.callback(process.wait, 30)
                stack.callback(process.terminate)

            nodes = await _wait(
                admins, lambda n: all(p in n and n[p]["in_sync"] for p in PODS), "pods in sync"
            )
            assert (nodes["pod-a"]["address"], nodes["pod-a"]["address_source"]) == (
                fleet.address("pod-a"), "ads-peer",
            )  # fmt: skip
            assert (nodes["pod-b"]["address"], nodes["pod-b"]["address_source"]) == (
                fleet.address("pod-b"), "advertised",
            )  # fmt: skip

            # verify reaches r2's Envoys through the replicas r1's registry lists: r1 learns
            # r2's admin address from r2's heartbeat, on its own next beat
            await _registry_lists(admin, r2.admin.url)

            # both pods serve what they were sent: the default (two Envoys) checks both
            code, document = await _verify(policy, admin)
            assert code == 0, document["verdict"]
            rows = {row["node"]: row for row in document["envoys"]}
            assert set(rows) == set(PODS)
            # pod-b holds its stream on r2: verify asked at r1 found it through r1's fleet
            assert (rows["pod-a"]["replica"], rows["pod-b"]["replica"]) == tuple(admins)
            for pod in PODS:
                assert rows[pod]["gateway"] == f"http://{fleet.address(pod)}:10000"
                assert rows[pod]["weights"] == {"models": {"v1": 50.0, "v2": 50.0}}
                observed = rows[pod]["run"]["functional"]["activation"]["pools"]
                assert observed["v1"]["observed"] > 100 and observed["v2"]["observed"] > 100

            # the split moves to 10/90 while pod-b's xDS is held: pod-b keeps 50/50
            relay.released.clear()
            policy.write_text(_policy(host, ports, 10, 90))
            nodes = await _wait(
                admins,
                lambda n: n["pod-a"]["in_sync"] and not n["pod-b"]["in_sync"],
                "pod-a on the new split, pod-b held",
            )
            code, document = await _verify(policy, admin)
            assert code == 4, document["verdict"]
            assert document["failed"] == ["pod-b"], document["verdict"]
            assert (
                "pod-b failed" in document["verdict"]
                and "pod-a failed" not in (document["verdict"])
            )
            rows = {row["node"]: row for row in document["envoys"]}
            assert rows["pod-a"]["ok"] is True
            assert rows["pod-b"]["ok"] is False and rows["pod-b"]["in_sync"] is False
            for pod in PODS:
                assert rows[pod]["weights"] == {"models": {"v1": 10.0, "v2": 90.0}}
            assert _bar(rows["pod-a"], "activation frequency (all pools)")["ok"] is True
            assert _bar(rows["pod-b"], "activation frequency (all pools)")["ok"] is False
            assert any("not in sync" in p for p in rows["pod-b"]["problems"])

            code, document = await _verify(policy, admin, "--envoy", "pod-a")
            assert code == 0, document["verdict"]
            assert [row["node"] for row in document["envoys"]] == ["pod-a"]

            # pod-b's link is cut: verify refuses it by name instead of passing without it
            fleet.cut("pod-b")
            code, document = await _verify(policy, admin, "--envoy", "pod-b")
            assert code == 3, document["verdict"]
            assert document["unreachable"] == ["pod-b"]
            assert (
                "pod-b not checked: Envoy pod-b: cannot reach its listener" in (document["verdict"])
            )
            fleet.restore("pod-b")
            relay.released.set()
            await _wait(admins, lambda n: n["pod-b"]["in_sync"], "pod-b catches up")
            code, document = await _verify(policy, admin, "--all-envoys")
            assert code == 0, document["verdict"]
