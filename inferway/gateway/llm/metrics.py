"""The LLM gateway's metrics on the gateway's ``/metrics``: token and request counters by
route, model, backend and client, and OpenTelemetry's ``gen_ai.*`` histograms under their
Prometheus names (``gen_ai.client.token.usage`` -> ``gen_ai_client_token_usage``). The names
are fixed: cost rules and alerts (deploy/prometheus/) are written against them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["Exchange", "LlmMetrics", "record_span"]

# OpenTelemetry semantic conventions' advised buckets (gen-ai-metrics.md).
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


@dataclass(frozen=True)
class Exchange:
    """One finished request, as the processor saw it."""

    route: str
    model: str
    """The model the backend serves (aliases resolved)."""
    requested_model: str
    response_model: str
    backend: str
    client: str
    operation: str
    stream: bool
    code: int
    """The answer's status (0: none came)."""
    input_tokens: int
    output_tokens: int
    estimated: bool
    ttft_s: float | None
    time_per_output_token_s: float | None


class LlmMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.tokens = Counter(
            "inferway_llm_tokens",
            "Tokens through the LLM gateway (type input/output; estimated when the engine "
            "reported no usage and chunks or bytes were counted).",
            ["route", "model", "backend", "client", "type", "estimated"],
            registry=registry,
        )
        self.requests = Counter(
            "inferway_llm_requests",
            "OpenAI-compatible requests through the LLM gateway, by answer status.",
            ["route", "model", "backend", "client", "stream", "code"],
            registry=registry,
        )
        self.limited = Counter(
            "inferway_llm_limited_requests",
            "Requests refused (429) because the client key used up a token limit, by limit.",
            ["client", "limit"],
            registry=registry,
        )
        self.token_usage = Histogram(
            "gen_ai_client_token_usage",
            "Tokens per request (OpenTelemetry gen_ai.client.token.usage).",
            [
                "gen_ai_operation_name",
                "gen_ai_request_model",
                "gen_ai_response_model",
                "gen_ai_token_type",
            ],
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from the request to the first generated token of a stream, at the gateway "
            "(OpenTelemetry gen_ai.server.time_to_first_token).",
            ["route", "model", "backend"],
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Time between output tokens after the first (ITL), at the gateway (OpenTelemetry "
            "gen_ai.server.time_per_output_token).",
            ["route", "model", "backend"],
            buckets=_TPOT_BUCKETS,
            registry=registry,
        )

    def record(self, x: Exchange) -> None:
        estimated = "true" if x.estimated else "false"
        who = (x.route, x.model, x.backend, x.client)
        self.requests.labels(*who, "true" if x.stream else "false", str(x.code)).inc()
        for kind, count in (("input", x.input_tokens), ("output", x.output_tokens)):
            if count:
                self.tokens.labels(*who, kind, estimated).inc(count)
                self.token_usage.labels(
                    x.operation, x.requested_model, x.response_model, kind
                ).observe(count)
        if x.ttft_s is not None:
            self.ttft.labels(x.route, x.model, x.backend).observe(x.ttft_s)
        if x.time_per_output_token_s is not None:
            self.tpot.labels(x.route, x.model, x.backend).observe(x.time_per_output_token_s)


def record_span(tracer: trace.Tracer, x: Exchange, started: float, now: float) -> None:
    """A ``gen_ai`` span for the request (a no-op unless tracing is set up)."""
    end_ns = time.time_ns()
    start_ns = end_ns - int((now - started) * 1e9)
    span = tracer.start_span(f"{x.operation} {x.model}", start_time=start_ns)
    span.set_attributes(
        {
            "gen_ai.operation.name": x.operation,
            "gen_ai.request.model": x.requested_model,
            "gen_ai.response.model": x.response_model,
            "gen_ai.usage.input_tokens": x.input_tokens,
            "gen_ai.usage.output_tokens": x.output_tokens,
            "inferway.llm.route": x.route,
            "inferway.llm.backend": x.backend,
            "inferway.llm.client": x.client,
            "inferway.llm.estimated": x.estimated,
            "http.response.status_code": x.code,
        }
    )
    span.end(end_time=end_ns)
