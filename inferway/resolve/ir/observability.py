"""IR of the observability settings: tracing through an OTLP collector, JSON access logs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AccessLogIR", "LogFieldIR", "MaskSinkIR", "ObservabilityIR", "TracingIR"]


@dataclass(frozen=True)
class MaskSinkIR:
    """The gateway's masking sink: Envoy sends it access log lines (OTLP logs) and spans
    (OTLP traces); it masks them, then writes the lines and forwards the spans."""

    host: str
    port: int


@dataclass(frozen=True)
class TracingIR:
    collector_host: str
    collector_port: int
    collector_connect_timeout: float
    service_name: str
    sampling_percent: float
    timeout: float
    via_mask_sink: bool = False
    """Spans go to the mask sink (collector_host/port), which forwards them masked."""


@dataclass(frozen=True)
class LogFieldIR:
    name: str
    format: str


@dataclass(frozen=True)
class AccessLogIR:
    path: str
    """``stdout``, ``stderr`` or an absolute file path."""
    extra_fields: tuple[LogFieldIR, ...]
    mask_sink: MaskSinkIR | None = None
    """Set: lines go to the mask sink (OTLP logs), which masks and writes them to ``path``."""


@dataclass(frozen=True)
class ObservabilityIR:
    tracing: TracingIR | None
    access_log: AccessLogIR | None
    """None when off (absent, or ``enabled: false``)."""
