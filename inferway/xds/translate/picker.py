"""Endpoint pickers in Envoy: per picker service, an external processing filter that asks the
picker (inferway's own, or an external Gateway API Inference Extension picker) which replica a
request goes to, and that service's cluster balanced by ``override_host``.

The picker answers as GAIE's Endpoint Picker protocol says: the ``x-gateway-destination-endpoint``
header and the same ``ip:port[,ip:port…]`` list in the ``envoy.lb`` dynamic metadata. Envoy's
``override_host`` policy reads both (header first) and sends the request to the first listed
host that is in the cluster and healthy. Why not GAIE's reference ORIGINAL_DST cluster: that
sends to any address the picker names (so a wrong or hostile answer reaches anything), and has
no EDS, health checks or outlier detection. With ``override_host`` the cluster stays the
service's own: a host the picker names but Envoy does not know, or knows as unhealthy, is
ignored, and the service's own policy (round robin, least request…) is the fallback — which
is also what ``fail: open`` gives when the picker is down or slower than its timeout. With
``fail: closed`` Envoy answers 503 instead (504 when the picker misses its timeout).

The filter is last before the router (it sees the route every other filter agreed on) and is
disabled on every route that does not send to its service.

``transport: http`` (inferway's own picker only) asks over ``ext_authz``'s HTTP service instead
of ext_proc: the body goes with the question, the 200 answer's destination and ticket headers
go on the request (``override_host`` reads the destination as above), a 503/429 answer goes to
the client, and ``fail`` maps to ``failure_mode_allow``/``status_on_error`` the same way. As
ext_authz says nothing when the request ends, the listener's gRPC access log sends each
request's ticket to the picker's gRPC address, which ends the pick (docs/picker.md).

``process: envoy`` asks nobody: a Lua filter hashes the prompt's prefix and the cluster is
balanced by Maglev with bounded load instead of ``override_host`` (picker_envoy.py); with
``pick: score`` the Lua filter scores the replicas itself and answers with the destination
header, for ``override_host`` as above, its replicas' scraped load in the metadata of each
route that sends to the service (picker_score.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from inferway._xds_protos.envoy.config.accesslog.v3 import accesslog_pb2
from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import (
    config_source_pb2,
    extension_pb2,
    http_uri_pb2,
)
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2, route_pb2
from inferway._xds_protos.envoy.extensions.access_loggers.grpc.v3 import als_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.extensions.load_balancing_policies.common.v3 import common_pb2
from inferway._xds_protos.envoy.extensions.load_balancing_policies.least_request.v3 import (
    least_request_pb2,
)
from inferway._xds_protos.envoy.extensions.load_balancing_policies.maglev.v3 import maglev_pb2
from inferway._xds_protos.envoy.extensions.load_balancing_policies.override_host.v3 import (
    override_host_pb2,
)
from inferway._xds_protos.envoy.extensions.load_balancing_policies.random.v3 import random_pb2
from inferway._xds_protos.envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from inferway._xds_protos.envoy.extensions.load_balancing_policies.round_robin.v3 import (
    round_robin_pb2,
)
from inferway._xds_protos.envoy.type.matcher.v3 import string_pb2
from inferway._xds_protos.envoy.type.metadata.v3 import metadata_pb2
from inferway._xds_protos.envoy.type.v3 import http_status_pb2
from inferway.resolve.ir.picker import PickerIR
from inferway.resolve.ir.route import RouteIR
from inferway.xds.translate._protos import duration, pack
from inferway.xds.translate.ext_proc_request import request_body_processor
from inferway.xds.translate.grpc_access_log import grpc_log_common
from inferway.xds.translate.inline_cluster import build_inline_http2_cluster
from inferway.xds.translate.picker_envoy import (
    build_prefix_hash_filter,
    disabled_prefix_hash,
    prefix_hash_lb,
)
from inferway.xds.translate.picker_score import build_score_filter, load_metadata

__all__ = [
    "DESTINATION_HEADER",
    "LB_NAMESPACE",
    "SERVICE_METADATA_KEY",
    "TICKET_HEADER",
    "apply_picker_filters",
    "apply_picker_lb",
    "apply_picker_routes",
    "build_picker_clusters",
    "picker_cluster",
    "picker_filter",
    "picker_http_cluster",
]

DESTINATION_HEADER = "x-gateway-destination-endpoint"
"""GAIE's header (and ``envoy.lb`` metadata key): ``ip:port`` of the chosen replica, then the
fallbacks, comma-separated."""
LB_NAMESPACE = "envoy.lb"
TICKET_HEADER = "x-inferway-picker-ticket"
"""``transport: http``: the pick's ticket, set on the request by ext_authz and logged by the
gRPC access log at the request's end (the picker then ends the pick)."""
SERVICE_METADATA_KEY = "x-inferway-picker-service"
"""gRPC metadata on every stream to inferway's picker: the service whose replicas to pick."""
OVERRIDE_HOST_POLICY = "envoy.load_balancing_policies.override_host"
HTTP_GRPC_ACCESS_LOGGER = "envoy.access_loggers.http_grpc"
HTTP_PATH_PREFIX = "/pick/"
"""``transport: http``: ext_authz asks ``/pick/<service><request path>`` (picker/http_lane.py)."""
HTTP_MAX_BODY_BYTES = 1 << 20
"""``transport: http``: the body sent with the question, as much as ext_proc's BUFFERED mode
takes (the listener's 1 MiB buffer); a larger one is sent cut (the pick is then by load)."""
ACCESS_LOG_FLUSH_S = 0.01
"""How long Envoy batches access log entries before sending them: a finished request stays
counted in flight at most this much longer. Short, because at 500 req/s a 50 ms batch would
keep about 25 finished requests counted (the queue scorer's ``queue_limit`` is 8 per replica);
at most 100 batches a second cost the picker little next to one message per request."""

_LEGACY_TYPED = {
    cluster_pb2.Cluster.LbPolicy.ROUND_ROBIN: "envoy.load_balancing_policies.round_robin",
    cluster_pb2.Cluster.LbPolicy.LEAST_REQUEST: "envoy.load_balancing_policies.least_request",
    cluster_pb2.Cluster.LbPolicy.RANDOM: "envoy.load_balancing_policies.random",
    cluster_pb2.Cluster.LbPolicy.RING_HASH: "envoy.load_balancing_policies.ring_hash",
    cluster_pb2.Cluster.LbPolicy.MAGLEV: "envoy.load_balancing_policies.maglev",
}


def picker_cluster(service: str) -> str:
    return f"inferway_picker_{service}"


def picker_filter(service: str) -> str:
    return f"inferway.picker.{service}"


def picker_http_cluster(service: str) -> str:
    return f"inferway_picker_http_{service}"


def build_picker_clusters(pickers: Sequence[PickerIR]) -> list[cluster_pb2.Cluster]:
    """Per picker its gRPC cluster (ext_proc, health; the access log for ``transport: http``)
    and, for ``transport: http``, the HTTP/1.1 cluster ext_authz asks."""
    clusters = []
    for p in pickers:
        if p.in_envoy:
            continue
        clusters.append(build_inline_http2_cluster(picker_cluster(p.service), p.host, p.port, 1.0))
        if p.transport == "http":
            http = build_inline_http2_cluster(
                picker_http_cluster(p.service), p.http_host, p.http_port, 1.0
            )
            http.ClearField("typed_extension_protocol_options")  # HTTP/1.1, keep-alive
            clusters.append(http)
    return clusters


def _http_filter(picker: PickerIR) -> hcm_pb2.HttpFilter:
    """``transport: http``: ext_authz's HTTP service asks the picker with the body; its 200
    answer's destination and ticket headers go on the request, a 503/429 to the client."""
    exact = [
        string_pb2.StringMatcher(exact=DESTINATION_HEADER),
        string_pb2.StringMatcher(exact=TICKET_HEADER),
    ]
    config = ext_authz_pb2.ExtAuthz(
        http_service=ext_authz_pb2.HttpService(
            server_uri=http_uri_pb2.HttpUri(
                uri=f"http://{picker.http_host}:{picker.http_port}",
                cluster=picker_http_cluster(picker.service),
                timeout=duration(picker.timeout),
            ),
            path_prefix=HTTP_PATH_PREFIX + picker.service,
            authorization_response=ext_authz_pb2.AuthorizationResponse(
                allowed_upstream_headers=string_pb2.ListStringMatcher(patterns=exact)
            ),
        ),
        transport_api_version=config_source_pb2.ApiVersion.V3,
        failure_mode_allow=picker.fail_open,
        with_request_body=ext_authz_pb2.BufferSettings(
            max_request_bytes=HTTP_MAX_BODY_BYTES, allow_partial_message=True
        ),
        allowed_headers=string_pb2.ListStringMatcher(
            patterns=[string_pb2.StringMatcher(exact=picker.session_header.lower())]
        ),
    )
    if not picker.fail_open:
        config.status_on_error.code = http_status_pb2.StatusCode.ServiceUnavailable
    return hcm_pb2.HttpFilter(name=picker_filter(picker.service), typed_config=pack(config))


def _finish_log(picker: PickerIR) -> accesslog_pb2.AccessLog:
    """``transport: http``: Envoy's gRPC access log of each request with a ticket (answered,
    reset or timed out) to the picker's gRPC server, which ends the pick."""
    config = als_pb2.HttpGrpcAccessLogConfig(
        common_config=grpc_log_common(
            picker_filter(picker.service), picker_cluster(picker.service), ACCESS_LOG_FLUSH_S
        ),
        additional_request_headers_to_log=[TICKET_HEADER],
    )
    present = route_components_pb2.HeaderMatcher(name=TICKET_HEADER, present_match=True)
    return accesslog_pb2.AccessLog(
        name=HTTP_GRPC_ACCESS_LOGGER,
        filter=accesslog_pb2.AccessLogFilter(
            header_filter=accesslog_pb2.HeaderFilter(header=present)
        ),
        typed_config=pack(config),
    )


def _filter(picker: PickerIR) -> hcm_pb2.HttpFilter:
    if picker.scored_in_envoy:
        return build_score_filter(picker_filter(picker.service), picker)
    if picker.in_envoy:
        return build_prefix_hash_filter(picker_filter(picker.service), picker)
    if picker.transport == "http":
        return _http_filter(picker)
    # the body is the prompt: prefix affinity needs it
    config = request_body_processor(
        picker_cluster(picker.service),
        LB_NAMESPACE,
        picker.timeout,
        fail_open=picker.fail_open,
        metadata=(SERVICE_METADATA_KEY, picker.service),
    )
    if not picker.fail_open:
        config.status_on_error.code = http_status_pb2.StatusCode.ServiceUnavailable
    return hcm_pb2.HttpFilter(name=picker_filter(picker.service), typed_config=pack(config))


def _picked_service(route: RouteIR, pickers: Mapping[str, PickerIR]) -> str | None:
    """The picker a route asks: its first backend's with one (one picker per request)."""
    return next((b.service for b in route.backends if b.service in pickers), None)


def apply_picker_filters(
    manager: hcm_pb2.HttpConnectionManager,
    routes: Sequence[RouteIR],
    pickers: Mapping[str, PickerIR],
) -> None:
    """One filter per picker service this listener's routes send to, just before the router."""
    used = sorted({s for r in routes if (s := _picked_service(r, pickers)) is not None})
    for service in used:
        manager.http_filters.insert(len(manager.http_filters) - 1, _filter(pickers[service]))
        if pickers[service].transport == "http" and not pickers[service].in_envoy:
            manager.access_log.append(_finish_log(pickers[service]))


def apply_picker_routes(
    config: route_pb2.RouteConfiguration,
    routes: Sequence[RouteIR],
    pickers: Mapping[str, PickerIR],
) -> None:
    """Disable each picker filter on the routes that do not send to its service (the 413
    and reject twins included: they answer without an upstream); give a ``pick: score``
    picker's Lua filter its replicas' load in the metadata of the routes that do."""
    by_name = {r.name: r for r in routes}
    used = {s for r in routes if (s := _picked_service(r, pickers)) is not None}
    disabled = {
        "ext_proc": pack(ext_proc_pb2.ExtProcPerRoute(disabled=True)),
        "http": pack(ext_authz_pb2.ExtAuthzPerRoute(disabled=True)),
        "envoy": pack(disabled_prefix_hash()),
    }
    for host in config.virtual_hosts:
        for proto in host.routes:
            route = by_name.get(proto.name)
            mine = _picked_service(route, pickers) if route is not None else None
            if mine is not None and pickers[mine].scored_in_envoy:
                proto.metadata.filter_metadata[picker_filter(mine)].CopyFrom(
                    load_metadata(pickers[mine])
                )
            for service in sorted(used - {mine} if mine else used):
                picker = pickers[service]
                proto.typed_per_filter_config[picker_filter(service)].CopyFrom(
                    disabled["envoy" if picker.in_envoy else picker.transport]
                )


def _typed(name: str, cluster: cluster_pb2.Cluster) -> extension_pb2.TypedExtensionConfig:
    locality = common_pb2.LocalityLbConfig()
    if cluster.common_lb_config.HasField("locality_weighted_lb_config"):
        locality.locality_weighted_lb_config.SetInParent()
    config: object
    if name.endswith("least_request"):
        config = least_request_pb2.LeastRequest(locality_lb_config=locality)
        if cluster.least_request_lb_config.HasField("choice_count"):
            config.choice_count.CopyFrom(cluster.least_request_lb_config.choice_count)
    elif name.endswith("random"):
        config = random_pb2.Random(locality_lb_config=locality)
    elif name.endswith("ring_hash"):
        config = ring_hash_pb2.RingHash()
    elif name.endswith("maglev"):
        config = maglev_pb2.Maglev()
    else:
        config = round_robin_pb2.RoundRobin(locality_lb_config=locality)
    return extension_pb2.TypedExtensionConfig(name=name, typed_config=pack(config))


def apply_picker_lb(cluster: cluster_pb2.Cluster, picker: PickerIR) -> None:
    """``override_host`` (header, then ``envoy.lb`` metadata) over the cluster's own policy,
    which stays the fallback (a legacy ``lb_policy`` becomes its typed twin); ``process:
    envoy``, ``pick: hash``: Maglev on the prefix hash instead of the cluster's own policy."""
    if picker.hashed_in_envoy:
        zoned = cluster.common_lb_config.HasField("locality_weighted_lb_config")
        cluster.ClearField("lb_policy")
        cluster.ClearField("least_request_lb_config")
        cluster.common_lb_config.ClearField("locality_weighted_lb_config")
        cluster.load_balancing_policy.CopyFrom(prefix_hash_lb(picker, zoned=zoned))
        return
    if cluster.HasField("load_balancing_policy"):
        fallback = cluster_pb2.LoadBalancingPolicy()
        fallback.CopyFrom(cluster.load_balancing_policy)
    else:
        typed = _typed(_LEGACY_TYPED[cluster.lb_policy], cluster)
        fallback = cluster_pb2.LoadBalancingPolicy(
            policies=[cluster_pb2.LoadBalancingPolicy.Policy(typed_extension_config=typed)]
        )
        cluster.ClearField("lb_policy")
        cluster.ClearField("least_request_lb_config")
        cluster.common_lb_config.ClearField("locality_weighted_lb_config")
    source = override_host_pb2.OverrideHost.OverrideHostSource
    override = override_host_pb2.OverrideHost(
        override_host_sources=[
            source(header=DESTINATION_HEADER),
            source(
                metadata=metadata_pb2.MetadataKey(
                    key=LB_NAMESPACE,
                    path=[metadata_pb2.MetadataKey.PathSegment(key=DESTINATION_HEADER)],
                )
            ),
        ],
        fallback_policy=fallback,
    )
    cluster.load_balancing_policy.CopyFrom(
        cluster_pb2.LoadBalancingPolicy(
            policies=[
                cluster_pb2.LoadBalancingPolicy.Policy(
                    typed_extension_config=extension_pb2.TypedExtensionConfig(
                        name=OVERRIDE_HOST_POLICY, typed_config=pack(override)
                    )
                )
            ]
        )
    )
