"""Per-node scoping: which snapshot a node receives is keyed by its kind and the names it
may see, so an Envoy and a proxyless gRPC client on one control plane each get resources
they can consume.

Envoy nodes without a locality share the ``default`` group and get exactly the Envoy
translation. An Envoy whose node names a zone or region (``node.locality``) is in the group
``zone:<region>/<zone>``: the same translation of the IR localized for that zone
(``inferway.xds.zones``: its own zone's replicas first), so every Envoy of one zone shares one
snapshot and a fleet costs one rendering per zone, not per node. A node
is a proxyless gRPC client when it says so the way gRPC and Istio do: ``user_agent_name``
"gRPC ..." (set by every gRPC library), the client feature gRPC advertises
(``envoy.lb.does_not_support_overprovisioning``), or Istio's bootstrap metadata
``GENERATOR: grpc``. It sees every gRPC target of the policy, or only those listed in its
node metadata ``INFERWAY_GRPC_TARGETS`` (a list, or a comma-separated string); that list is
part of the group key, so clients with the same view share one snapshot.

An Envoy that can load inferway's native SSE reader says so in its node metadata
(``INFERWAY_ENVOY_MODULES`` lists ``inferway_sse``; every Envoy inferway starts with the module
built does): its group key gains ``|sse`` (``default|sse``, ``zone:r/z|sse``) and, when the
policy leaves ``llm.stream_reader`` at ``auto``, its translation puts the module after the Lua
filter. Every other Envoy reads streams with the Lua filter, so an Envoy never gets a filter
it cannot load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.resolve.ir import IR
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.snapshot import Snapshot, build_snapshot, replace_type
from inferway.xds.sse_module_build import MODULES_METADATA_KEY, SSE_MODULE
from inferway.xds.translate import translate as translate_ir
from inferway.xds.translate.endpoint import build_cluster_load_assignment, uses_hostnames
from inferway.xds.translate.proxyless import translate_proxyless
from inferway.xds.zones import NodeLocality, localize_ir

__all__ = [
    "ENVOY_GROUP",
    "GRPC_GROUP",
    "SSE_SUFFIX",
    "TARGETS_METADATA_KEY",
    "ZONE_GROUP",
    "NodeScope",
    "build_group_snapshot",
    "native_reader_ir",
    "node_group",
    "node_scope",
    "parse_group",
]

ENVOY_GROUP = "default"
GRPC_GROUP = "grpc"
"""Proxyless gRPC clients that may see every target; ``grpc:a,b`` sees targets a and b."""
TARGETS_METADATA_KEY = "INFERWAY_GRPC_TARGETS"
ZONE_GROUP = "zone"
"""Envoys of one locality: ``zone:<region>/<zone>`` (either may be empty)."""
_GRPC_CLIENT_FEATURE = "envoy.lb.does_not_support_overprovisioning"
SSE_SUFFIX = "|sse"
"""Ends the key of Envoys that can load inferway's native SSE reader."""


@dataclass(frozen=True)
class NodeScope:
    kind: Literal["envoy", "grpc"]
    targets: tuple[str, ...] | None = None
    """Sorted target names a gRPC node may see; None: all of them."""
    locality: NodeLocality = field(default_factory=NodeLocality)
    """An Envoy's region and zone (empty: none said, the ``default`` group)."""
    sse_module: bool = False
    """An Envoy that can load inferway's native SSE reader."""

    @property
    def key(self) -> str:
        if self.kind == "envoy":
            suffix = SSE_SUFFIX if self.sse_module else ""
            if not self.locality:
                return ENVOY_GROUP + suffix
            return f"{ZONE_GROUP}:{self.locality.region}/{self.locality.zone}{suffix}"
        if self.targets is None:
            return GRPC_GROUP
        return f"{GRPC_GROUP}:{','.join(self.targets)}"


def parse_group(key: str) -> NodeScope:
    """The scope a group key stands for; every key that is not a gRPC key is Envoy's."""
    if key == GRPC_GROUP:
        return NodeScope("grpc")
    prefix = f"{GRPC_GROUP}:"
    if key.startswith(prefix):
        return NodeScope("grpc", tuple(n for n in key[len(prefix) :].split(",") if n))
    sse = key.endswith(SSE_SUFFIX)
    if sse:
        key = key[: -len(SSE_SUFFIX)]
    zoned = f"{ZONE_GROUP}:"
    if key.startswith(zoned):
        region, _, zone = key[len(zoned) :].partition("/")
        return NodeScope("envoy", locality=NodeLocality(region=region, zone=zone), sse_module=sse)
    return NodeScope("envoy", sse_module=sse)


def node_scope(node: base_pb2.Node) -> NodeScope:
    if not _is_proxyless_grpc(node):
        region = node.locality.region.replace("/", "_")  # the key's separator
        zone = node.locality.zone.replace("|", "_")
        return NodeScope(
            "envoy",
            locality=NodeLocality(region=region, zone=zone),
            sse_module=SSE_MODULE in _listed(node, MODULES_METADATA_KEY),
        )
    if TARGETS_METADATA_KEY not in node.metadata.fields:
        return NodeScope("grpc")
    return NodeScope("grpc", tuple(sorted(_listed(node, TARGETS_METADATA_KEY))))


def _listed(node: base_pb2.Node, key: str) -> set[str]:
    """The names in node metadata ``key``: a list, or a comma-separated string."""
    field = node.metadata.fields.get(key)
    if field is None:
        return set()
    if field.HasField("list_value"):
        names = [v.string_value for v in field.list_value.values]
    else:
        names = field.string_value.split(",")
    return {n.strip() for n in names if n.strip()}


def native_reader_ir(ir: IR) -> IR:
    """``ir`` for Envoys that can load the native SSE reader: ``llm.stream_reader`` ``auto``
    becomes ``native``; ``ir`` itself when nothing changes."""
    if ir.llm is None or ir.llm.stream_reader != "auto":
        return ir
    return replace(ir, llm=replace(ir.llm, stream_reader="native"))


def node_group(node: base_pb2.Node) -> str:
    """The cache's key function (``SnapshotCache(node_group=node_group)``)."""
    return node_scope(node).key


def _is_proxyless_grpc(node: base_pb2.Node) -> bool:
    generator = node.metadata.fields.get("GENERATOR")
    return (
        node.user_agent_name.startswith("gRPC")
        or _GRPC_CLIENT_FEATURE in node.client_features
        or (generator is not None and generator.string_value == "grpc")
    )


def build_group_snapshot(
    ir: IR,
    group: str,
    *,
    translate: Callable[[IR], Resources] = translate_ir,
    default: Snapshot | None = None,
) -> Snapshot | None:
    """The snapshot of ``group`` for ``ir``: a gRPC group's scoped one, a zone group's
    Envoy translation of the localized IR; None for the ``default`` group itself, whose
    snapshot the caller makes. With ``default`` (the ``default`` group's snapshot of the same
    IR) a zone group reuses it: itself when localizing changes nothing, else with only the
    localized services' ClusterLoadAssignments rebuilt (a zone costs one EDS rendering)."""
    scope = parse_group(group)
    if scope.kind == "grpc":
        return build_snapshot(translate_proxyless(ir, scope.targets))
    if scope.sse_module:
        native = native_reader_ir(ir)
        if native is not ir:  # its own translation; a zone's too (the default one is Lua's)
            return build_snapshot(translate(localize_ir(native, scope.locality)))
        if not scope.locality:  # the default group's own snapshot
            return default if default is not None else build_snapshot(translate(ir))
    if not scope.locality:
        return None
    localized = localize_ir(ir, scope.locality)
    if default is None:
        return build_snapshot(translate(localized))
    changed = [
        new for new, old in zip(localized.services, ir.services, strict=True) if new is not old
    ]
    if not changed:
        return default
    if any(uses_hostnames(service) for service in changed):  # assignments inlined in clusters
        return build_snapshot(translate(localized))
    endpoints = dict(default.resources_of(type_urls.ENDPOINT))
    for service in changed:  # only the EDS differs: re-hash that type alone
        endpoints[service.name] = build_cluster_load_assignment(service)
    return replace_type(default, type_urls.ENDPOINT, endpoints)
