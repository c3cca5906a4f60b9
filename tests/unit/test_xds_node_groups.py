"""Per-node scoping: a node's kind and visible gRPC targets pick its snapshot; Envoy nodes
keep exactly the Envoy translation, proxyless gRPC nodes get API listeners for their targets
and what those reach, built when such a node first connects and rebuilt with every apply."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.gateway.control_plane import ControlPlane
from inferway.policies.model import Policy
from inferway.resolve import resolve_policy
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from inferway.xds.node_groups import (
    ENVOY_GROUP,
    GRPC_GROUP,
    TARGETS_METADATA_KEY,
    NodeScope,
    native_reader_ir,
    node_group,
    node_scope,
    parse_group,
)
from inferway.xds.snapshot import build_snapshot
from inferway.xds.sse_module_build import MODULES_METADATA_KEY
from inferway.xds.translate import translate
from inferway.xds.translate.llm_stream import SSE_MODULE_FILTER, STREAM_FILTER
from inferway.xds.translate.proxyless import translate_proxyless


def _policy(v2_weight: float = 10) -> Policy:
    return Policy.model_validate(
        {
            "listeners": [{"name": "main", "port": 10000}],
            "services": [
                {"name": "v1", "protocol": "http2", "endpoints": ["127.0.0.1:9001"]},
                {"name": "v2", "protocol": "http2", "endpoints": ["127.0.0.1:9002"]},
                {"name": "other", "protocol": "http2", "endpoints": ["127.0.0.1:9003"]},
            ],
            "routes": [
                {
                    "name": "infer",
                    "backends": [
                        {"service": "v1", "weight": 100 - v2_weight},
                        {"service": "v2", "weight": v2_weight},
                    ],
                }
            ],
            "grpc_targets": [
                {"name": "models", "route": "infer"},
                {"name": "other", "service": "other"},
            ],
        }
    )


def _node(node_id: str = "n", *, metadata: dict[str, Any] | None = None, **fields: Any):
    node = base_pb2.Node(id=node_id, cluster="c", **fields)
    if metadata:
        node.metadata.CopyFrom(struct_pb2.Struct())
        node.metadata.update(metadata)
    return node


@pytest.mark.parametrize(
    "node",
    [
        _node(user_agent_name="gRPC C-core", user_agent_version="1.85.0"),
        _node(client_features=["envoy.lb.does_not_support_overprovisioning"]),
        _node(metadata={"GENERATOR": "grpc"}),
    ],
    ids=["user-agent", "client-feature", "istio-generator"],
)
def test_proxyless_grpc_nodes_are_detected_as_istio_does(node: base_pb2.Node) -> None:
    assert node_group(node) == GRPC_GROUP


def test_envoy_nodes_share_the_default_group() -> None:
    envoy = _node(user_agent_name="envoy", client_features=["envoy.lb.does_not_support_x"])
    assert node_group(envoy) == ENVOY_GROUP == "default"
    assert node_group(_node()) == ENVOY_GROUP


def test_the_targets_a_node_may_see_are_part_of_its_group_key() -> None:
    grpc = {"user_agent_name": "gRPC Python"}
    as_list = _node(metadata={TARGETS_METADATA_KEY: ["other", "models"]}, **grpc)
    as_text = _node(metadata={TARGETS_METADATA_KEY: " models, other ,"}, **grpc)
    assert node_group(as_list) == node_group(as_text) == "grpc:models,other"
    assert parse_group("grpc:models,other") == NodeScope("grpc", ("models", "other"))
    assert parse_group(GRPC_GROUP) == NodeScope("grpc")
    assert parse_group("canary") == NodeScope("envoy")


def test_a_scoped_translation_holds_only_the_chosen_targets_and_what_they_reach() -> None:
    ir = resolve_policy(_policy())
    only_other = translate_proxyless(ir, ["other", "missing"])
    assert sorted(only_other.of_type(type_urls.LISTENER)) == ["other"]
    assert sorted(only_other.of_type(type_urls.CLUSTER)) == ["other"]
    everything = translate_proxyless(ir)
    assert sorted(everything.of_type(type_urls.LISTENER)) == ["models", "other"]
    assert sorted(everything.of_type(type_urls.ENDPOINT)) == ["other", "v1", "v2"]
    for assignment in everything.of_type(type_urls.ENDPOINT).values():
        assert isinstance(assignment, endpoint_pb2.ClusterLoadAssignment)
        assert all(group.HasField("locality") for group in assignment.endpoints)


def test_envoy_keeps_its_snapshot_and_each_grpc_scope_gets_its_own() -> None:
    cache = SnapshotCache(node_group=node_group)
    plane = ControlPlane(cache)
    policy = _policy()
    version = plane.apply_policy(policy, "policy.yaml")
    ir = resolve_policy(policy)
    assert cache.get_snapshot(ENVOY_GROUP) == build_snapshot(translate(ir))
    assert version == cache.get_snapshot(ENVOY_GROUP).version
    assert cache.get_snapshot(GRPC_GROUP) == build_snapshot(translate_proxyless(ir))

    scoped = _node("scoped", user_agent_name="gRPC Go", metadata={TARGETS_METADATA_KEY: "other"})
    handle = cache.open_stream(scoped)  # a scope seen for the first time is built on connect
    assert handle.group == "grpc:other"
    first = cache.get_snapshot("grpc:other")
    assert first is not None and sorted(first.resources_of(type_urls.LISTENER)) == ["other"]

    plane.apply_policy(_policy(v2_weight=50), "policy.yaml")  # every known scope follows
    assert cache.get_snapshot("grpc:other") == first  # its target did not change
    models = cache.get_snapshot(GRPC_GROUP).resources_of(type_urls.ROUTE)["models"]
    weights = [
        c.weight.value for c in models.virtual_hosts[0].routes[0].route.weighted_clusters.clusters
    ]
    assert weights == [5000, 5000]
    assert cache.get_snapshot(ENVOY_GROUP) == build_snapshot(translate(resolve_policy(_policy(50))))


def test_a_group_connecting_before_any_policy_waits_for_the_first_apply() -> None:
    cache = SnapshotCache(node_group=node_group)
    plane = ControlPlane(cache)
    grpc = {"user_agent_name": "gRPC Java"}
    every = cache.open_stream(_node("every", **grpc))
    scoped = cache.open_stream(_node("scoped", metadata={TARGETS_METADATA_KEY: "models"}, **grpc))
    assert cache.get_snapshot(every.group) is None and cache.get_snapshot(scoped.group) is None
    plane.apply_policy(_policy(), "policy.yaml")
    assert cache.get_snapshot(every.group) is not None
    assert sorted(cache.get_snapshot(scoped.group).resources_of(type_urls.LISTENER)) == ["models"]


async def test_waiting_for_acks_of_a_version_is_not_held_up_by_other_groups() -> None:
    cache = SnapshotCache(node_group=node_group)
    plane = ControlPlane(cache)
    version = plane.apply_policy(_policy(), "policy.yaml")
    envoy = cache.open_stream(_node("envoy"))
    cache.open_stream(_node("client", user_agent_name="gRPC C-core"))  # never acks Envoy's
    envoy_snapshot = cache.get_snapshot(ENVOY_GROUP)
    assert envoy_snapshot is not None
    assert not await cache.wait_for_acks(version, timeout=0.01)
    for type_url, type_version in envoy_snapshot.versions.items():
        cache.record_ack(envoy, type_url, type_version)
    assert await cache.wait_for_acks(version, timeout=1)


def _llm_policy(reader: str = "auto") -> Policy:
    return Policy.model_validate(
        {
            "listeners": [{"name": "main", "port": 10000}],
            "llm": {"stream_reader": reader},
            "services": [{"name": "engine", "endpoints": ["127.0.0.1:9001"]}],
            "routes": [
                {"name": "chat", "openai": {"model": "m"}, "backends": [{"service": "engine"}]}
            ],
        }
    )


def _filters(snapshot: Any) -> list[str]:
    listener = snapshot.resources_of(type_urls.LISTENER)["main"]
    manager = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    return [f.name for f in manager.http_filters]


@pytest.mark.parametrize(
    ("metadata", "locality", "key"),
    [
        ({MODULES_METADATA_KEY: "inferway_sse"}, {}, "default|sse"),
        ({MODULES_METADATA_KEY: ["other", "inferway_sse"]}, {}, "default|sse"),
        ({MODULES_METADATA_KEY: "other"}, {}, "default"),
        ({MODULES_METADATA_KEY: "inferway_sse"}, {"region": "r", "zone": "z"}, "zone:r/z|sse"),
        ({MODULES_METADATA_KEY: "inferway_sse"}, {"zone": "a|sse"}, "zone:/a_sse|sse"),
    ],
)
def test_envoys_that_can_load_the_sse_module_are_a_group_of_their_own(
    metadata: dict[str, Any], locality: dict[str, str], key: str
) -> None:
    node = _node(metadata=metadata, locality=base_pb2.Locality(**locality))
    assert node_group(node) == key
    assert parse_group(key) == node_scope(node)


def test_only_envoys_with_the_module_get_the_native_reader_and_only_under_auto() -> None:
    cache = SnapshotCache(node_group=node_group)
    plane = ControlPlane(cache)
    version = plane.apply_policy(_llm_policy(), "policy.yaml")
    plain = cache.get_snapshot(ENVOY_GROUP)
    assert plain is not None and SSE_MODULE_FILTER not in _filters(plain)
    handle = cache.open_stream(_node("native", metadata={MODULES_METADATA_KEY: "inferway_sse"}))
    native = cache.get_snapshot(handle.group)
    assert native is not None and native.version != version
    names = _filters(native)
    assert names.index(SSE_MODULE_FILTER) == names.index(STREAM_FILTER) + 1
    plane.apply_policy(_llm_policy("lua"), "policy.yaml")  # the policy says Lua: one rendering
    assert cache.get_snapshot(handle.group) == cache.get_snapshot(ENVOY_GROUP)
    assert SSE_MODULE_FILTER not in _filters(cache.get_snapshot(handle.group))
    plane.apply_policy(_policy(), "policy.yaml")  # no openai route: one rendering too
    assert cache.get_snapshot(handle.group) == cache.get_snapshot(ENVOY_GROUP)


def test_ext_proc_streams_are_read_by_the_lua_filter() -> None:
    policy = _llm_policy()
    policy = policy.model_copy(
        update={"llm": policy.llm.model_copy(update={"transport": "ext_proc"})}
    )
    ir = resolve_policy(policy)
    assert ir.llm is not None and ir.llm.stream_reader == "lua"
    assert native_reader_ir(ir) is ir


async def test_waiting_for_a_named_envoy_counts_its_groups_rendering_of_the_push() -> None:
    cache = SnapshotCache(node_group=node_group)
    plane = ControlPlane(cache)
    plane.apply_policy(_llm_policy(), "policy.yaml")
    native = cache.open_stream(_node("native", metadata={MODULES_METADATA_KEY: "inferway_sse"}))
    version = plane.version or ""
    assert not await cache.wait_for_acks(version, node_ids=["native"], timeout=0.01)
    held = cache.get_snapshot(native.group)
    assert held is not None and held.version != version
    for type_url, type_version in held.versions.items():
        cache.record_ack(native, type_url, type_version)
    assert await cache.wait_for_acks(version, node_ids=["native"], timeout=1)
    # not named, it is another group's: waiting on the default group's Envoys does not count it
    assert not await cache.wait_for_acks(version, timeout=0.01)
