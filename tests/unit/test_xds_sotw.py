"""SotwState as a pure value machine: no asyncio, no cache, injected nonces."""

from __future__ import annotations

from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2
from inferway.xds import type_urls
from inferway.xds.snapshot import build_snapshot
from inferway.xds.sotw import SotwState, counter_nonces
from tests.xds_sample import build_sample_resources

CDS, EDS, RDS = type_urls.CLUSTER, type_urls.ENDPOINT, type_urls.ROUTE


def request(type_url: str, *names: str, nonce: str = "") -> discovery_pb2.DiscoveryRequest:
    return discovery_pb2.DiscoveryRequest(
        type_url=type_url, resource_names=list(names), response_nonce=nonce
    )


def test_a_subscription_made_before_any_snapshot_is_answered_when_one_arrives() -> None:
    state = SotwState(counter_nonces("s-"))
    assert state.on_request(request(CDS), None).responses == []
    snapshot = build_snapshot(build_sample_resources(listener_port=1, backend_ports=[2]))
    (response,) = state.on_snapshot(snapshot).responses
    assert (response.type_url, response.nonce) == (CDS, "s-1")
    assert state.on_snapshot(snapshot).responses == []  # already sent


def test_wildcard_and_explicit_subscriptions() -> None:
    state = SotwState()
    snapshot = build_snapshot(build_sample_resources(listener_port=1, backend_ports=[2]))
    state.on_request(request(CDS, "*"), snapshot)
    state.on_request(request(EDS), snapshot)  # EDS with no names subscribes to nothing
    state.on_request(request(RDS, "missing"), snapshot)
    assert state.subscribed() == {CDS: None, EDS: frozenset(), RDS: frozenset({"missing"})}
    step = state.on_request(request(EDS, "backend", nonce=""), snapshot)
    assert [len(r.resources) for r in step.responses] == [1]


def test_stale_request_changes_nothing() -> None:
    state = SotwState()
    snapshot = build_snapshot(build_sample_resources(listener_port=1, backend_ports=[2]))
    state.on_request(request(CDS), snapshot)
    step = state.on_request(request(CDS, "other", nonce="999"), snapshot)
    assert step.stale and step.responses == [] and step.acks == []
    assert state.subscribed() == {CDS: None}
