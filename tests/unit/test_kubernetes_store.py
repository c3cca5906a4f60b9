"""The ``kubernetes://`` store against an in-memory API server behind the official client's
HTTP pool (tests/kubernetes_api.py): the same contract as the file and etcd stores
(tests/store_contract.py), then what is the Kubernetes store's own: a Lease that runs out, a
leader cut off from the API server, the per-record fence closing the window between the
Lease's read and the record's write, a watch from a compacted version, RBAC refusals that
say what to grant. No API server runs here: this is the client boundary, not a cluster."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import AsyncIterator

import pytest
from kubernetes.client.exceptions import ApiException

from inferway.gateway.fleet.kubernetes_objects import (
    MAX_VALUE_BYTES,
    config_map_name,
    group_of,
    lease_name,
    micro_time,
    selector,
)
from inferway.gateway.fleet.kubernetes_store import KubernetesStore
from inferway.gateway.fleet.store import FencedError, StoreUnavailableError
from tests.kubernetes_api import FakeApiServer, FakePool
from tests.store_contract import TTL, compare_and_set, election_and_fencing, watch_after_a_version

NAMESPACE = "inferway"


def open_replica(server: FakeApiServer) -> tuple[KubernetesStore, FakePool]:
    core, coordination, pool = server.client()
    return KubernetesStore(core, coordination, NAMESPACE, "test", watch_s=2), pool


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    running = FakeApiServer()
    yield running
    running.shut_down()


@pytest.fixture
async def replicas(server: FakeApiServer) -> AsyncIterator[list[tuple[KubernetesStore, FakePool]]]:
    opened = [open_replica(server) for _ in range(2)]
    yield opened
    for store, _ in opened:
        await store.close()


# -- the contract every store keeps --------------------------------------------------------


async def test_a_compare_and_set_write_needs_the_version_it_read(
    replicas: list[tuple[KubernetesStore, FakePool]],
) -> None:
    (a, _), (b, _) = replicas
    await compare_and_set(a, b)


async def test_a_watch_sees_every_write_after_the_version_it_starts_from(
    replicas: list[tuple[KubernetesStore, FakePool]],
) -> None:
    (a, _), (b, _) = replicas
    await watch_after_a_version(a, b)


async def test_one_replica_leads_and_a_deposed_leaders_writes_are_refused(
    replicas: list[tuple[KubernetesStore, FakePool]],
) -> None:
    (a, _), (b, _) = replicas
    await election_and_fencing(a, b)


# -- the Lease ------------------------------------------------------------------------------


async def test_the_lease_says_who_holds_it_for_how_long_and_each_takeover_counts(
    server: FakeApiServer, replicas: list[tuple[KubernetesStore, FakePool]]
) -> None:
    (a, _), (b, _) = replicas
    first = await a.campaign("loops", "replica-a", TTL)
    lease = server.objects[("leases", NAMESPACE, "test-loops")]
    assert lease["spec"]["holderIdentity"] == "replica-a"
    assert lease["spec"]["leaseDurationSeconds"] == 2
    assert lease["spec"]["leaseTransitions"] == 0
    assert first.fence.term == int(lease["metadata"]["resourceVersion"])
    await a.resign(first)
    assert server.objects[("leases", NAMESPACE, "test-loops")]["spec"]["holderIdentity"] == ""
    second = await asyncio.wait_for(b.campaign("loops", "replica-b", TTL), 5)
    lease = server.objects[("leases", NAMESPACE, "test-loops")]
    assert lease["spec"]["leaseTransitions"] == 1
    assert second.fence.term > first.fence.term


async def test_a_killed_leaders_lease_runs_out_and_another_takes_over_within_ttl_plus_1s(
    replicas: list[tuple[KubernetesStore, FakePool]],
) -> None:
    (a, _), (b, _) = replicas
    await a.campaign("loops", "replica-a", TTL)
    a.leases.close()  # a process killed: its renewals stop, nothing is given back
    killed = time.monotonic()
    led = await asyncio.wait_for(b.campaign("loops", "replica-b", TTL), 10)
    took = time.monotonic() - killed
    assert led.fence.identity == "replica-b"
    assert TTL - 0.5 < took < TTL + 1.0, f"failover took {took:.2f}s"


async def test_a_leader_cut_off_from_the_api_server_stops_deciding_before_another_starts(
    replicas: list[tuple[KubernetesStore, FakePool]],
) -> None:
    (a, a_pool), (b, _) = replicas
    leadership = await a.campaign("loops", "replica-a", TTL)
    a_pool.cut = True
    cut = time.monotonic()
    led = await asyncio.wait_for(b.campaign("loops", "replica-b", TTL), 10)
    won_at = time.monotonic()
    assert leadership.lost.is_set(), "the new leader started while the old one still decided"
    assert "not renewed" in leadership.reason
    assert won_at - cut < TTL + 1.0, f"b waited {won_at - cut:.2f}s"
    a_pool.cut = False
    with pytest.raises(FencedError):
        await a.put("decisions/late", b"x", fence=leadership.fence)
    await b.put("decisions/next", b"y", fence=led.fence)


@pytest.mark.parametrize("verb", ["get", "patch"])
async def test_a_lease_taken_between_the_leases_read_and_the_records_write_still_fences(
    server: FakeApiServer, replicas: list[tuple[KubernetesStore, FakePool]], verb: str
) -> None:
    """Kubernetes has no transaction over the Lease and the record: the term the record
    carries, written conditionally on its resourceVersion, refuses the deposed leader's write
    when the new leader took the Lease and wrote the record after the old one read the Lease
    (``get``: before the old one reads the record; ``patch``: between its read and write)."""
    (a, _), (b, _) = replicas
    loop = asyncio.get_running_loop()
    first = await a.campaign("loops", "replica-a", TTL)
    await a.put("rollouts/model", b"a: step 1", fence=first.fence)

    async def takeover() -> None:
        await a.resign(first)
        second = await b.campaign("loops", "replica-b", TTL)
        await b.put("rollouts/model", b"b: step 2", fence=second.fence)

    def take_over_now() -> None:  # in a's client thread, while a's write waits on it
        asyncio.run_coroutine_threadsafe(takeover(), loop).result(10)

    server.before(verb, "configmaps", take_over_now)
    with pytest.raises(FencedError, match=r"term \d+ wrote it after replica-a's term"):
        await a.put("rollouts/model", b"a: step 2", fence=first.fence)
    got = await b.get("rollouts/model")
    assert got is not None and got.value == b"b: step 2"
    assert not server.hooks, "the takeover did not happen where the test put it"


# -- records --------------------------------------------------------------------------------


async def follow(store: KubernetesStore, prefix: str, after: int, count: int) -> list[bytes]:
    seen: list[bytes] = []
    async for record in store.watch(prefix, after=after):
        seen.append(record.value)
        if len(seen) == count:
            break
    return seen


async def test_a_watch_from_a_compacted_version_lists_again_and_hands_on_each_keys_latest(
    server: FakeApiServer, replicas: list[tuple[KubernetesStore, FakePool]]
) -> None:
    (a, _), (b, _) = replicas
    start = await a.put("state/weights", b"90/10")
    await a.put("state/weights", b"50/50")
    await a.put("state/phase", b"promoted")
    await a.put("other/x", b"not under state/")
    server.compact()
    watching = asyncio.create_task(follow(b, "state/", start.version, 3))
    await asyncio.sleep(0.3)
    await a.put("state/weights", b"0/100")
    assert await asyncio.wait_for(watching, 10) == [b"50/50", b"promoted", b"0/100"]
    assert server.verbs()["configmaps"] >= {"list", "watch"}


async def test_a_watch_from_zero_starts_with_what_is_there_and_outlives_a_broken_connection(
    replicas: list[tuple[KubernetesStore, FakePool]],
) -> None:
    (a, _), (b, b_pool) = replicas
    await a.put("evidence/node-1", b"1")
    watching = asyncio.create_task(follow(b, "evidence/", 0, 3))
    await asyncio.sleep(0.3)
    b_pool.cut = True
    await a.put("evidence/node-1", b"2")
    await asyncio.sleep(2.5)  # the watch request ends (watch_s=2) and cannot be renewed
    b_pool.cut = False
    await a.put("evidence/node-2", b"3")
    assert await asyncio.wait_for(watching, 10) == [b"1", b"2", b"3"]


async def test_records_are_one_labelled_configmap_each_holding_the_exact_bytes(
    server: FakeApiServer, replicas: list[tuple[KubernetesStore, FakePool]]
) -> None:
    (a, _), _ = replicas
    value = bytes(range(256))
    written = await a.put("evidence/Node_A:9000", value)
    name = config_map_name("test", "evidence/Node_A:9000")
    stored = server.objects[("configmaps", NAMESPACE, name)]
    assert stored["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "inferway",
        "inferway.io/store": "test",
        "inferway.io/group": "evidence",
    }
    assert stored["metadata"]["annotations"]["inferway.io/key"] == "evidence/Node_A:9000"
    assert written.version == int(stored["metadata"]["resourceVersion"])
    got = await a.get("evidence/Node_A:9000")
    assert got is not None and got.value == value
    with pytest.raises(ValueError, match=f"values up to {MAX_VALUE_BYTES}"):
        await a.put("evidence/huge", b"x" * (MAX_VALUE_BYTES + 1))
    await a.put("evidence/largest", b"x" * MAX_VALUE_BYTES)  # the API server takes it


async def test_a_plain_write_keeps_the_term_a_leader_wrote(
    server: FakeApiServer, replicas: list[tuple[KubernetesStore, FakePool]]
) -> None:
    (a, _), (b, _) = replicas
    first = await a.campaign("loops", "replica-a", TTL)
    await a.put("rollouts/model", b"1", fence=first.fence)
    await b.put("rollouts/model", b"2")  # an operator's or a tool's unfenced write
    stored = server.objects[("configmaps", NAMESPACE, config_map_name("test", "rollouts/model"))]
    assert stored["metadata"]["annotations"]["inferway.io/term"] == str(first.fence.term)


async def test_a_refusal_by_rbac_says_what_to_grant(
    replicas: list[tuple[KubernetesStore, FakePool]],
) -> None:
    (a, a_pool), _ = replicas
    a_pool.forbidden.add(("patch", "configmaps"))
    with pytest.raises(StoreUnavailableError, match="create and patch on configmaps"):
        await a.put("replicas/a", b"{}")
    a_pool.cut = True
    health = await a.health()
    assert not health.ok and "ProtocolError" in health.detail
    a_pool.cut = False
    health = await a.health()
    assert health.ok and health.url == "kubernetes://inferway/test"
    assert health.members == ("https://kubernetes.fake ok",)


async def test_leader_is_none_once_the_lease_is_older_than_its_duration(
    server: FakeApiServer, replicas: list[tuple[KubernetesStore, FakePool]]
) -> None:
    (a, _), (b, _) = replicas
    assert await b.leader("loops") is None
    await a.campaign("loops", "replica-a", TTL)
    a.leases.close()
    assert await b.leader("loops") == "replica-a"
    lease = server.objects[("leases", NAMESPACE, "test-loops")]
    old = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=3)
    lease["spec"]["renewTime"] = old.isoformat()
    assert await b.leader("loops") is None


# -- names, labels, times -------------------------------------------------------------------


def test_object_names_are_valid_and_distinct_and_groups_select_by_first_segment() -> None:
    names = {config_map_name("inferway", k) for k in ("a/b", "a.b", "A/B", "a-b", "a/b/")}
    assert len(names) == 5
    for name in names:
        assert len(name) <= 253 and name.startswith("inferway-")
    long = config_map_name("inferway", "evidence/" + "x" * 500)
    assert len(long) < 100
    assert lease_name("inferway", "loops") == "inferway-loops"
    assert lease_name("inferway", "Loops!").startswith("inferway-loops-")
    assert group_of("rollouts/model") == "rollouts"
    assert group_of("rollouts") is None
    assert group_of("bad group!/x") is not None and "!" not in (group_of("bad group!/x") or "")
    assert (
        selector("inferway", "rollouts/") == "inferway.io/store=inferway,inferway.io/group=rollouts"
    )
    assert selector("inferway", "roll") == "inferway.io/store=inferway"


def test_a_lease_time_always_has_the_six_fraction_digits_the_api_server_parses() -> None:
    on_the_second = dt.datetime(2026, 12, 6, 1, 2, 3, tzinfo=dt.UTC)
    assert on_the_second.isoformat() == "2026-12-06T01:02:03+00:00"  # what the client would send
    assert micro_time(on_the_second).isoformat() == "2026-12-06T01:02:03.000001+00:00"


async def test_the_fake_api_server_refuses_what_the_real_one_refuses(server: FakeApiServer) -> None:
    """The fake is only worth its tests if it says no where the API server does."""
    core, coordination, _ = server.client()

    lease = {"metadata": {"name": "l"}, "spec": {"renewTime": "2026-12-06T01:02:03+00:00"}}
    with pytest.raises(ApiException) as refused:
        coordination.create_namespaced_lease(NAMESPACE, lease)
    assert refused.value.status == 400
    made = core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "c"}})
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "c"}})
    assert (
        refused.value.status == 409 and json.loads(refused.value.body)["reason"] == "AlreadyExists"
    )
    stale = {"metadata": {"resourceVersion": str(int(made.metadata.resource_version) - 1)}}
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_config_map(
            "c", NAMESPACE, stale, _content_type="application/merge-patch+json"
        )
    assert refused.value.status == 409 and json.loads(refused.value.body)["reason"] == "Conflict"
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "Not_A_Name"}})
    assert refused.value.status == 422


async def test_a_slow_api_server_never_blocks_the_event_loop(
    server: FakeApiServer, replicas: list[tuple[KubernetesStore, FakePool]]
) -> None:
    (a, _), _ = replicas
    server.before("patch", "configmaps", lambda: time.sleep(0.5))  # the client's call blocks
    lags: list[float] = []

    async def tick() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)

    ticker = asyncio.create_task(tick())
    await a.put("replicas/a", b"{}")
    ticker.cancel()
    assert len(lags) > 20 and max(lags) < 0.2, f"the loop stalled {max(lags):.3f}s"
