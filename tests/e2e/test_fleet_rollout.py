"""One brain for the fleet: two control-plane replicas on a real 3-member etcd, two Envoys on
two hosts (network namespaces, each Envoy on its own port 10000), each Envoy connected to a
different replica, traffic through both. A canary with 10% 5xx is rolled back once, by the
elected replica, judged on both Envoys' counts; the other replica never decides, serves what
the leader decided, and both Envoys carry the same weights at every sample (allowing the push
delay). Then the leader is stopped: the other takes over, and a replica started with an empty
workdir serves the rolled-back weights from its first push."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest

from inferway.gateway.runtime import Gateway
from inferway.xds.bootstrap import build_bootstrap
from tests.e2e.fleet_helpers import (
    FLEET_TOKEN,
    canary_weight,
    fleet_policy,
    start_replica,
    version_backends,
)
from tests.envoy_process import EnvoyProcess
from tests.etcd_cluster import EtcdCluster
from tests.netns import HostFleet, require_netns

pytestmark = pytest.mark.needs_binary("etcd", "a real 3-member etcd cluster")

ZONES = ("zone-a", "zone-b")


async def test_a_bad_canary_is_rolled_back_once_by_the_leader_on_every_envoy(
    tmp_path: Path,
) -> None:
    require_netns()
    with HostFleet(list(ZONES)) as fleet:
        async with AsyncExitStack() as stack:
            cluster = await stack.enter_async_context(EtcdCluster(tmp_path, members=3))
            url = cluster.url + "/fleet-e2e"
            gen = version_backends(fleet.gateway_address, bad_every=10)
            ports = await gen.__anext__()
            stack.push_async_callback(gen.aclose)
            policy = tmp_path / "policy.yaml"
            policy.write_text(fleet_policy(fleet.gateway_address, ports))
            replicas: dict[str, Gateway] = {}
            for name in ("r1", "r2"):
                replicas[name] = await start_replica(
                    policy, tmp_path / name, url, fleet.gateway_address, name
                )
                stack.push_async_callback(replicas[name].stop)
            envoys: dict[str, EnvoyProcess] = {}
            for zone, replica in zip(ZONES, replicas.values(), strict=True):
                bootstrap = build_bootstrap(
                    node_id=f"envoy-{zone}",
                    xds_host=fleet.gateway_address,
                    xds_port=replica.xds.port,
                    admin_port=9901,
                    admin_address="0.0.0.0",
                    locality={"zone": zone},
                    stats_push_s=0.5,
                )
                envoys[zone] = EnvoyProcess(
                    bootstrap,
                    prefix=["ip", "netns", "exec", fleet.namespace(zone)],
                    admin_host=fleet.address(zone),
                )
                await envoys[zone].start(wait="ready", timeout=30)
                stack.callback(envoys[zone].stop)

            samples: list[tuple[float, float | None, float | None]] = []
            failed = {"n": 0}
            done = asyncio.Event()

            async def sample_weights() -> None:
                while not done.is_set():
                    dumps = [await envoys[z].config_dump("dynamic_route_configs") for z in ZONES]
                    samples.append((time.monotonic(), *map(canary_weight, dumps)))
                    await asyncio.sleep(0.1)

            async def traffic() -> None:
                async with httpx.AsyncClient(timeout=5) as client:
                    i = 0
                    while not done.is_set():
                        zone = ZONES[i % 2]
                        i += 1
                        answer = await client.get(f"http://{fleet.address(zone)}:10000/infer")
                        failed["n"] += answer.status_code != 200
                        await asyncio.sleep(0.005)

            tasks = [asyncio.create_task(sample_weights()), asyncio.create_task(traffic())]
            try:
                deadline = time.monotonic() + 60
                while True:
                    statuses = {n: g.rollouts.status("v2-rollout") for n, g in replicas.items()}
                    if all(s["phase"] == "rolled_back" for s in statuses.values()):
                        break
                    assert time.monotonic() < deadline, f"not rolled back: {statuses}"
                    await asyncio.sleep(0.2)
                await asyncio.sleep(1.5)  # the rolled-back weights reach both Envoys
            finally:
                done.set()
                await asyncio.gather(*tasks)

            leaders = [n for n, g in replicas.items() if g.fleet and g.fleet.leader.status.leading]
            assert len(leaders) == 1, leaders
            leader, follower = leaders[0], next(n for n in replicas if n not in leaders)
            history = {n: replicas[n].rollouts.status("v2-rollout")["history"] for n in replicas}
            rollbacks = [d for d in history[leader] if d["action"] == "rollback"]
            assert len(rollbacks) == 1, history[leader]
            assert history[follower] == history[leader], "the follower serves what was decided"
            assert not replicas[follower].rollouts._running, "a follower never ticks"
            # judged on both Envoys' counts
            windows = replicas[leader].fleet.evidence.reports()
            assert set(windows) == {f"envoy-{z}" for z in ZONES}

            # the same weight on both Envoys at every sample, but during a push (<= 1 s)
            apart = [t for t, a, b in samples if a != b]
            longest = 0.0
            start = None
            for t, a, b in samples:
                if a != b and start is None:
                    start = t
                elif a == b and start is not None:
                    longest, start = max(longest, t - start), None
            assert longest <= 1.0, f"the Envoys disagreed for {longest:.2f}s ({len(apart)} samples)"
            assert samples[-1][1] == samples[-1][2] == 0.0, samples[-3:]
            assert any(a not in (None, 0.0) for _, a, _ in samples), "the canary never had traffic"

            # any replica answers for the fleet: status names the leader, the replicas and the
            # Envoys; a command sent to the follower is decided by the leader
            run_before = replicas[leader].rollouts.status("v2-rollout")["run"]
            async with httpx.AsyncClient(timeout=10) as client:
                status = (await client.get(f"{replicas[follower].admin.url}/status")).json()
                assert status["fleet"]["leader"] == leader
                assert {r["id"] for r in status["fleet"]["replicas"]} == {"r1", "r2"}
                assert {e["node"] for e in status["fleet"]["envoys"]} == {
                    f"envoy-{z}" for z in ZONES
                }
                assert status["fleet"]["store"]["ok"] is True
                answer = await client.post(
                    f"{replicas[follower].admin.url}/rollouts/v2-rollout/restart",
                    headers={"Authorization": f"Bearer {FLEET_TOKEN}"},
                )
                assert answer.status_code == 200, answer.text
                assert answer.headers["X-Inferway-Forwarded-To"] == leader
            deadline = time.monotonic() + 5
            while replicas[follower].rollouts.status("v2-rollout")["phase"] == "rolled_back":
                assert time.monotonic() < deadline, "the follower never saw the restart"
                await asyncio.sleep(0.05)
            assert replicas[leader].rollouts.status("v2-rollout")["run"] == run_before + 1

            # the leader goes: the other takes over; a fresh replica serves the fleet's weights
            await replicas[leader].stop()
            deadline = time.monotonic() + 10
            while not replicas[follower].fleet.leader.status.leading:
                assert time.monotonic() < deadline, "no takeover"
                await asyncio.sleep(0.05)
            fresh = await start_replica(
                policy, tmp_path / "fresh", url, fleet.gateway_address, "r3"
            )
            stack.push_async_callback(fresh.stop)
            expected = replicas[follower].rollouts.status("v2-rollout")
            served = fresh.rollouts.status("v2-rollout")
            assert (served["phase"], served["run"]) == (expected["phase"], expected["run"])
            assert (
                fresh.control_plane.state.weights == replicas[follower].control_plane.state.weights
            )
