"""Observability, pure parts: the policy section, its translation, the trace tree, the sampler,
and the control plane's own spans."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Link, SpanContext, TraceFlags
from pydantic import ValidationError
from rich.console import Console

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.trace.v3 import opentelemetry_pb2
from inferway._xds_protos.envoy.extensions.access_loggers.file.v3 import file_pb2
from inferway._xds_protos.envoy.extensions.upstreams.http.v3 import (
    http_protocol_options_pb2 as hpo_pb2,
)
from inferway.devtools.otlp_receiver import ReceivedSpan
from inferway.devtools.trace_tree import build_trace_tree, find_trace_id, render_trace_tree
from inferway.gateway.control_plane import ControlPlane
from inferway.observability.otel import build_sampler, setup_tracing
from inferway.policies.checks import check_policy
from inferway.policies.model import Policy
from inferway.policies.observability import AccessLog, Tracing
from inferway.resolve import resolve_policy
from inferway.resolve.ir.observability import AccessLogIR, LogFieldIR
from inferway.xds.cache import SnapshotCache
from inferway.xds.translate import names
from inferway.xds.translate.access_log import ACCESS_LOG_FIELDS, build_access_log
from inferway.xds.translate.listener import build_http_connection_manager
from inferway.xds.translate.tracing import COLLECTOR_CLUSTER, build_collector_cluster

T, OTHER = "a" * 32, "b" * 32


def _span(span_id, parent="", *, trace_id=T, name="s", start=0, end=10, links=(), **attrs):
    return ReceivedSpan(
        service="svc",
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        kind="server",
        start_ns=start,
        end_ns=end,
        attributes=attrs,
        links=tuple(links),
    )


def _policy(**observability) -> Policy:
    return Policy.model_validate(
        {
            "listeners": [{"name": "edge", "port": 10000}],
            "services": [{"name": "m", "endpoints": ["127.0.0.1:8000"]}],
            "routes": [{"name": "r", "backends": [{"service": "m"}]}],
            "observability": observability,
        }
    )


# -- schema ------------------------------------------------------------------------------


def test_tracing_schema_checks_collector_and_sampling_resolution() -> None:
    assert Tracing(collector="127.0.0.1:4317", sampling_percent=0.01).sampling_percent == 0.01
    with pytest.raises(ValidationError, match=r"0\.01 resolution"):
        Tracing(collector="127.0.0.1:4317", sampling_percent=0.005)
    with pytest.raises(ValidationError, match="without a scheme"):
        Tracing(collector="http://127.0.0.1:4317")
    with pytest.raises(ValidationError, match="host:port"):
        Tracing(collector="collector")
    with pytest.raises(ValidationError):
        Tracing(collector="127.0.0.1:4317", sampling_percent=101)


def test_access_log_refuses_credential_headers_and_relative_paths() -> None:
    with pytest.raises(ValidationError, match="authorization"):
        AccessLog(extra_fields={"auth": "%REQ(Authorization)%"})
    with pytest.raises(ValidationError, match="x-api-key"):
        AccessLog(extra_fields={"k": "%REQ(X-FOO?X-API-KEY)%"})
    with pytest.raises(ValidationError, match="absolute"):
        AccessLog(path="logs/access.log")
    assert AccessLog(extra_fields={"ua": "%REQ(USER-AGENT)%"}).path == "stdout"


def test_check_refuses_an_extra_field_logging_a_redacted_header() -> None:
    policy = _policy(access_log={"extra_fields": {"tenant": "%REQ(X-Tenant-Token)%"}})
    policy = policy.model_copy(update={"redact_headers": ["x-tenant-token"]})
    issues = [message for _, message in check_policy(policy) if "x-tenant-token" in message]
    assert len(issues) == 1, f"reported once, not {issues}"


# -- translation -------------------------------------------------------------------------


def test_tracing_translates_to_an_opentelemetry_tracer_and_an_http2_collector() -> None:
    policy = _policy(tracing={"collector": "127.0.0.1:4317", "sampling_percent": 12.5})
    ir = resolve_policy(policy)
    manager = build_http_connection_manager(ir.listeners[0], observability=ir.observability)
    assert manager.tracing.random_sampling.value == 12.5
    assert manager.always_set_request_id_in_response
    config = opentelemetry_pb2.OpenTelemetryConfig()
    manager.tracing.provider.typed_config.Unpack(config)
    assert config.grpc_service.envoy_grpc.cluster_name == COLLECTOR_CLUSTER
    assert config.service_name == "inferway-gateway"
    assert [(t.tag, t.request_header.name) for t in manager.tracing.custom_tags] == [
        ("request_id", "x-request-id"),
        ("inferway.picker.prefix_hash", "x-inferway-prefix-hash"),
        ("inferway.picker.winner", ""),
        ("inferway.picker.reason", ""),
    ]
    picked = manager.tracing.custom_tags[3].metadata  # a pick: score picker's, in Lua
    assert picked.kind.HasField("request") and picked.metadata_key.key == "inferway.picker"
    assert [p.key for p in picked.metadata_key.path] == ["reason"]

    cluster = build_collector_cluster(ir.observability.tracing)  # type: ignore[arg-type]
    options = hpo_pb2.HttpProtocolOptions()
    cluster.typed_extension_protocol_options[names.HTTP_PROTOCOL_OPTIONS].Unpack(options)
    assert options.explicit_http_config.HasField("http2_protocol_options")
    address = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert (address.socket_address.address, address.socket_address.port_value) == (
        "127.0.0.1",
        4317,
    )


def test_a_collector_hostname_resolves_ipv4_first_like_service_clusters() -> None:
    ir = resolve_policy(_policy(tracing={"collector": "otel.example:4317"}))
    cluster = build_collector_cluster(ir.observability.tracing)  # type: ignore[arg-type]
    assert cluster.type == cluster_pb2.Cluster.DiscoveryType.STRICT_DNS
    assert cluster.dns_lookup_family == cluster_pb2.Cluster.DnsLookupFamily.V4_PREFERRED


def test_access_log_translates_to_json_lines_with_request_and_trace_ids() -> None:
    log = build_access_log(
        AccessLogIR(path="/var/log/a.log", extra_fields=(LogFieldIR("ua", "%REQ(UA)%"),))
    )
    config = file_pb2.FileAccessLog()
    log.typed_config.Unpack(config)
    fields = {k: v.string_value for k, v in config.log_format.json_format.fields.items()}
    assert config.path == "/var/log/a.log"
    assert fields["request_id"] == "%REQ(X-REQUEST-ID)%" and fields["trace_id"] == "%TRACE_ID%"
    assert set(ACCESS_LOG_FIELDS) | {"ua"} == set(fields)
    assert not any("AUTHORIZATION" in v.upper() for v in fields.values())


def test_no_observability_leaves_the_manager_untouched() -> None:
    ir = resolve_policy(_policy())
    manager = build_http_connection_manager(ir.listeners[0], observability=ir.observability)
    assert not manager.HasField("tracing") and not manager.access_log


# -- trace tree --------------------------------------------------------------------------


def test_trace_tree_nests_children_and_hangs_linked_batches_under_their_requests() -> None:
    envoy = _span("e1", name="ingress", start=0, end=100, request_id="rid-1")
    server = _span("s1", "e1", name="infer demo", start=10, end=90, request_id="rid-1")
    orphan = _span("o1", "missing", name="late", start=50, end=60)
    batch = _span(
        "b1",
        trace_id=OTHER,
        name="batch demo",
        start=40,
        end=80,
        links=[(T, "s1"), (OTHER, "zz")],
        **{"batch.requests": 2, "batch.size": 3},
    )
    unrelated = _span("u1", trace_id=OTHER, name="other")
    spans = [batch, orphan, server, envoy, unrelated]
    assert find_trace_id(spans, "rid-1") == T and find_trace_id(spans, "nope") is None

    roots = build_trace_tree(spans, T)
    assert [r.span.span_id for r in roots] == ["e1", "o1"]  # an orphan is kept as a root
    (child,) = roots[0].children
    assert child.span.span_id == "s1" and not child.linked
    assert [(n.span.span_id, n.linked) for n in child.children] == [("b1", True)]

    console = Console(width=200, record=True)
    console.print(render_trace_tree(roots))
    text = console.export_text()
    assert "ingress" in text and "infer demo" in text and "linked" in text
    assert "batch of 2 request(s), 3 row(s)" in text and "queue wait" in text
    assert "request_id=rid-1" in text


# -- sampler and control plane spans -----------------------------------------------------


def _context(sampled: bool) -> SpanContext:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return SpanContext(int(T, 16), 1, is_remote=True, trace_flags=flags)


def test_batch_spans_follow_the_sampling_of_the_requests_they_link() -> None:
    sampler = build_sampler(1.0)
    unsampled = sampler.should_sample(None, 7, "batch", links=[Link(_context(False))])
    sampled = sampler.should_sample(
        None, 7, "batch", links=[Link(_context(False)), Link(_context(True))]
    )
    plain_root = sampler.should_sample(None, 7, "root")
    assert unsampled.decision == Decision.DROP
    assert sampled.decision == Decision.RECORD_AND_SAMPLE
    assert plain_root.decision == Decision.RECORD_AND_SAMPLE
    assert build_sampler(0.0).should_sample(None, 7, "root").decision == Decision.DROP


def test_the_control_plane_traces_translate_and_push() -> None:
    exporter = InMemorySpanExporter()
    provider = setup_tracing("test-control-plane", exporters=[exporter])
    # setup_tracing installs an SDK provider globally (or extends the one already there)
    assert hasattr(trace.get_tracer_provider(), "force_flush"), trace.get_tracer_provider()
    ControlPlane(SnapshotCache()).apply_policy(_policy(), "policy.yaml")
    provider.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    apply, translate, push = spans["apply policy"], spans["translate"], spans["push snapshot"]
    assert translate.parent.span_id == apply.context.span_id  # type: ignore[union-attr]
    assert push.parent.span_id == apply.context.span_id  # type: ignore[union-attr]
    assert apply.attributes["inferway.policy.source"] == "policy.yaml"
    assert apply.attributes["inferway.snapshot.version"]
