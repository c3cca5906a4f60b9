"""The delta (incremental) xDS protocol: the pure DeltaState, then whole streams driven through
in-memory queues with the server's own counters (XdsStats)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from google.rpc import status_pb2

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2
from inferway.xds import type_urls
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.delta import DeltaState, resource_versions
from inferway.xds.snapshot import Snapshot
from inferway.xds.stats import XdsStats
from inferway.xds.stream import XdsProtocolError, serve_delta_stream
from tests.xds_sample import build_fleet

CDS, EDS, LDS, RDS = type_urls.CLUSTER, type_urls.ENDPOINT, type_urls.LISTENER, type_urls.ROUTE


BASE = {"a": [9001], "b": [9002], "c": [9003]}


def request(
    type_url: str,
    subscribe: tuple[str, ...] = (),
    *,
    unsubscribe: tuple[str, ...] = (),
    nonce: str = "",
    error: str | None = None,
    initial: dict[str, str] | None = None,
) -> discovery_pb2.DeltaDiscoveryRequest:
    message = discovery_pb2.DeltaDiscoveryRequest(
        type_url=type_url,
        resource_names_subscribe=list(subscribe),
        resource_names_unsubscribe=list(unsubscribe),
        response_nonce=nonce,
        initial_resource_versions=initial or {},
    )
    if error is not None:
        message.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return message


def names(response: discovery_pb2.DeltaDiscoveryResponse) -> list[str]:
    return [r.name for r in response.resources]


def subscribed_state(snapshot: Snapshot) -> tuple[DeltaState, dict[str, str]]:
    """A state that has subscribed to everything (as Envoy does) and ACKed it all."""
    state = DeltaState()
    nonces: dict[str, str] = {}
    for type_url, subscribe in (
        (CDS, ()),
        (EDS, ("a", "b", "c")),
        (LDS, ()),
        (RDS, ("edge",)),
    ):
        step = state.on_request(request(type_url, subscribe), snapshot)
        assert len(step.responses) == 1
        nonces[type_url] = step.responses[0].nonce
        ack = state.on_request(request(type_url, nonce=nonces[type_url]), snapshot)
        assert ack.responses == [] and [a.version for a in ack.acks] == [
            snapshot.versions[type_url]
        ]
    return state, nonces


# -- the pure state machine ---------------------------------------------------------------------


def test_wildcard_cds_sends_every_cluster_and_eds_only_the_subscribed_names() -> None:
    snapshot = build_fleet(BASE)
    state = DeltaState()
    [cds] = state.on_request(request(CDS), snapshot).responses
    assert names(cds) == ["a", "b", "c"]
    assert cds.system_version_info == snapshot.versions[CDS]
    assert all(r.version == resource_versions(snapshot, CDS)[r.name] for r in cds.resources)
    [eds] = state.on_request(request(EDS, ("b",)), snapshot).responses
    assert names(eds) == ["b"] and eds.resources[0].resource.type_url == EDS
    assert eds.nonce != cds.nonce


def test_one_endpoint_change_sends_exactly_that_one_assignment() -> None:
    state, _ = subscribed_state(build_fleet(BASE))
    changed = build_fleet({**BASE, "b": [9002, 9012]})
    step = state.on_snapshot(changed)
    assert [(r.type_url, names(r), list(r.removed_resources)) for r in step.responses] == [
        (EDS, ["b"], [])
    ]
    # the types that did not change for this client are reported in sync, without a response
    assert {a.type_url for a in step.acks} == set()  # CDS/LDS/RDS versions did not change
    assert state.on_snapshot(changed).responses == []


def test_ack_of_newest_response_reports_the_snapshot_type_version() -> None:
    state, _ = subscribed_state(build_fleet(BASE))
    changed = build_fleet({**BASE, "a": [9011]})
    [eds] = state.on_snapshot(changed).responses
    step = state.on_request(request(EDS, nonce=eds.nonce), changed)
    assert [(a.type_url, a.version) for a in step.acks] == [(EDS, changed.versions[EDS])]


def test_changes_go_out_clusters_and_endpoints_before_listeners_and_routes() -> None:
    state, _ = subscribed_state(build_fleet(BASE))
    bigger = build_fleet({**BASE, "a": [9011], "d": [9004]}, listener_port=10001, prefix="/v2")
    responses = state.on_snapshot(bigger).responses
    assert [r.type_url for r in responses] == [CDS, EDS]
    # d is a new cluster; its assignment is sent once Envoy subscribes to it
    assert [names(r) for r in responses] == [["d"], ["a"]]
    step = state.on_request(request(EDS, ("d",)), bigger)
    assert [names(r) for r in step.responses] == [["d"]]
    # listeners and routes go once Envoy answered the cluster update (its clusters are warm)
    step = state.on_request(request(CDS, nonce=responses[0].nonce), bigger)
    assert [(r.type_url, names(r)) for r in step.responses] == [(LDS, ["edge"]), (RDS, ["edge"])]


def test_deleted_service_goes_out_as_removed_resources() -> None:
    state, _ = subscribed_state(build_fleet(BASE))
    smaller = build_fleet({"a": [9001], "b": [9002]})
    responses = {r.type_url: r for r in state.on_snapshot(smaller).responses}
    assert list(responses[CDS].removed_resources) == ["c"] and names(responses[CDS]) == []
    assert list(responses[EDS].removed_resources) == ["c"]
    # Envoy unsubscribes the gone assignment: nothing more to say about it
    assert state.on_request(request(EDS, unsubscribe=("c",)), smaller).responses == []
    assert "c" not in state.client_versions(EDS)


def test_a_nack_is_reported_once_and_the_rejected_version_never_resent() -> None:
    good = build_fleet(BASE)
    state, _ = subscribed_state(good)
    bad = build_fleet({**BASE, "a": [9666]})
    [eds] = state.on_snapshot(bad).responses
    step = state.on_request(request(EDS, nonce=eds.nonce, error="bad endpoint"), bad)
    assert [(n.type_url, n.version, n.message) for n in step.nacks] == [
        (EDS, bad.versions[EDS], "bad endpoint")
    ]
    assert step.responses == [] and step.acks == []
    # the same content again, or a re-request, does not loop the rejected version
    assert state.on_snapshot(bad).responses == []
    assert state.on_request(request(EDS, ("a",)), bad).responses == []
    # a change elsewhere goes out alone; the rejected one stays unsent
    other = build_fleet({**BASE, "a": [9666], "c": [9013]})
    [eds2] = state.on_snapshot(other).responses
    assert names(eds2) == ["c"]
    # ...and a fix of the rejected resource is sent
    fixed = build_fleet({**BASE, "a": [9021], "c": [9013]})
    [eds3] = state.on_snapshot(fixed).responses
    assert names(eds3) == ["a"]
    step = state.on_request(request(EDS, nonce=eds3.nonce), fixed)
    assert [a.version for a in step.acks] == [fixed.versions[EDS]]


def test_reconnect_with_initial_versions_sends_only_what_differs() -> None:
    old = build_fleet(BASE)
    new = build_fleet({**BASE, "c": [9033]})
    have = dict(resource_versions(old, EDS))
    state = DeltaState()
    [eds] = state.on_request(request(EDS, ("a", "b", "c"), initial=have), new).responses
    assert names(eds) == ["c"]
    # a wildcard type whose content the client already holds: answered, but empty
    [cds] = state.on_request(request(CDS, initial=dict(resource_versions(old, CDS))), new).responses
    assert names(cds) == [] and list(cds.removed_resources) == []
    # a client holding something that no longer exists is told to remove it
    state = DeltaState()
    [cds] = state.on_request(
        request(CDS, initial={"gone": "x", **resource_versions(new, CDS)}), new
    ).responses
    assert list(cds.removed_resources) == ["gone"]


def test_resubscribing_a_name_resends_it_and_a_stale_nonce_is_no_ack() -> None:
    snapshot = build_fleet(BASE)
    state, nonces = subscribed_state(snapshot)
    step = state.on_request(request(EDS, ("a",), nonce=nonces[EDS]), snapshot)
    assert step.stale and step.acks == []
    assert [names(r) for r in step.responses] == [["a"]]


def test_explicit_wildcard_and_leaving_it() -> None:
    snapshot = build_fleet(BASE)
    state = DeltaState()
    [eds] = state.on_request(request(EDS, ("*",)), snapshot).responses
    assert names(eds) == ["a", "b", "c"]
    state.on_request(request(EDS, nonce=eds.nonce), snapshot)
    [eds] = state.on_request(request(EDS, ("b",), unsubscribe=("*",)), snapshot).responses
    assert names(eds) == ["b"]
    assert state.subscribed()[EDS] == frozenset({"b"})
    assert state.client_versions(EDS).keys() == {"b"}


def test_a_change_that_does_not_concern_the_client_leaves_it_in_sync() -> None:
    snapshot = build_fleet(BASE)
    state = DeltaState()
    first = state.on_request(request(EDS, ("a",)), snapshot).responses[0]
    state.on_request(request(EDS, nonce=first.nonce), snapshot)
    changed = build_fleet({**BASE, "b": [9099]})
    step = state.on_snapshot(changed)
    assert step.responses == []
    assert [(a.type_url, a.version) for a in step.acks] == [(EDS, changed.versions[EDS])]


def test_no_snapshot_yet_answers_once_it_arrives() -> None:
    state = DeltaState()
    assert state.on_request(request(CDS), None).responses == []
    [cds] = state.on_snapshot(build_fleet(BASE)).responses
    assert names(cds) == ["a", "b", "c"]


# -- whole streams through the in-memory stream interface -----------------------------------------


class DeltaStream:
    """A delta ADS stream as two queues."""

    def __init__(self, cache: SnapshotCache, node_id: str) -> None:
        self.node = base_pb2.Node(id=node_id, cluster="test")
        self.requests: asyncio.Queue[discovery_pb2.DeltaDiscoveryRequest | None] = asyncio.Queue()
        self.responses: asyncio.Queue[discovery_pb2.DeltaDiscoveryResponse] = asyncio.Queue()
        self._first = True
        self.task = asyncio.create_task(serve_delta_stream(self._iterate(), self.send, cache))

    async def _iterate(self) -> AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]:
        while (item := await self.requests.get()) is not None:
            yield item

    async def send(self, response: discovery_pb2.DeltaDiscoveryResponse) -> None:
        await self.responses.put(response)

    def put(self, message: discovery_pb2.DeltaDiscoveryRequest) -> None:
        if self._first:
            message.node.CopyFrom(self.node)
            self._first = False
        self.requests.put_nowait(message)

    async def next(self) -> discovery_pb2.DeltaDiscoveryResponse:
        return await asyncio.wait_for(self.responses.get(), 2.0)

    async def subscribe_and_ack_all(self) -> None:
        for type_url, subscribe in ((CDS, ()), (EDS, ("a", "b", "c")), (LDS, ()), (RDS, ("edge",))):
            self.put(request(type_url, subscribe))
            response = await self.next()
            self.put(request(type_url, nonce=response.nonce))


@pytest.fixture
async def cache_and_stats() -> AsyncIterator[tuple[SnapshotCache, XdsStats, list[DeltaStream]]]:
    cache = SnapshotCache()
    stats = XdsStats()
    cache.add_hook(stats)
    opened: list[DeltaStream] = []
    yield cache, stats, opened
    for stream in opened:
        stream.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await stream.task


async def test_stream_endpoint_change_sends_one_resource_per_client_and_all_ack(
    cache_and_stats,
) -> None:
    cache, stats, opened = cache_and_stats
    cache.set_snapshot(build_fleet(BASE))
    opened.extend(DeltaStream(cache, f"envoy-{i}") for i in range(3))
    for stream in opened:
        await stream.subscribe_and_ack_all()
    assert await cache.wait_for_acks(build_fleet(BASE).version, timeout=2)
    initial = stats.totals(protocol="delta")
    assert initial.responses == 12 and initial.resources == 3 * (3 + 3 + 1 + 1)

    stats.reset()
    changed = build_fleet({**BASE, "b": [9002, 9012]})
    cache.set_snapshot(changed)
    for stream in opened:
        response = await stream.next()
        assert (response.type_url, names(response)) == (EDS, ["b"])
        stream.put(request(EDS, nonce=response.nonce))
    assert await cache.wait_for_acks(changed.version, timeout=2)
    assert stats.totals() == stats.totals(protocol="delta", type_url=EDS)
    eds = stats.totals(type_url=EDS)
    assert (eds.responses, eds.resources, eds.removed) == (3, 3, 0)
    assert 0 < eds.bytes < 3 * 400 and stats.last is not None
    assert stats.last.protocol == "delta" and stats.last.node_id.startswith("envoy-")


async def test_stream_nack_recorded_in_the_cache_once(cache_and_stats) -> None:
    cache, stats, opened = cache_and_stats
    cache.set_snapshot(build_fleet(BASE))
    stream = DeltaStream(cache, "envoy-1")
    opened.append(stream)
    await stream.subscribe_and_ack_all()
    bad = build_fleet({**BASE, "a": [9666]})
    cache.set_snapshot(bad)
    response = await stream.next()
    stream.put(request(EDS, nonce=response.nonce, error="no such host"))
    stream.put(request(EDS, ("a",)))  # re-asking for it must not bring the rejected one back
    stream.put(request("type.googleapis.com/probe", ("p",)))
    assert (await stream.next()).type_url == "type.googleapis.com/probe"
    [nack] = cache.nacks()
    assert (nack.node_id, nack.type_url, nack.version, nack.message) == (
        "envoy-1",
        EDS,
        bad.versions[EDS],
        "no such host",
    )
    status = cache.node_status()[0]
    assert status.last_nack == nack and status.acked[EDS] == build_fleet(BASE).versions[EDS]
    assert stats.totals(type_url=EDS).responses == 2  # the initial one and the rejected one


async def test_delta_stream_without_node_is_a_protocol_error() -> None:
    cache = SnapshotCache()

    async def requests() -> AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]:
        yield request(CDS)

    async def send(_: discovery_pb2.DeltaDiscoveryResponse) -> None:
        raise AssertionError("nothing may be sent")

    with pytest.raises(XdsProtocolError, match=r"node\.id"):
        await serve_delta_stream(requests(), send, cache)


def test_bootstrap_selects_the_ads_protocol() -> None:
    def api_type(**kwargs: str) -> str:
        bootstrap = build_bootstrap(node_id="n", xds_port=18000, admin_port=0, **kwargs)
        return bootstrap["dynamic_resources"]["ads_config"]["api_type"]

    assert api_type() == "GRPC"
    assert api_type(ads="sotw") == "GRPC"
    assert api_type(ads="delta") == "DELTA_GRPC"
    with pytest.raises(ValueError, match="ads must be"):
        api_type(ads="incremental")
