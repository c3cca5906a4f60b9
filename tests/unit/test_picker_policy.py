"""A service's ``picker:`` from policy to Envoy config: the schema's located errors, the
external processor per picker service (only on routes to it), ``override_host`` over the
service's own policy (kept as the fallback), fail open/closed, ``transport: http`` (ext_authz
and the gRPC access log that ends picks), and dump round trips."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import health_check_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway._xds_protos.envoy.config.listener.v3 import listener_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.extensions.access_loggers.grpc.v3 import als_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from inferway._xds_protos.envoy.extensions.filters.http.lua.v3 import lua_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.extensions.load_balancing_policies.least_request.v3 import (
    least_request_pb2,
)
from inferway._xds_protos.envoy.extensions.load_balancing_policies.maglev.v3 import maglev_pb2
from inferway._xds_protos.envoy.extensions.load_balancing_policies.override_host.v3 import (
    override_host_pb2,
)
from inferway.gateway.picker.keeper import worker_warnings
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.dump import dump_policy
from inferway.resolve import resolve_policy
from inferway.state.model import ReplicaLoad, State
from inferway.xds import type_urls
from inferway.xds.translate import translate

POLICY = """\
listeners: [{name: edge, port: 18080}]
services:
  - name: llm
    endpoints: ["127.0.0.1:9000", "127.0.0.1:9001"]
    load_balancing: {policy: least_request, choice_count: 3}
    picker: PICKER
  - name: other
    endpoints: ["127.0.0.1:9002"]
routes:
  - {name: chat, match: {path: {prefix: /v1}}, backends: [{service: llm}]}
  - {name: rest, match: {path: {prefix: /}}, backends: [{service: other}]}
"""


UNBALANCED = POLICY.replace("    load_balancing: {policy: least_request, choice_count: 3}\n", "")
"""The policy without the service's own balancing (``process: envoy`` replaces it)."""


def _resources(picker: str, text: str = POLICY) -> tuple[
    hcm_pb2.HttpConnectionManager, route_pb2.RouteConfiguration, dict[str, cluster_pb2.Cluster]
]:  # fmt: skip
    policy = load_policy_text(text.replace("PICKER", picker), "policy.yaml")
    assert load_policy_text(dump_policy(policy), "again.yaml") == policy
    resources = translate(resolve_policy(policy))
    listener = resources.typed(type_urls.LISTENER, listener_pb2.Listener)["edge"]
    manager = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    routes = resources.typed(type_urls.ROUTE, route_pb2.RouteConfiguration)["edge"]
    return manager, routes, resources.typed(type_urls.CLUSTER, cluster_pb2.Cluster)


def _only_on_chat(routes: route_pb2.RouteConfiguration, off: Message) -> None:
    """The picker filter runs on the route to its service (``chat``) and is switched off, by
    ``off``'s per-route type, on the route to another service (``rest``)."""
    by_name = {r.name: r for r in routes.virtual_hosts[0].routes}
    assert "inferway.picker.llm" not in by_name["chat"].typed_per_filter_config
    assert by_name["rest"].typed_per_filter_config["inferway.picker.llm"].Unpack(off)
    assert {f.name: v for f, v in off.ListFields()} == {"disabled": True}


def test_own_picker_fail_closed() -> None:
    manager, routes, clusters = _resources(
        "{scorers: {queue: 2, kv_cache: 2, prefix: 3}, fail: closed, timeout: 0.2,"
        " transport: ext_proc}"
    )
    names = [f.name for f in manager.http_filters]
    assert names[-2:] == ["inferway.picker.llm", "envoy.filters.http.router"]
    config = ext_proc_pb2.ExternalProcessor()
    manager.http_filters[-2].typed_config.Unpack(config)
    assert not config.failure_mode_allow and config.status_on_error.code == 503
    assert config.message_timeout.ToMilliseconds() == 200
    assert config.grpc_service.envoy_grpc.cluster_name == "inferway_picker_llm"
    assert [(m.key, m.value) for m in config.grpc_service.initial_metadata] == [
        ("x-inferway-picker-service", "llm")
    ]
    assert list(config.metadata_options.receiving_namespaces.untyped) == ["envoy.lb"]
    _only_on_chat(routes, ext_proc_pb2.ExtProcPerRoute())
    picker_cluster = clusters["inferway_picker_llm"]
    address = picker_cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert (address.socket_address.address, address.socket_address.port_value) == (
        "127.0.0.1", 18094,
    )  # fmt: skip


def test_override_host_keeps_the_services_policy_as_fallback_and_eds() -> None:
    _, _, clusters = _resources("{}")
    llm = clusters["llm"]
    assert llm.type == cluster_pb2.Cluster.DiscoveryType.EDS and llm.health_checks
    assert not llm.HasField("least_request_lb_config")
    (policy,) = llm.load_balancing_policy.policies
    assert policy.typed_extension_config.name == "envoy.load_balancing_policies.override_host"
    override = override_host_pb2.OverrideHost()
    policy.typed_extension_config.typed_config.Unpack(override)
    assert override.override_host_sources[0].header == "x-gateway-destination-endpoint"
    metadata = override.override_host_sources[1].metadata
    assert (metadata.key, [p.key for p in metadata.path]) == (
        "envoy.lb", ["x-gateway-destination-endpoint"],
    )  # fmt: skip
    (fallback,) = override.fallback_policy.policies
    least = least_request_pb2.LeastRequest()
    fallback.typed_extension_config.typed_config.Unpack(least)
    assert least.choice_count.value == 3
    assert clusters["other"].lb_policy == cluster_pb2.Cluster.LbPolicy.ROUND_ROBIN


def test_external_picker_is_asked_and_fails_open_by_default() -> None:
    manager, _, clusters = _resources("{external: 'epp.internal:9002'}")
    config = ext_proc_pb2.ExternalProcessor()
    manager.http_filters[-2].typed_config.Unpack(config)
    assert config.failure_mode_allow
    cluster = clusters["inferway_picker_llm"]
    assert cluster.type == cluster_pb2.Cluster.DiscoveryType.STRICT_DNS


@pytest.mark.parametrize("fail", ["open", "closed"])
def test_http_transport_asks_over_ext_authz_and_logs_each_end(fail: str) -> None:
    manager, routes, clusters = _resources(
        f"{{transport: http, http_listen: '127.0.0.1:18100', fail: {fail}, timeout: 0.3}}"
    )
    assert manager.http_filters[-2].name == "inferway.picker.llm"
    config = ext_authz_pb2.ExtAuthz()
    assert manager.http_filters[-2].typed_config.Unpack(config)
    assert config.failure_mode_allow == (fail == "open")
    assert config.status_on_error.code == (503 if fail == "closed" else 0)
    service = config.http_service
    assert service.server_uri.uri == "http://127.0.0.1:18100"
    assert service.server_uri.cluster == "inferway_picker_http_llm"
    assert service.server_uri.timeout.ToMilliseconds() == 300
    assert service.path_prefix == "/pick/llm"
    allowed = service.authorization_response.allowed_upstream_headers.patterns
    assert [p.exact for p in allowed] == [
        "x-gateway-destination-endpoint", "x-inferway-picker-ticket",
    ]  # fmt: skip
    assert config.with_request_body.max_request_bytes == 1 << 20
    assert config.with_request_body.allow_partial_message
    assert [p.exact for p in config.allowed_headers.patterns] == ["x-session-id"]
    (log,) = manager.access_log
    assert log.name == "envoy.access_loggers.http_grpc"
    assert log.filter.header_filter.header.name == "x-inferway-picker-ticket"
    als = als_pb2.HttpGrpcAccessLogConfig()
    assert log.typed_config.Unpack(als)
    assert list(als.additional_request_headers_to_log) == ["x-inferway-picker-ticket"]
    assert als.common_config.grpc_service.envoy_grpc.cluster_name == "inferway_picker_llm"
    assert als.common_config.buffer_flush_interval.ToMilliseconds() == 10
    _only_on_chat(routes, ext_authz_pb2.ExtAuthzPerRoute())
    http = clusters["inferway_picker_http_llm"]
    address = http.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert address.socket_address.port_value == 18100
    assert not http.typed_extension_protocol_options  # HTTP/1.1
    assert clusters["inferway_picker_llm"].typed_extension_protocol_options  # gRPC: logs
    assert clusters["llm"].load_balancing_policy.policies[0].typed_extension_config.name == (
        "envoy.load_balancing_policies.override_host"
    )


def test_own_picker_is_asked_over_http_beside_listen_by_default() -> None:
    """inferway's own picker: ext_authz's HTTP service on ``listen``'s next port (gRPC, for
    the access log that ends picks and for GAIE callers, stays on ``listen``); an external
    picker: GAIE's ext_proc."""
    for picker, port in (("{}", 18095), ("{listen: '127.0.0.1:19000'}", 19001)):
        manager, _, clusters = _resources(picker)
        assert manager.http_filters[-2].typed_config.Is(ext_authz_pb2.ExtAuthz.DESCRIPTOR)
        http = clusters["inferway_picker_http_llm"]
        address = http.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
        assert address.socket_address.port_value == port
        assert [log.name for log in manager.access_log] == ["envoy.access_loggers.http_grpc"]
    policy = load_policy_text(POLICY.replace("PICKER", "{listen: '[::1]:19000'}"), "p.yaml")
    assert policy.services[0].picker is not None
    assert policy.services[0].picker.http_listen == "[::1]:19001"
    manager, _, _ = _resources("{external: 'epp.internal:9002'}")
    assert manager.http_filters[-2].typed_config.Is(ext_proc_pb2.ExternalProcessor.DESCRIPTOR)


def test_listen_port_0_leaves_http_listen_to_the_os_too() -> None:
    """``listen`` on port 0 (the OS picks, as tests do): ``http_listen`` is port 0 as well,
    not port 1, and two such pickers do not collide."""
    text = TWO.replace(
        'listen: "127.0.0.1:18092", http_listen: "127.0.0.1:18093"', 'listen: "127.0.0.1:0"'
    )
    policy = load_policy_text(text.replace("PICKER", '{listen: "127.0.0.1:0"}'), "policy.yaml")
    assert [s.picker.http_listen for s in policy.services if s.picker] == ["127.0.0.1:0"] * 2


def test_ext_proc_transport_adds_no_access_log() -> None:
    manager, _, clusters = _resources("{transport: ext_proc}")
    assert not manager.access_log and "inferway_picker_http_llm" not in clusters


@pytest.mark.parametrize(
    ("picker", "expected"),
    [
        ("{external: 'x:1', scorers: {queue: 1}}", "give only external, fail and timeout"),
        ("{external: 'nohost'}", "expected 'host:port'"),
        ("{scorers: {queue: 0, kv_cache: 0, prefix: 0, lora: 0}}", "every scorer weight is 0"),
        ("{fail: maybe}", "'open' or 'closed'"),
        ("{scorers: {cache: 1}}", "unknown key 'cache'"),
        ("{metrics_path: metrics}", "must start with '/'"),
        ("{external: 'x:1', transport: http}", "is asked over GAIE's ext_proc protocol"),
        ("{transport: grpc}", "'ext_proc' or 'http'"),
        ("{transport: http, http_listen: '127.0.0.1:18094'}", "give them different ports"),
        ("{transport: http, http_listen: 'nohost'}", "expected 'host:port'"),
        ("{process: envoy, listen: '127.0.0.1:1'}", "listen is for a picker Envoy asks"),
        ("{process: envoy, fail: closed, scorers: {queue: 1}}", "fail, scorers are for"),
        ("{prefix_bytes: 512}", "only apply with process: envoy"),
        ("{pick: score}", "pick: score is how Envoy picks with process: envoy"),
        ("{process: envoy, pick: score, prefix_bytes: 512}", "prefix_bytes is for a picker"),
        ("{process: envoy, pick: score, timeout: 1s}", "scores each request in its Lua"),
        ("{process: envoy, pick: random}", "'hash' or 'score'"),
        ("{process: envoy, load_bound: 0.5}", "must be at least 1.0, got 0.5"),
        ("{process: envoy, prefix_bytes: 8}", "must be at least 64, got 8"),
        ("{listen: '127.0.0.1:65535'}", "no next port for http_listen: give http_listen"),
    ],
)
def test_bad_pickers_are_located(picker: str, expected: str) -> None:
    with pytest.raises(PolicyError, match=rf"policy.yaml:6:.*{expected}"):
        load_policy_text(POLICY.replace("PICKER", picker), "policy.yaml")


TWO = """\
listeners: [{name: edge, port: 18080}]
services:
  - name: a
    endpoints: ["127.0.0.1:9000"]
    picker: {transport: http, listen: "127.0.0.1:18092", http_listen: "127.0.0.1:18093"}
  - name: b
    endpoints: ["127.0.0.1:9001"]
    picker: PICKER
routes:
  - {name: a, match: {path: {prefix: /a}}, backends: [{service: a}]}
  - {name: b, match: {path: {prefix: /b}}, backends: [{service: b}]}
"""


@pytest.mark.parametrize(
    ("picker", "expected"),
    [
        (
            '{transport: http, listen: "127.0.0.1:18094", http_listen: "127.0.0.1:18093"}',
            "is also the one of service 'a', whose picker listens on 127.0.0.1:18092",
        ),
        (
            '{transport: http, listen: "127.0.0.1:18094", http_listen: "127.0.0.1:18092"}',
            r"is the picker listen \(gRPC\) of service 'a'",
        ),
    ],
)
def test_http_listen_served_by_two_processes_is_refused(picker: str, expected: str) -> None:
    with pytest.raises(PolicyError, match=rf"policy.yaml:8:.*{expected}"):
        load_policy_text(TWO.replace("PICKER", picker), "policy.yaml")


def test_a_default_http_listen_on_a_neighbours_listen_is_refused() -> None:
    """a's http_listen defaults to its listen's next port, which is b's listen: said on a's
    picker, naming the default and the way out."""
    text = TWO.replace(', http_listen: "127.0.0.1:18093"', "").replace("transport: http, ", "")
    with pytest.raises(PolicyError) as error:
        load_policy_text(text.replace("PICKER", '{listen: "127.0.0.1:18093"}'), "policy.yaml")
    assert re.search(
        r"policy.yaml:5:.*service 'a': picker http_listen 127.0.0.1:18093 \(listen's next "
        r"port, the default\) is the picker listen \(gRPC\) of service 'b'",
        str(error.value),
    )


def test_services_sharing_listen_may_share_http_listen() -> None:
    same = '{transport: http, listen: "127.0.0.1:18092", http_listen: "127.0.0.1:18093"}'
    load_policy_text(TWO.replace("PICKER", same), "policy.yaml")
    load_policy_text(TWO.replace("PICKER", '{listen: "127.0.0.1:18094"}'), "policy.yaml")


def test_in_envoy_refuses_a_load_balancing_it_would_replace() -> None:
    with pytest.raises(PolicyError, match=r"policy.yaml:5:.*which replaces load_balancing"):
        load_policy_text(POLICY.replace("PICKER", "{process: envoy}"), "policy.yaml")


def test_in_envoy_hashes_the_prefix_and_balances_by_maglev_with_bounded_load() -> None:
    manager, routes, clusters = _resources(
        "{process: envoy, prefix_bytes: 2048, load_bound: 1.5}", UNBALANCED
    )
    names = [f.name for f in manager.http_filters]
    assert names[-2:] == ["inferway.picker.llm", "envoy.filters.http.router"]
    lua = lua_pb2.Lua()
    manager.http_filters[-2].typed_config.Unpack(lua)
    script = lua.default_source_code.inline_string
    assert "local PREFIX = 2048" in script and '"x-inferway-prefix-hash"' in script
    assert not manager.access_log  # no pick to end
    assert not [name for name in clusters if name.startswith("inferway_picker")]
    _only_on_chat(routes, lua_pb2.LuaPerRoute())
    llm = clusters["llm"]
    assert llm.type == cluster_pb2.Cluster.DiscoveryType.EDS and llm.health_checks
    (balancing,) = llm.load_balancing_policy.policies
    assert balancing.typed_extension_config.name == "envoy.load_balancing_policies.maglev"
    maglev = maglev_pb2.Maglev()
    balancing.typed_extension_config.typed_config.Unpack(maglev)
    consistent = maglev.consistent_hashing_lb_config
    assert consistent.hash_balance_factor.value == 150
    assert [h.header.header_name for h in consistent.hash_policy] == ["x-inferway-prefix-hash"]


def test_in_envoy_keeps_zone_weights() -> None:
    text = UNBALANCED.replace(
        'endpoints: ["127.0.0.1:9000", "127.0.0.1:9001"]',
        'endpoints: [{address: "127.0.0.1:9000", zone: a}, {address: "127.0.0.1:9001", zone: b}]',
    )
    policy = load_policy_text(text.replace("PICKER", "{process: envoy}"), "p.yaml")
    llm = translate(resolve_policy(policy)).typed(type_urls.CLUSTER, cluster_pb2.Cluster)["llm"]
    assert not llm.common_lb_config.HasField("locality_weighted_lb_config")
    maglev = maglev_pb2.Maglev()
    llm.load_balancing_policy.policies[0].typed_extension_config.typed_config.Unpack(maglev)
    assert maglev.HasField("locality_weighted_lb_config")
    assert maglev.consistent_hashing_lb_config.hash_balance_factor.value == 110


def test_in_envoy_takes_the_saturation_limits_and_sends_saturated_replicas_degraded() -> None:
    picker = "{process: envoy, queue_limit: 4, kv_cache_limit: 0.9, scrape_interval: 500ms}"
    policy = load_policy_text(UNBALANCED.replace("PICKER", picker), "p.yaml")
    assert load_policy_text(dump_policy(policy), "again.yaml") == policy
    (llm, _) = policy.services
    assert llm.picker is not None
    assert (llm.picker.queue_limit, llm.picker.kv_cache_limit) == (4, 0.9)
    state = State(saturated=MappingProxyType({"llm": frozenset({("127.0.0.1", 9001)})}))
    resources = translate(resolve_policy(policy, state))
    assignment = resources.typed(type_urls.ENDPOINT, endpoint_pb2.ClusterLoadAssignment)["llm"]
    health = {
        e.endpoint.address.socket_address.port_value: e.health_status
        for group in assignment.endpoints
        for e in group.lb_endpoints
    }
    unknown, degraded = (
        health_check_pb2.HealthStatus.UNKNOWN,
        health_check_pb2.HealthStatus.DEGRADED,
    )
    assert health == {9000: unknown, 9001: degraded}
    # the scoring picker's own settings are still refused with process: envoy
    with pytest.raises(PolicyError, match="fallbacks is for a picker Envoy asks"):
        load_policy_text(UNBALANCED.replace("PICKER", "{process: envoy, fallbacks: 1}"), "p.yaml")


def test_in_envoy_scored_runs_the_lua_picker_with_override_host_and_the_load_in_routes() -> None:
    """``pick: score``: the scoring picker's settings go into the Lua filter's code, the
    service's own balancing stays (override_host's fallback), and each route to the service
    carries the replicas' scraped load in its metadata, under the filter's name."""
    picker = (
        "{process: envoy, pick: score, scorers: {queue: 1, prefix: 5, session: 2}, "
        "queue_limit: 4, shed: true, fallbacks: 1, load_bound: 1.5}"
    )
    policy = load_policy_text(POLICY.replace("PICKER", picker), "p.yaml")
    assert load_policy_text(dump_policy(policy), "again.yaml") == policy
    load = MappingProxyType(
        {"llm": MappingProxyType({"127.0.0.1:9001": ReplicaLoad(depth=3, kv_cache=0.42)})}
    )
    resources = translate(resolve_policy(policy, State(picker_load=load)))
    listener = resources.typed(type_urls.LISTENER, listener_pb2.Listener)["edge"]
    manager = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    assert [f.name for f in manager.http_filters][-2] == "inferway.picker.llm"
    lua = lua_pb2.Lua()
    manager.http_filters[-2].typed_config.Unpack(lua)
    script = lua.default_source_code.inline_string
    for line in ("W_PREFIX = 5.0", "W_KV = 2.0", "QUEUE_LIMIT = 4.0", "SHED = true",
                 "HOME_LOAD_BOUND = 1.5",
                 "FALLBACKS = 1", 'SESSION_HEADER = "x-session-id"'):  # fmt: skip
        assert f"local {line}\n" in script, line
    assert "function envoy_on_request" in script and not manager.access_log
    clusters = resources.typed(type_urls.CLUSTER, cluster_pb2.Cluster)
    assert not [name for name in clusters if name.startswith("inferway_picker")]
    (balancing,) = clusters["llm"].load_balancing_policy.policies
    assert balancing.typed_extension_config.name.endswith("override_host")
    override = override_host_pb2.OverrideHost()
    balancing.typed_extension_config.typed_config.Unpack(override)
    fallback = override.fallback_policy.policies[0].typed_extension_config
    assert fallback.name.endswith("least_request")  # the service's own, kept
    routes = resources.typed(type_urls.ROUTE, route_pb2.RouteConfiguration)["edge"]
    _only_on_chat(routes, lua_pb2.LuaPerRoute())
    by_name = {r.name: r for r in routes.virtual_hosts[0].routes}
    meta = MessageToDict(by_name["chat"].metadata.filter_metadata["inferway.picker.llm"])
    assert meta["e"] == ["127.0.0.1:9000", "127.0.0.1:9001"]
    assert (meta["d"], meta["k"]) == ([-1, 3], [-1, 0.4])
    assert "inferway.picker.llm" not in by_name["rest"].metadata.filter_metadata
    # the load moved: the version with it; the same load: the same version (no push)
    again = translate(resolve_policy(policy, State(picker_load=load)))
    same = again.typed(type_urls.ROUTE, route_pb2.RouteConfiguration)["edge"]
    assert same == routes
    moved = MappingProxyType({"llm": MappingProxyType({"127.0.0.1:9001": ReplicaLoad(depth=4)})})
    other = translate(resolve_policy(policy, State(picker_load=moved)))
    changed = other.typed(type_urls.ROUTE, route_pb2.RouteConfiguration)["edge"]

    def version(config: route_pb2.RouteConfiguration) -> float:
        chat = next(r for r in config.virtual_hosts[0].routes if r.name == "chat")
        return float(MessageToDict(chat.metadata.filter_metadata["inferway.picker.llm"])["v"])

    assert version(routes) != version(changed)


def test_status_warns_of_a_scored_in_envoy_picker_behind_several_envoy_workers() -> None:
    scored = load_policy_text(
        UNBALANCED.replace("PICKER", "{process: envoy, pick: score}"), "p.yaml"
    )
    (warning,) = worker_warnings(scored, None)
    assert "service llm" in warning and "one per core" in warning
    assert "--envoy-concurrency 1" in warning
    assert "4 workers" in worker_warnings(scored, 4)[0]
    assert worker_warnings(scored, 1) == []
    hashed = load_policy_text(UNBALANCED.replace("PICKER", "{process: envoy}"), "p.yaml")
    assert worker_warnings(hashed, None) == [] and worker_warnings(None, None) == []
