"""Make-before-break on a snapshot change (xDS protocol, "Eventual consistency considerations"):
clusters and endpoints go out before the listeners and routes that start using them, and a
cluster the routes stop using is removed only after the routes changed, in SotW and delta."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2

from inferway.xds import type_urls
from inferway.xds.delta import DeltaState
from inferway.xds.snapshot import Snapshot
from inferway.xds.sotw import SotwState
from tests.xds_sample import build_fleet

CDS, EDS, LDS, RDS = type_urls.CLUSTER, type_urls.ENDPOINT, type_urls.LISTENER, type_urls.ROUTE

ONE = {"a": [9001]}
TWO = {"a": [9001], "b": [9002]}


def route_target(response: discovery_pb2.DiscoveryResponse) -> str:
    (packed,) = response.resources
    config = route_pb2.RouteConfiguration()
    packed.Unpack(config)
    return config.virtual_hosts[0].routes[0].route.cluster


def cluster_names(response: discovery_pb2.DiscoveryResponse) -> list[str]:
    names = []
    for packed in response.resources:
        cluster = cluster_pb2.Cluster()
        packed.Unpack(cluster)
        names.append(cluster.name)
    return names


def sotw_in_sync(snapshot: Snapshot) -> SotwState:
    """A SotW stream subscribed as Envoy is (CDS/LDS wildcard, EDS/RDS by name), all ACKed."""
    state = SotwState()
    for type_url, names in ((CDS, ()), (EDS, tuple(snapshot.resources_of(EDS))), (LDS, ())):
        (response,) = state.on_request(
            discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=names), snapshot
        ).responses
        ack = discovery_pb2.DiscoveryRequest(
            type_url=type_url, resource_names=names, response_nonce=response.nonce
        )
        assert state.on_request(ack, snapshot).acks
    (response,) = state.on_request(
        discovery_pb2.DiscoveryRequest(type_url=RDS, resource_names=["edge"]), snapshot
    ).responses
    ack = discovery_pb2.DiscoveryRequest(
        type_url=RDS, resource_names=["edge"], response_nonce=response.nonce
    )
    assert state.on_request(ack, snapshot).acks
    return state


def delta_in_sync(snapshot: Snapshot) -> DeltaState:
    state = DeltaState()
    subscriptions = (
        (CDS, ()),
        (EDS, tuple(snapshot.resources_of(EDS))),
        (LDS, ()),
        (RDS, ("edge",)),
    )
    for type_url, names in subscriptions:
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=type_url, resource_names_subscribe=names
        )
        (response,) = state.on_request(request, snapshot).responses
        ack = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=response.nonce)
        assert state.on_request(ack, snapshot).acks
    return state


def test_sotw_removal_goes_out_after_the_route_stops_using_the_cluster() -> None:
    old = build_fleet(TWO, route_cluster="b")
    new = build_fleet(ONE, route_cluster="a")
    responses = sotw_in_sync(old).on_snapshot(new).responses
    order = [r.type_url for r in responses]
    assert order.count(CDS) == 1 and order[-1] == CDS and order.index(RDS) < len(order) - 1
    assert route_target(responses[order.index(RDS)]) == "a"
    assert cluster_names(responses[-1]) == ["a"]


def test_sotw_a_swap_adds_first_keeps_the_old_cluster_then_removes_it() -> None:
    old = build_fleet(TWO, route_cluster="b")
    new = build_fleet({"a": [9001], "c": [9003]}, route_cluster="c")
    responses = sotw_in_sync(old).on_snapshot(new).responses
    order = [r.type_url for r in responses]
    assert order.count(CDS) == 2 and order[0] == CDS and order[-1] == CDS, order
    first_cds, last_cds = responses[0], responses[-1]
    assert cluster_names(first_cds) == ["a", "b", "c"]  # "b" kept while the route uses it
    assert route_target(responses[order.index(RDS)]) == "c"
    assert cluster_names(last_cds) == ["a", "c"]
    assert last_cds.version_info == new.versions[CDS]
    assert first_cds.version_info not in (old.versions[CDS], new.versions[CDS])


def test_sotw_addition_sends_the_cluster_before_the_route_that_uses_it() -> None:
    old = build_fleet(ONE, route_cluster="a")
    new = build_fleet(TWO, route_cluster="b")
    responses = sotw_in_sync(old).on_snapshot(new).responses
    order = [r.type_url for r in responses]
    assert order.count(CDS) == 1 and order.index(CDS) < order.index(RDS), order
    assert cluster_names(responses[0]) == ["a", "b"]


def test_sotw_after_a_rejected_removal_the_kept_cluster_is_what_the_client_holds() -> None:
    old = build_fleet(TWO, route_cluster="b")
    new = build_fleet(ONE, route_cluster="a")
    state = sotw_in_sync(old)
    new = build_fleet({"a": [9001], "c": [9003]}, route_cluster="c")
    responses = state.on_snapshot(new).responses
    last_cds = responses[-1]
    nack = discovery_pb2.DiscoveryRequest(type_url=CDS, response_nonce=last_cds.nonce)
    nack.error_detail.message = "no"
    step = state.on_request(nack, new)
    assert [n.snapshot for n in step.nacks] == [new.version]
    assert step.nacks[0].resource_names == ("a", "c")
    # back to the old snapshot: the client holds "b" (it rejected the removal) and never held
    # "c": one CDS with exactly the old clusters, nothing kept from the rejected one
    back = state.on_snapshot(old).responses
    assert [cluster_names(r) for r in back if r.type_url == CDS] == [["a", "b"]]


def test_delta_removal_goes_routes_first_then_clusters_and_endpoints() -> None:
    old = build_fleet(TWO, route_cluster="b")
    new = build_fleet(ONE, route_cluster="a")
    responses = delta_in_sync(old).on_snapshot(new).responses
    assert [r.type_url for r in responses] == [RDS, CDS, EDS]
    rds, cds, eds = responses
    assert list(cds.removed_resources) == ["b"] and list(eds.removed_resources) == ["b"]
    assert [r.name for r in rds.resources] == ["edge"]


def test_delta_addition_goes_clusters_first_then_routes() -> None:
    old = build_fleet(ONE, route_cluster="a")
    new = build_fleet(TWO, route_cluster="b")
    responses = delta_in_sync(old).on_snapshot(new).responses
    assert [r.type_url for r in responses] == [CDS, RDS]
    assert [r.name for r in responses[0].resources] == ["b"]
    assert not responses[0].removed_resources


def test_delta_nack_names_the_snapshot_and_resources() -> None:
    old = build_fleet(ONE, route_cluster="a")
    new = build_fleet(TWO, route_cluster="b")
    state = delta_in_sync(old)
    cds = state.on_snapshot(new).responses[0]
    nack = discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, response_nonce=cds.nonce)
    nack.error_detail.message = "no"
    (record,) = state.on_request(nack, new).nacks
    assert (record.snapshot, record.resource_names) == (new.version, ("b",))
