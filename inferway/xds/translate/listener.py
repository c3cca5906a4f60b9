"""Listeners: one per policy listener, each an HTTP connection manager that fetches its
routes by RDS over the ADS stream, so a route change never drains a listener."""

from __future__ import annotations

from collections.abc import Mapping

from inferway._xds_protos.envoy.config.core.v3 import address_pb2
from inferway._xds_protos.envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.extensions.filters.http.router.v3 import router_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.resolve.ir.features import FeatureRouterIR
from inferway.resolve.ir.listener import ListenerIR
from inferway.resolve.ir.llm import LlmGatewayIR
from inferway.resolve.ir.observability import ObservabilityIR
from inferway.resolve.ir.picker import PickerIR
from inferway.xds.translate import names
from inferway.xds.translate._protos import ads_config_source, bool_value, pack, uint32_value
from inferway.xds.translate.fault import apply_fault
from inferway.xds.translate.features import build_feature_router_filter
from inferway.xds.translate.listener_limits import apply_listener_timeouts
from inferway.xds.translate.llm import (
    LLM_REPORTS_CLUSTER,
    build_llm_close_log,
    build_llm_filter,
)
from inferway.xds.translate.llm_stream import build_sse_module_filter, build_stream_filter
from inferway.xds.translate.load_reports import build_load_report_filter
from inferway.xds.translate.observability import apply_observability
from inferway.xds.translate.picker import apply_picker_filters
from inferway.xds.translate.rate_limit import apply_rate_limit
from inferway.xds.translate.rbac import apply_access_control
from inferway.xds.translate.tls import apply_identity_check, build_listener_transport_socket

__all__ = ["build_http_connection_manager", "build_listener", "build_router_filter"]


def build_router_filter() -> hcm_pb2.HttpFilter:
    """The terminal HTTP filter; Envoy requires it to be last in the chain."""
    return hcm_pb2.HttpFilter(name=names.ROUTER_FILTER, typed_config=pack(router_pb2.Router()))


def build_http_connection_manager(
    listener: ListenerIR,
    *,
    observability: ObservabilityIR,
    route_config: route_pb2.RouteConfiguration | None = None,
    feature_router: FeatureRouterIR | None = None,
    llm: LlmGatewayIR | None = None,
    pickers: Mapping[str, PickerIR] | None = None,
) -> hcm_pb2.HttpConnectionManager:
    """HCM for ``listener``: RDS over ADS, or ``route_config`` inlined when given (the
    static bootstrap used for ``envoy --mode validate``). ``observability`` is the IR's
    (tracing, access logs; the same for every listener).

    ``use_remote_address`` stays false: as a sidecar, Envoy must not rewrite
    X-Forwarded-For as if it were the edge. Request ids are generated so traces and logs
    of one request can be joined; paths are normalized (RFC 3986) before matching so
    ``/a/../b`` cannot slip past a route."""
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix=listener.name,
        codec_type=hcm_pb2.HttpConnectionManager.CodecType.AUTO,
        http_filters=[build_load_report_filter(), build_router_filter()],
        use_remote_address=bool_value(False),
        generate_request_id=bool_value(True),
        normalize_path=bool_value(True),
    )
    apply_listener_timeouts(manager, listener)
    apply_access_control(manager, listener.routes)
    apply_fault(manager, listener.routes)
    apply_rate_limit(manager, listener.routes)
    apply_identity_check(manager, listener)
    apply_observability(manager, observability)
    if llm is not None and any(r.llm for r in listener.routes):
        # before access rules, rate limits and faults: they see the route the model chose
        admit = llm.transport == "http"  # the Lua filter asks, no ext_proc filter then
        native = admit and llm.stream_reader == "native"
        if not admit:
            manager.http_filters.insert(0, build_llm_filter(llm))
        # before it, so answers reach it after the processor has seen their headers (they
        # are on their way to the client when it rewrites a chunk)
        models: dict[str, str] = {}
        for route in listener.routes:
            if route.llm is not None:
                for name in (route.llm.model, *route.llm.aliases):
                    models.setdefault(name, route.llm.model)
        stream_filter = build_stream_filter(
            LLM_REPORTS_CLUSTER,
            llm.max_body_bytes,
            admit=admit,
            client_header=llm.client_header,
            admit_timeout_s=llm.timeout,
            # without token limits, Envoy admits plain requests itself (llm_local_admit.py)
            local_models=None if llm.limited else models,
            asking={r.llm.model for r in listener.routes if r.llm and r.llm.ask_for_usage},
            native=native,
        )
        manager.http_filters.insert(0, stream_filter)
        if native:  # after the Lua filter: answers reach it first
            manager.http_filters.insert(1, build_sse_module_filter())
        if admit:
            manager.access_log.append(build_llm_close_log())
    if feature_router is not None and any(r.match.features for r in listener.routes):
        # first: the filters after it see the route the features chose
        manager.http_filters.insert(0, build_feature_router_filter(feature_router))
    if pickers:
        apply_picker_filters(manager, listener.routes, pickers)
    if route_config is None:
        manager.rds.CopyFrom(
            hcm_pb2.Rds(
                config_source=ads_config_source(),
                route_config_name=listener.name,
            )
        )
    else:
        manager.route_config.CopyFrom(route_config)
    return manager


def build_listener(
    listener: ListenerIR,
    *,
    observability: ObservabilityIR,
    route_config: route_pb2.RouteConfiguration | None = None,
    feature_router: FeatureRouterIR | None = None,
    llm: LlmGatewayIR | None = None,
    pickers: Mapping[str, PickerIR] | None = None,
) -> listener_pb2.Listener:
    proto = listener_pb2.Listener(
        name=listener.name,
        stat_prefix=listener.name,
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(
                address=listener.address,
                port_value=listener.port,
                protocol=address_pb2.SocketAddress.Protocol.TCP,
            )
        ),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    listener_components_pb2.Filter(
                        name=names.HCM_FILTER,
                        typed_config=pack(
                            build_http_connection_manager(
                                listener,
                                route_config=route_config,
                                observability=observability,
                                feature_router=feature_router,
                                llm=llm,
                                pickers=pickers,
                            )
                        ),
                    )
                ],
                transport_socket=build_listener_transport_socket(listener),
            )
        ],
    )
    if llm is not None and any(r.llm for r in listener.routes):  # whole prompts are held
        proto.per_connection_buffer_limit_bytes.CopyFrom(uint32_value(llm.max_body_bytes))
    return proto
