"""Where an Envoy's listeners are reached: the address its bootstrap advertises, else the
address its ADS stream comes from; and the split each route of a snapshot serves (what
``inferway verify`` checks each Envoy of a fleet against)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2
from inferway.policies import load_policy_text
from inferway.state.model import State
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.node_address import (
    ADVERTISE_METADATA_KEY,
    PEER_METADATA_KEY,
    node_address,
    peer_host,
    with_peer,
)
from inferway.xds.policy_snapshot import build_policy_snapshot
from inferway.xds.served_weights import served_route_weights

POLICY = """version: 1
listeners: [{name: edge, port: 10000}]
services:
  - {name: v1, endpoints: ["127.0.0.1:9001"]}
  - {name: v2, endpoints: ["127.0.0.1:9002"]}
routes:
  - name: split
    match: {path: {prefix: /split}}
    backends: [{service: v1, weight: 75}, {service: v2, weight: 25}]
  - name: only-v1
    backends: [{service: v1}]
"""


def _node(**metadata: str) -> base_pb2.Node:
    node = base_pb2.Node(id="edge-1", cluster="inferway")
    for key, value in metadata.items():
        node.metadata.fields[key].string_value = value
    return node


def test_peer_host_reads_grpc_peer_strings() -> None:
    assert peer_host("ipv4:10.231.4.2:54321") == "10.231.4.2"
    assert peer_host("ipv6:[::1]:5467") == "::1"
    assert peer_host("ipv6:[fd00::2]:80") == "fd00::2"
    assert peer_host("unix:/tmp/xds.sock") == ""


def test_an_advertised_address_wins_over_the_ads_peer() -> None:
    both = _node(**{ADVERTISE_METADATA_KEY: "gw-1.example", PEER_METADATA_KEY: "10.0.0.9"})
    assert node_address(both) == ("gw-1.example", "advertised")
    assert node_address(_node(**{PEER_METADATA_KEY: "10.0.0.9"})) == ("10.0.0.9", "ads-peer")
    assert node_address(_node()) == ("", "")


async def test_with_peer_marks_only_the_first_request_of_a_stream() -> None:
    async def requests() -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
        yield discovery_pb2.DiscoveryRequest(node=_node())
        yield discovery_pb2.DiscoveryRequest(node=_node(), version_info="1")

    seen = [r async for r in with_peer(requests(), "ipv4:10.1.2.3:4000")]
    assert node_address(seen[0].node) == ("10.1.2.3", "ads-peer")
    assert node_address(seen[1].node) == ("", "")


def test_the_bootstrap_carries_the_advertised_address_in_node_metadata() -> None:
    bootstrap = build_bootstrap(
        node_id="edge-1", xds_port=18000, admin_port=0, advertise_address="10.9.8.7"
    )
    assert bootstrap["node"]["metadata"] == {ADVERTISE_METADATA_KEY: "10.9.8.7"}
    plain = build_bootstrap(node_id="edge-1", xds_port=18000, admin_port=0)
    assert "metadata" not in plain["node"]


def test_the_cache_records_each_nodes_address_and_its_source() -> None:
    cache = SnapshotCache()
    cache.open_stream(_node(**{ADVERTISE_METADATA_KEY: "10.9.8.7"}))
    other = base_pb2.Node(id="edge-2", cluster="inferway")
    other.metadata.fields[PEER_METADATA_KEY].string_value = "10.0.0.3"
    cache.open_stream(other)
    recorded = {n.node_id: (n.address, n.address_source) for n in cache.node_status()}
    assert recorded == {"edge-1": ("10.9.8.7", "advertised"), "edge-2": ("10.0.0.3", "ads-peer")}


def test_served_weights_are_read_from_the_route_configurations_served() -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    snapshot = build_policy_snapshot(policy, State(), "p.yaml")
    assert served_route_weights(snapshot) == {
        "edge": {"split": {"v1": 75.0, "v2": 25.0}, "only-v1": {"v1": 100.0}}
    }
    state = State(weights={"split": {"v1": 10.0, "v2": 90.0}})  # a rollout's step
    moved = build_policy_snapshot(policy, state, "p.yaml")
    assert served_route_weights(moved)["edge"]["split"] == {"v1": 10.0, "v2": 90.0}
    assert served_route_weights(None) == {}
