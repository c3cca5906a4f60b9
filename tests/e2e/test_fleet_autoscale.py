"""The autoscaler decides once, on the fleet's load: two control-plane replicas on a real
3-member etcd, three Envoys on three hosts (network namespaces, each Envoy on its own port
10000, two connected to one replica and one to the other), paced traffic through two of them
only. The leader's input rate equals the offered rate within 10%, each decision names the
Envoys it came from and is recorded in the store with its sequence number; only the leader
publishes ``inferway_autoscale_desired_replicas`` and ``GET /autoscale`` answers the same from
both replicas. When the leader goes, the other continues the same sequence (no number taken
twice) from the state in the store."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.xds.bootstrap import build_bootstrap
from tests.envoy_process import EnvoyProcess, free_port
from tests.etcd_cluster import EtcdCluster
from tests.netns import HostFleet, require_netns

pytestmark = pytest.mark.needs_binary("etcd", "a real 3-member etcd cluster")

HOSTS = ("zone-a", "zone-b", "zone-c")
RATE = 40.0
"""Offered requests per second, split over zone-a and zone-b (zone-c carries none)."""


def _policy(host: str, port: int) -> str:
    return f"""version: 1
listeners:
  - {{name: edge, address: 0.0.0.0, port: 10000}}
services:
  - name: model
    endpoints: ["{host}:{port}"]
    autoscale:
      scale_target: metric
      algorithm: proportional
      metric: request_rate
      target: 10
      sampling_interval: 2
      min_replicas: 1
      max_replicas: 20
      cooldown: {{up: 0, down: 0}}
      stabilization: {{up: 0, down: 0}}
      panic: {{enabled: false}}
routes:
  - {{name: models, backends: [{{service: model}}]}}
"""


async def _backend(host: str) -> AsyncIterator[int]:
    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, host, port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


async def _replica(policy: Path, workdir: Path, url: str, host: str, name: str) -> Gateway:
    token = policy.parent / "admin-token"
    if not token.exists():
        token.write_text("fleet-token\n")
        token.chmod(0o600)
    return await start_gateway(
        GatewayOptions(
            policy_path=policy,
            host=host,
            xds_port=0,
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


async def _paced(addresses: list[str], rate: float, seconds: float) -> tuple[int, int, float]:
    """``rate`` requests per second for ``seconds``, alternating over ``addresses``; (sent,
    answered 200, elapsed)."""
    ok = {"n": 0}
    async with httpx.AsyncClient(timeout=5) as client:

        async def one(url: str) -> None:
            answer = await client.get(url)
            ok["n"] += answer.status_code == 200

        start = time.monotonic()
        tasks = []
        i = 0
        while (at := i / rate) < seconds:
            await asyncio.sleep(max(start + at - time.monotonic(), 0))
            url = f"http://{addresses[i % len(addresses)]}:10000/infer"
            tasks.append(asyncio.create_task(one(url)))
            i += 1
        await asyncio.gather(*tasks)
        return i, ok["n"], time.monotonic() - start


async def test_the_leader_scales_on_the_fleets_offered_rate(tmp_path: Path) -> None:
    require_netns()
    with HostFleet(list(HOSTS)) as hosts:
        async with AsyncExitStack() as stack:
            cluster = await stack.enter_async_context(EtcdCluster(tmp_path, members=3))
            url = cluster.url + "/fleet-autoscale"
            gen = _backend(hosts.gateway_address)
            port = await gen.__anext__()
            stack.push_async_callback(gen.aclose)
            policy = tmp_path / "policy.yaml"
            policy.write_text(_policy(hosts.gateway_address, port))
            replicas: dict[str, Gateway] = {}
            for name in ("r1", "r2"):
                replicas[name] = await _replica(
                    policy, tmp_path / name, url, hosts.gateway_address, name
                )
                stack.push_async_callback(replicas[name].stop)
            for host, replica in zip(HOSTS, ("r1", "r1", "r2"), strict=True):
                bootstrap = build_bootstrap(
                    node_id=f"envoy-{host}",
                    xds_host=hosts.gateway_address,
                    xds_port=replicas[replica].xds.port,
                    admin_port=9901,
                    admin_address="0.0.0.0",
                    locality={"zone": host},
                    stats_push_s=0.5,
                )
                envoy = EnvoyProcess(
                    bootstrap,
                    prefix=["ip", "netns", "exec", hosts.namespace(host)],
                    admin_host=hosts.address(host),
                )
                await envoy.start(wait="ready", timeout=30)
                stack.callback(envoy.stop)

            def leader_name() -> str | None:
                found = [
                    n for n, g in replicas.items() if g.fleet and g.fleet.leader.status.leading
                ]
                return found[0] if len(found) == 1 else None

            deadline = time.monotonic() + 15
            while leader_name() is None or any(
                len(g.fleet.evidence.reports()) < 3 for g in replicas.values()
            ):
                assert time.monotonic() < deadline, "no leader, or not every Envoy reports"
                await asyncio.sleep(0.1)
            leader = leader_name()
            assert leader is not None
            follower = next(n for n in replicas if n != leader)

            addresses = [hosts.address("zone-a"), hosts.address("zone-b")]
            started = time.time()
            sent, answered, elapsed = await _paced(addresses, RATE, 16.0)
            assert answered == sent, f"{sent - answered} of {sent} requests failed"
            offered = sent / elapsed
            await asyncio.sleep(2.5)  # the last pushes and one more decision

            history = list(replicas[leader].autoscale.history)
            steady = [
                d
                for d in history
                if started + 4 <= d["wall_time"] <= started + elapsed
                and d["inputs"].get("request_rate") is not None
            ]
            assert len(steady) >= 4, history
            rates = [d["inputs"]["request_rate"] for d in steady]
            measured = sum(rates) / len(rates)
            print(f"offered {offered:.2f} req/s, autoscaler input {measured:.2f} req/s, {rates}")
            assert abs(measured - offered) <= 0.10 * offered, (offered, rates)
            for d in steady:  # who contributed: the two Envoys with traffic, c with none
                contributors = d["envoys"]["contributors"]
                assert set(contributors) == {f"envoy-{h}" for h in HOSTS}, contributors
                assert contributors["envoy-zone-c"]["requests"] == 0
                assert d["by"] == leader
            assert steady[-1]["desired"] == 4, steady[-1]["reason"]
            assert not replicas[follower].autoscale.history, "a follower never decides"
            seqs = [d["seq"] for d in history]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs

            async with httpx.AsyncClient(timeout=10) as client:
                metrics = {
                    n: (await client.get(f"{g.admin.url}/metrics")).text
                    for n, g in replicas.items()
                }
                assert 'inferway_autoscale_desired_replicas{service="model"}' in metrics[leader]
                assert "inferway_autoscale_desired_replicas{" not in metrics[follower]
                shown = {
                    n: await client.get(f"{g.admin.url}/autoscale") for n, g in replicas.items()
                }
                assert shown[follower].headers["X-Inferway-Forwarded-To"] == leader
                documents = {n: a.json() for n, a in shown.items()}
                assert documents[follower]["decisions"][-1]["seq"] >= seqs[-1]
                assert [s["scale_target"] for s in documents[follower]["services"]] == [
                    s["scale_target"] for s in documents[leader]["services"]
                ]

            # the leader goes: the follower continues the same sequence from the store
            await replicas[leader].stop()
            last = replicas[leader].autoscale.history[-1]
            stored = await replicas[follower].fleet.store.get("autoscale/model")
            assert stored is not None and json.loads(stored.value)["seq"] >= last["seq"]
            deadline = time.monotonic() + 10
            while not replicas[follower].autoscale.history:
                assert time.monotonic() < deadline, "the new leader never decided"
                await asyncio.sleep(0.1)
            first = replicas[follower].autoscale.history[0]
            assert first["seq"] == last["seq"] + 1, (first["seq"], last["seq"])
            assert first["by"] == follower and first["term"] > last["term"]
