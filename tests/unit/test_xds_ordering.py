"""Make-before-break on a snapshot change (xDS protocol, "Eventual consistency considerations"):
clusters and endpoints go out before the listeners and routes that start using them, and a
cluster the routes stop using is removed only after the routes changed, in SotW and delta."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2
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


def sotw_drive(state: SotwState, snapshot: Snapshot) -> list[list[discovery_pb2.DiscoveryResponse]]:
    """Push ``snapshot`` and answer every response as Envoy does (ACK, in order), returning
    the responses stage by stage: each stage is what one event (the push, an ACK) sent."""
    stages = [state.on_snapshot(snapshot).responses]
    queue = list(stages[0])
    while queue:
        response = queue.pop(0)
        names = () if response.type_url in (CDS, LDS) else state.subscribed()[response.type_url]
        ack = discovery_pb2.DiscoveryRequest(
            type_url=response.type_url,
            resource_names=sorted(names or ()),
            response_nonce=response.nonce,
        )
        sent = state.on_request(ack, snapshot).responses
        if sent:
            stages.append(sent)
            queue += sent
    assert not state.waiting
    return stages


def flat(stages: list[list[discovery_pb2.DiscoveryResponse]]) -> list[str]:
    return [r.type_url for stage in stages for r in stage]


def test_sotw_removal_goes_out_after_the_route_stops_using_the_cluster() -> None:
    old = build_fleet(TWO, route_cluster="b")
    new = build_fleet(ONE, route_cluster="a")
    stages = sotw_drive(sotw_in_sync(old), new)
    assert flat(stages) == [EDS, RDS, CDS], flat(stages)
    assert [len(stage) for stage in stages] == [2, 1]  # CDS only after the RDS answer
    assert route_target(stages[0][1]) == "a"
    assert cluster_names(stages[1][0]) == ["a"]


def test_sotw_a_swap_adds_first_keeps_the_old_cluster_then_removes_it() -> None:
    old = build_fleet(TWO, route_cluster="b")
    new = build_fleet({"a": [9001], "c": [9003]}, route_cluster="c")
    stages = sotw_drive(sotw_in_sync(old), new)
    assert flat(stages) == [CDS, EDS, RDS, CDS], flat(stages)
    assert [[r.type_url for r in stage] for stage in stages] == [[CDS, EDS], [RDS], [CDS]]
    first_cds, rds, last_cds = stages[0][0], stages[1][0], stages[2][0]
    assert cluster_names(first_cds) == ["a", "b", "c"]  # "b" kept while the route uses it
    assert route_target(rds) == "c"
    assert cluster_names(last_cds) == ["a", "c"]
    assert last_cds.version_info == new.versions[CDS]
    assert first_cds.version_info not in (old.versions[CDS], new.versions[CDS])


def test_sotw_addition_sends_the_cluster_before_the_route_that_uses_it() -> None:
    old = build_fleet(ONE, route_cluster="a")
    new = build_fleet(TWO, route_cluster="b")
    state = sotw_in_sync(old)
    stages = sotw_drive(state, new)
    assert [[r.type_url for r in stage] for stage in stages] == [[CDS, EDS], [RDS]]
    assert cluster_names(stages[0][0]) == ["a", "b"]


def test_sotw_a_client_that_does_not_answer_gets_the_held_stage_on_release() -> None:
    old = build_fleet(ONE, route_cluster="a")
    new = build_fleet(TWO, route_cluster="b")
    state = sotw_in_sync(old)
    assert [r.type_url for r in state.on_snapshot(new).responses] == [CDS, EDS]
    assert state.waiting
    assert [r.type_url for r in state.release().responses] == [RDS]
    assert not state.waiting


def test_sotw_after_a_rejected_removal_the_kept_cluster_is_what_the_client_holds() -> None:
    old = build_fleet(TWO, route_cluster="b")
    state = sotw_in_sync(old)
    new = build_fleet({"a": [9001], "c": [9003]}, route_cluster="c")
    union = state.on_snapshot(new).responses[0]
    nack = discovery_pb2.DiscoveryRequest(type_url=CDS, response_nonce=union.nonce)
    nack.error_detail.message = "no"
    step = state.on_request(nack, new)
    assert [n.snapshot for n in step.nacks] == [new.version]
    assert step.nacks[0].resource_names == ("a", "b", "c")
    # back to the old snapshot: the client holds what it ACKed before, "c" is not kept
    back = sotw_drive(state, old)
    assert [cluster_names(r) for stage in back for r in stage if r.type_url == CDS] == [["a", "b"]]


def delta_drive(
    state: DeltaState, snapshot: Snapshot
) -> list[list[discovery_pb2.DeltaDiscoveryResponse]]:
    """``sotw_drive`` for delta: push, then ACK every response in order."""
    stages = [state.on_snapshot(snapshot).responses]
    queue = list(stages[0])
    while queue:
        response = queue.pop(0)
        ack = discovery_pb2.DeltaDiscoveryRequest(
            type_url=response.type_url, response_nonce=response.nonce
        )
        sent = state.on_request(ack, snapshot).responses
        if sent:
            stages.append(sent)
            queue += sent
    assert not state.waiting
    return stages


def test_delta_removal_goes_routes_first_then_clusters_and_endpoints() -> None:
    old = build_fleet(TWO, route_cluster="b")
    new = build_fleet(ONE, route_cluster="a")
    stages = delta_drive(delta_in_sync(old), new)
    assert [[r.type_url for r in stage] for stage in stages] == [[RDS], [CDS, EDS]]
    (rds,), (cds, eds) = stages
    assert list(cds.removed_resources) == ["b"] and list(eds.removed_resources) == ["b"]
    assert [r.name for r in rds.resources] == ["edge"]


def test_delta_addition_goes_clusters_first_then_routes() -> None:
    old = build_fleet(ONE, route_cluster="a")
    new = build_fleet(TWO, route_cluster="b")
    stages = delta_drive(delta_in_sync(old), new)
    assert [[r.type_url for r in stage] for stage in stages] == [[CDS], [RDS]]
    assert [r.name for r in stages[0][0].resources] == ["b"]
    assert not stages[0][0].removed_resources


def test_delta_a_swap_adds_routes_then_removes() -> None:
    old = build_fleet(TWO, route_cluster="b")
    new = build_fleet({"a": [9001], "c": [9003]}, route_cluster="c")
    stages = delta_drive(delta_in_sync(old), new)
    assert [[r.type_url for r in stage] for stage in stages] == [[CDS], [RDS], [CDS, EDS]]
    assert [r.name for r in stages[0][0].resources] == ["c"]
    assert not stages[0][0].removed_resources
    assert list(stages[2][0].removed_resources) == ["b"]


def test_delta_a_client_that_does_not_answer_gets_the_held_stage_on_release() -> None:
    old = build_fleet(ONE, route_cluster="a")
    new = build_fleet(TWO, route_cluster="b")
    state = delta_in_sync(old)
    assert [r.type_url for r in state.on_snapshot(new).responses] == [CDS]
    assert state.waiting
    assert [r.type_url for r in state.release().responses] == [RDS]
    assert not state.waiting


def test_delta_nack_names_the_snapshot_and_resources() -> None:
    old = build_fleet(ONE, route_cluster="a")
    new = build_fleet(TWO, route_cluster="b")
    state = delta_in_sync(old)
    cds = state.on_snapshot(new).responses[0]
    nack = discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, response_nonce=cds.nonce)
    nack.error_detail.message = "no"
    (record,) = state.on_request(nack, new).nacks
    assert (record.snapshot, record.resource_names) == (new.version, ("b",))


def test_after_a_cluster_nack_the_held_routes_wait_for_the_cache_to_decide() -> None:
    old = build_fleet(ONE, route_cluster="a")
    new = build_fleet(TWO, route_cluster="b")
    sotw = sotw_in_sync(old)
    cds = sotw.on_snapshot(new).responses[0]
    nack = discovery_pb2.DiscoveryRequest(type_url=CDS, response_nonce=cds.nonce)
    nack.error_detail.message = "bad cluster b"
    step = sotw.on_request(nack, new)
    assert step.nacks and step.responses == []  # no route to the rejected cluster goes out
    delta = delta_in_sync(old)
    cds = delta.on_snapshot(new).responses[0]
    dnack = discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, response_nonce=cds.nonce)
    dnack.error_detail.message = "bad cluster b"
    step = delta.on_request(dnack, new)
    assert step.nacks and step.responses == []
    # the cache goes back to the old snapshot: nothing left to send for routes
    assert [r.type_url for r in delta.on_snapshot(old).responses] == [CDS]
