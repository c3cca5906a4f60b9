"""Observability in the IR: tracing and access logs with their defaults applied."""

from __future__ import annotations

from inferway.policies.masking import Mask
from inferway.policies.observability import Observability
from inferway.resolve.ir.observability import (
    AccessLogIR,
    LogFieldIR,
    MaskSinkIR,
    ObservabilityIR,
    TracingIR,
)

__all__ = ["COLLECTOR_CONNECT_TIMEOUT", "resolve_observability"]

COLLECTOR_CONNECT_TIMEOUT = 1.0
"""Seconds Envoy waits to connect to the OTLP collector."""


def resolve_observability(
    observability: Observability | None, mask: Mask | None = None
) -> ObservabilityIR:
    """With ``mask``, Envoy's spans and access log lines go through the gateway's mask sink
    (Envoy cannot rewrite a logged value itself); the sink reads the real collector and the
    log path from the live policy."""
    if observability is None:
        return ObservabilityIR(tracing=None, access_log=None)
    sink = None if mask is None else MaskSinkIR(host=mask.sink.address, port=mask.sink.port)
    tracing, access_log = observability.tracing, observability.access_log
    traced: TracingIR | None = None
    if tracing is not None:
        host, port = tracing.collector_host_port
        if sink is not None:
            host, port = sink.host, sink.port
        traced = TracingIR(
            collector_host=host,
            collector_port=port,
            collector_connect_timeout=COLLECTOR_CONNECT_TIMEOUT,
            service_name=tracing.service_name,
            sampling_percent=round(tracing.sampling_percent, 2),
            timeout=tracing.timeout,
            via_mask_sink=sink is not None,
        )
    logged: AccessLogIR | None = None
    if access_log is not None and access_log.enabled:
        logged = AccessLogIR(
            path=access_log.path,
            extra_fields=tuple(
                LogFieldIR(name=name, format=fmt) for name, fmt in access_log.extra_fields.items()
            ),
            mask_sink=sink,
        )
    return ObservabilityIR(tracing=traced, access_log=logged)
