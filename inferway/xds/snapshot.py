"""A versioned, immutable set of Envoy resources: the unit the cache stores and the server sends.

go-control-plane's snapshot as a value: versions derive from content, so a control-plane restart
with the same input produces the same versions and Envoy is never told "new" about old content.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from google.protobuf.message import Message

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.listener.v3 import listener_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.xds import type_urls
from inferway.xds.resources import Resources, content_hash

__all__ = ["Snapshot", "build_snapshot", "replace_type"]

_HCM_TYPE_URL = "type.googleapis.com/" + hcm_pb2.HttpConnectionManager.DESCRIPTOR.full_name


@dataclass(frozen=True)
class Snapshot:
    """``versions[type_url]`` covers every type in ``PUSH_ORDER`` (an absent type is an empty set,
    which Envoy must still receive: its initialisation waits for the first CDS and LDS answers).
    """

    resources: Resources
    versions: Mapping[str, str]
    version: str

    def type_urls(self) -> list[str]:
        """Every type this snapshot answers for, in make-before-break push order."""
        return list(self.versions)

    def resources_of(self, type_url: str) -> Mapping[str, Message]:
        return self.resources.of_type(type_url)

    def consistent(self) -> list[str]:
        """Dangling references Envoy would wait on forever (a cluster warming without endpoints,
        a listener warming without its route configuration); empty means consistent."""
        problems: list[str] = []
        endpoints = self.resources.of_type(type_urls.ENDPOINT)
        for name, cluster in self.resources.of_type(type_urls.CLUSTER).items():
            assert isinstance(cluster, cluster_pb2.Cluster)
            if cluster.type != cluster_pb2.Cluster.EDS:
                continue
            service = cluster.eds_cluster_config.service_name or cluster.name
            if service not in endpoints:
                problems.append(
                    f"cluster {name!r} uses EDS name {service!r} but the snapshot has no "
                    f"ClusterLoadAssignment with that cluster_name"
                )
        routes = self.resources.of_type(type_urls.ROUTE)
        for name, listener in self.resources.of_type(type_urls.LISTENER).items():
            assert isinstance(listener, listener_pb2.Listener)
            for where, hcm in _http_connection_managers(listener):
                if not hcm.HasField("rds"):
                    continue
                wanted = hcm.rds.route_config_name
                if wanted not in routes:
                    problems.append(
                        f"listener {name!r} ({where}) uses RDS route config {wanted!r} but the "
                        f"snapshot has no RouteConfiguration with that name"
                    )
        return problems


def build_snapshot(resources: Resources) -> Snapshot:
    """Version each type by the content hash of its resources (sorted by name), and the whole
    snapshot by the hash of those per-type versions."""
    order = list(type_urls.PUSH_ORDER) + [
        t for t in resources.type_urls() if t not in type_urls.PUSH_ORDER
    ]
    versions: dict[str, str] = {}
    for type_url in order:
        named = resources.of_type(type_url)
        versions[type_url] = content_hash(named[name] for name in sorted(named))
    return _versioned(resources, versions)


def replace_type(snapshot: Snapshot, type_url: str, named: Mapping[str, Message]) -> Snapshot:
    """``snapshot`` with every resource of ``type_url`` replaced by ``named``: only that type
    is hashed again (a zone's rendering differs from the default one in its EDS only), and the
    result is exactly what ``build_snapshot`` gives for the same resources."""
    by_type = dict(snapshot.resources.by_type)
    by_type[type_url] = MappingProxyType(dict(sorted(named.items())))
    resources = Resources(MappingProxyType(dict(sorted(by_type.items()))))
    versions = dict(snapshot.versions)
    versions[type_url] = content_hash(named[name] for name in sorted(named))
    return _versioned(resources, versions)


def _versioned(resources: Resources, versions: dict[str, str]) -> Snapshot:
    digest = hashlib.sha256()
    for type_url in sorted(versions):
        digest.update(f"{type_url}={versions[type_url]};".encode())
    return Snapshot(resources, MappingProxyType(versions), digest.hexdigest()[:16])


def _http_connection_managers(
    listener: listener_pb2.Listener,
) -> Iterator[tuple[str, hcm_pb2.HttpConnectionManager]]:
    chains = [(f"filter_chains[{i}]", c) for i, c in enumerate(listener.filter_chains)]
    if listener.HasField("default_filter_chain"):
        chains.append(("default_filter_chain", listener.default_filter_chain))
    for where, chain in chains:
        for index, network_filter in enumerate(chain.filters):
            if network_filter.typed_config.type_url != _HCM_TYPE_URL:
                continue
            hcm = hcm_pb2.HttpConnectionManager()
            network_filter.typed_config.Unpack(hcm)
            yield f"{where}.filters[{index}]", hcm
    api = listener.api_listener.api_listener  # a proxyless gRPC client's listener
    if listener.HasField("api_listener") and api.type_url == _HCM_TYPE_URL:
        hcm = hcm_pb2.HttpConnectionManager()
        api.Unpack(hcm)
        yield "api_listener", hcm
