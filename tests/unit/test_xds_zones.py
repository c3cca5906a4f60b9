"""Zone-aware routing: an Envoy's locality puts it in its zone's node group, whose EDS lists
its own zone as priority 0, its region next, the rest after, under the policy's own tiers;
nodes of one zone share one snapshot, a policy without zones shares the default one, and
`render --zone` shows what a zone receives."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway.cli.main import app
from inferway.gateway.control_plane import ControlPlane
from inferway.policies.model import Policy
from inferway.resolve import resolve_policy
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from inferway.xds.node_groups import ENVOY_GROUP, NodeScope, node_group, parse_group
from inferway.xds.snapshot import Snapshot, build_snapshot
from inferway.xds.translate import translate
from inferway.xds.zones import NodeLocality, localize_ir

POLICY = {
    "listeners": [{"name": "main", "port": 10000}],
    "services": [
        {
            "name": "model",
            "endpoints": [
                {"address": "10.0.1.1:8000", "zone": "a", "region": "east"},
                {"address": "10.0.1.2:8000", "zone": "a", "region": "east"},
                {"address": "10.0.2.1:8000", "zone": "b", "region": "east"},
                {"address": "10.0.3.1:8000", "zone": "c", "region": "west"},
                {"address": "10.9.0.1:8000", "zone": "dr", "region": "west", "priority": 1},
            ],
        },
        {"name": "plain", "endpoints": ["10.0.0.9:8000"]},
    ],
    "routes": [{"name": "all", "backends": [{"service": "model"}]}],
}


def _node(node_id: str, zone: str = "", region: str = "") -> base_pb2.Node:
    return base_pb2.Node(
        id=node_id, cluster="c", locality=base_pb2.Locality(zone=zone, region=region)
    )


def _tiers(snapshot: Snapshot | None, service: str = "model") -> list[tuple[int, str]]:
    assert snapshot is not None
    assignment = snapshot.resources_of(type_urls.ENDPOINT)[service]
    assert isinstance(assignment, endpoint_pb2.ClusterLoadAssignment)
    return [(group.priority, group.locality.zone) for group in assignment.endpoints]


def test_a_node_locality_is_its_group_and_the_key_round_trips() -> None:
    assert node_group(_node("n")) == ENVOY_GROUP
    assert node_group(_node("n", "a", "east")) == "zone:east/a"
    assert node_group(_node("n", zone="a")) == "zone:/a"
    scope = parse_group("zone:east/a")
    assert scope == NodeScope("envoy", locality=NodeLocality(region="east", zone="a"))
    assert scope.key == "zone:east/a"


def test_own_zone_first_then_own_region_then_the_rest_under_the_policy_tiers() -> None:
    ir = resolve_policy(Policy.model_validate(POLICY))
    model = localize_ir(ir, NodeLocality(region="east", zone="b")).services[0]
    tiers = [(loc.priority, loc.zone) for loc in model.localities]
    assert tiers == [(0, "b"), (1, "a"), (2, "c"), (3, "dr")]
    west = localize_ir(ir, NodeLocality(region="west", zone="c")).services[0]
    assert [(loc.priority, loc.zone) for loc in west.localities] == [
        (0, "c"),
        (1, "a"),
        (1, "b"),
        (2, "dr"),  # the policy's DR tier stays behind every zone of tier 0
    ]
    unknown = localize_ir(ir, NodeLocality(zone="nowhere")).services[0]
    assert [(loc.priority, loc.zone) for loc in unknown.localities] == [
        (0, "a"),
        (0, "b"),
        (0, "c"),
        (1, "dr"),
    ]
    assert localize_ir(ir, NodeLocality()) is ir


def test_nodes_of_one_zone_share_a_snapshot_and_zones_differ_only_in_eds() -> None:
    cache = SnapshotCache(node_group=node_group)
    plane = ControlPlane(cache)
    plane.apply_policy(Policy.model_validate(POLICY), "policy.yaml")
    first = cache.open_stream(_node("a-1", "a", "east"))
    second = cache.open_stream(_node("a-2", "a", "east"))
    other = cache.open_stream(_node("b-1", "b", "east"))
    assert first.group == second.group == "zone:east/a" != other.group
    zone_a, zone_b = cache.get_snapshot(first.group), cache.get_snapshot(other.group)
    default = cache.get_snapshot(ENVOY_GROUP)
    assert zone_a is not None and zone_b is not None and default is not None
    assert _tiers(zone_a) == [(0, "a"), (1, "b"), (2, "c"), (3, "dr")]
    assert _tiers(zone_b) == [(0, "b"), (1, "a"), (2, "c"), (3, "dr")]
    assert _tiers(default) == [(0, "a"), (0, "b"), (0, "c"), (1, "dr")]
    for type_url in (type_urls.CLUSTER, type_urls.LISTENER, type_urls.ROUTE):
        assert zone_a.versions[type_url] == zone_b.versions[type_url] == default.versions[type_url]
    assert zone_a.versions[type_urls.ENDPOINT] != zone_b.versions[type_urls.ENDPOINT]
    assert _tiers(zone_a, "plain") == [(0, "")]
    ir = resolve_policy(Policy.model_validate(POLICY))  # only EDS re-rendered, same result
    east_a = NodeLocality(region="east", zone="a")
    assert zone_a == build_snapshot(translate(localize_ir(ir, east_a)))

    edited = json.loads(json.dumps(POLICY))
    edited["services"][0]["endpoints"].append({"address": "10.0.1.3:8000", "zone": "a"})
    plane.apply_policy(Policy.model_validate(edited), "policy.yaml")  # every zone follows
    refreshed = cache.get_snapshot(first.group)
    assert refreshed is not None and refreshed.version != zone_a.version
    assignment = refreshed.resources_of(type_urls.ENDPOINT)["model"]
    assert isinstance(assignment, endpoint_pb2.ClusterLoadAssignment)
    assert len(assignment.endpoints[0].lb_endpoints) == 3


def test_without_zones_in_the_policy_a_zone_group_is_served_the_default_snapshot() -> None:
    cache = SnapshotCache(node_group=node_group)
    plane = ControlPlane(cache)
    unzoned = {**POLICY, "services": [POLICY["services"][1]], "routes": []}
    plane.apply_policy(Policy.model_validate(unzoned), "policy.yaml")
    handle = cache.open_stream(_node("a-1", "a"))
    assert cache.get_snapshot(handle.group) is cache.get_snapshot(ENVOY_GROUP)


def test_render_zone_shows_what_that_zone_receives(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps(POLICY))
    runner = CliRunner()
    rendered = runner.invoke(
        app, ["render", "-f", str(policy), "-o", "json", "--zone", "c", "--region", "west"]
    )
    assert rendered.exit_code == 0, rendered.output
    model = next(
        e for e in json.loads(rendered.stdout)["endpoints"] if e["cluster_name"] == "model"
    )
    tiers = [(group.get("priority", 0), group["locality"]["zone"]) for group in model["endpoints"]]
    assert tiers == [(0, "c"), (1, "a"), (1, "b"), (2, "dr")]


def test_a_zone_rejecting_its_rendering_keeps_its_last_good_one_and_it_is_not_resent() -> None:
    cache = SnapshotCache(node_group=node_group)
    plane = ControlPlane(cache)
    plane.apply_policy(Policy.model_validate(POLICY), "policy.yaml")
    handle = cache.open_stream(_node("a-1", "a", "east"))
    good = cache.get_snapshot(handle.group)
    assert good is not None
    for type_url, version in good.versions.items():
        cache.record_ack(handle, type_url, version)

    edited = json.loads(json.dumps(POLICY))
    edited["services"][0]["endpoints"].append({"address": "10.0.1.3:8000", "zone": "a"})
    plane.apply_policy(Policy.model_validate(edited), "policy.yaml")
    bad = cache.get_snapshot(handle.group)
    assert bad is not None and bad.version != good.version
    cache.record_nack(
        handle,
        type_urls.ENDPOINT,
        good.versions[type_urls.ENDPOINT],
        "n1",
        "rejected for the test",
        snapshot=bad.version,
    )
    assert cache.get_snapshot(handle.group) == good  # the zone went back
    assert plane.degraded is not None and "a-1 rejected" in plane.degraded
    default = cache.get_snapshot(ENVOY_GROUP)
    assert default is not None  # the edit stays live elsewhere
    assignment = default.resources_of(type_urls.ENDPOINT)["model"]
    assert isinstance(assignment, endpoint_pb2.ClusterLoadAssignment)
    assert len(assignment.endpoints[0].lb_endpoints) == 3

    plane.apply_policy(Policy.model_validate(edited), "policy.yaml")  # the same edit again
    assert cache.get_snapshot(handle.group) == good  # never re-sent


def test_a_zoned_dns_service_is_localized_in_its_cluster() -> None:
    dns = {
        "listeners": [{"name": "main", "port": 10000}],
        "services": [
            {
                "name": "model",
                "endpoints": [
                    {"address": "model-a.internal:8000", "zone": "a"},
                    {"address": "model-b.internal:8000", "zone": "b"},
                ],
            }
        ],
        "routes": [{"name": "all", "backends": [{"service": "model"}]}],
    }
    cache = SnapshotCache(node_group=node_group)
    ControlPlane(cache).apply_policy(Policy.model_validate(dns), "policy.yaml")
    handle = cache.open_stream(_node("b-1", "b"))
    snapshot = cache.get_snapshot(handle.group)
    assert snapshot is not None
    cluster = snapshot.resources_of(type_urls.CLUSTER)["model"]
    tiers = [(g.priority, g.locality.zone) for g in cluster.load_assignment.endpoints]
    assert tiers == [(0, "b"), (1, "a")]
    ir = resolve_policy(Policy.model_validate(dns))
    assert snapshot == build_snapshot(translate(localize_ir(ir, NodeLocality(zone="b"))))
