"""Loops decide once on the ``kubernetes://`` store: three replica processes
(tests/fleet_replica.py) elect a leader with a Lease in the in-memory API server, served over
HTTP on loopback (tests/kubernetes_api_http.py) and reached through a kubeconfig, as a real
API server would be: the client's own sockets, watches as open chunked responses. SIGKILL of
the leader mid-run hands over within TTL + 1 s, and the decisions the store holds are one
unbroken sequence, each made once, terms never going back. No real API server runs here:
what its admission, its watch cache and etcd behind it add is not exercised."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from inferway.gateway.fleet.store_url import open_store
from tests.fleet_replica import spawn_replica
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
        replicas = {
            name: spawn_replica(URL, name, TTL, tmp_path / f"{name}.log")
            for name in ("r1", "r2", "r3")
        }
        try:
            deadline = time.monotonic() + 30
            while (first := await store.leader("loops")) is None:
                assert time.monotonic() < deadline, "no replica was elected"
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.5)  # decisions made by the first leader
            os.kill(replicas[first].pid, signal.SIGKILL)
            killed = time.monotonic()
            while (leader := await store.leader("loops")) in (None, first):
                assert time.monotonic() - killed < 3 * TTL, "nobody took over"
                await asyncio.sleep(0.02)
            took = time.monotonic() - killed
            assert took < TTL + 1.0, f"failover took {took:.2f}s"
            await asyncio.sleep(1.5)  # decisions made by the second leader
        finally:
            for process in replicas.values():
                process.kill()
                process.wait(timeout=10)
        decisions = [json.loads(r.value) for r in await store.list("decisions/")]
        await store.close()
        lease = served.api.objects[("leases", "inferway", "election-test-loops")]
    numbers = [d["n"] for d in decisions]
    assert numbers == list(range(1, len(numbers) + 1)), "a decision was skipped or repeated"
    terms = [d["term"] for d in decisions]
    assert terms == sorted(terms), "a deposed leader decided after the new one"
    makers = {d["term"]: d["by"] for d in decisions}
    assert len({d["by"] for d in decisions if d["term"] == terms[0]}) == 1
    assert makers[terms[0]] == first and makers[terms[-1]] == leader
    assert len(set(terms)) == 2 and len(decisions) > 20
    assert lease["spec"]["holderIdentity"] == leader
    assert lease["spec"]["leaseTransitions"] == 1
