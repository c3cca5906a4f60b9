"""Loops decide once on the ``kubernetes://`` store: three replica processes
(tests/fleet_replica.py) elect a leader with a Lease in the in-memory API server, served over
HTTP on loopback (tests/kubernetes_api_http.py) and reached through a kubeconfig, as a real
API server would be: the client's own sockets, watches as open chunked responses. SIGKILL of
the leader mid-run hands over within TTL + 1 s, and the decisions the store holds are one
unbroken sequence, each made once, terms never going back. No real API server runs here:
what its admission, its watch cache and etcd behind it add is not exercised."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from inferway.gateway.fleet.store_url import open_store
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from tests.fleet_replica import assert_handed_over, kill_the_leader
from tests.kubernetes_api_http import ServedApi

TTL = 2.0
URL = "kubernetes://inferway/election-test"


async def test_a_killed_leader_hands_over_within_ttl_and_no_decision_is_made_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with ServedApi(tmp_path) as served:
        monkeypatch.setenv("KUBECONFIG", str(served.kubeconfig))
        store = open_store(URL, workdir=tmp_path)
        try:
            handover = await kill_the_leader(store, URL, TTL, tmp_path)
        finally:
            await store.close()
        lease = served.api.objects[("leases", "inferway", "election-test-loops")]
    assert_handed_over(handover, TTL)
    assert lease["spec"]["holderIdentity"] == handover.leader
    assert lease["spec"]["leaseTransitions"] == 1


POLICY = """version: 1
listeners:
  - {name: edge, address: 127.0.0.1, port: 10000}
services:
  - {name: v1, endpoints: ["127.0.0.1:9"]}
  - {name: v2, endpoints: ["127.0.0.1:9"]}
routes:
  - name: models
    backends:
      - {service: v1, weight: 100}
      - {service: v2, weight: 0}
rollouts:
  - name: v2-rollout
    route: models
    stable: v1
    canary: v2
    steps: [20, 50]
    analysis:
      interval: 1s
      metrics:
        - {name: error-rate, max_increase: 2%}
"""


async def _replica(folder: Path, name: str) -> Gateway:
    token = folder / "admin-token"
    if not token.exists():
        token.write_text("fleet-token\n")
        token.chmod(0o600)
    return await start_gateway(
        GatewayOptions(
            policy_path=folder / "policy.yaml",
            host="127.0.0.1",
            xds_port=0,
            admin_port=0,
            with_envoy=False,
            workdir=folder / name,
            store="kubernetes://inferway/fleet-it",
            replica_id=name,
            lease_ttl_s=2.0,
            stats_push_s=0.5,
            admin_token_file=token,
        )
    )


async def _until(check: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_control_plane_replicas_share_state_and_commands_through_the_api_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``inferway run --no-envoy --store kubernetes://...`` replicas: one leads, any answers
    for the fleet, a command sent to a follower reaches the leader, the leader's decision is
    every replica's, and a replica started on an empty workdir serves it from the start."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    (tmp_path / "policy.yaml").write_text(POLICY)
    with ServedApi(tmp_path) as served:
        monkeypatch.setenv("KUBECONFIG", str(served.kubeconfig))
        replicas = {name: await _replica(tmp_path, name) for name in ("r1", "r2")}
        try:

            def leading() -> list[str]:
                return [n for n, g in replicas.items() if g.fleet and g.fleet.leader.status.leading]

            await _until(lambda: len(leading()) == 1, "no replica leads")
            (leader,) = leading()
            follower = next(n for n in replicas if n != leader)
            async with httpx.AsyncClient(timeout=5) as client:
                url = replicas[follower].admin.url
                headers = {"Authorization": "Bearer fleet-token"}
                seen_from = replicas[follower].fleet
                await _until(lambda: seen_from.current_leader() == leader, "registry")
                status = (await client.get(f"{url}/status", headers=headers)).json()
                assert status["fleet"]["leader"] == leader
                assert {r["id"] for r in status["fleet"]["replicas"]} == {"r1", "r2"}
                assert status["fleet"]["store"]["url"] == "kubernetes://inferway/fleet-it"
                answer = await client.post(f"{url}/rollouts/v2-rollout/pause", headers=headers)
                assert answer.status_code == 200, answer.text
                assert answer.headers["X-Inferway-Forwarded-To"] == leader
            for gateway in replicas.values():
                await _until(
                    lambda g=gateway: g.rollouts.status("v2-rollout")["phase"] == "paused",
                    "the pause did not reach every replica",
                )
            await replicas[leader].stop()
            stopped = time.monotonic()
            await _until(lambda: replicas[follower].fleet.leader.status.leading, "no takeover")
            assert time.monotonic() - stopped < 2.0, "a given-back Lease waited for its expiry"
            replicas[leader] = await _replica(tmp_path, "r3")
            fresh = replicas[leader].rollouts.status("v2-rollout")
            assert fresh["phase"] == "paused", fresh
        finally:
            for gateway in replicas.values():
                await gateway.stop()
    assert served.api.verbs() == {
        "leases": {"get", "create", "update"},
        "configmaps": {"get", "list", "watch", "create", "patch"},
    }
