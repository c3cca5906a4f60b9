"""IR of the observability settings: tracing through an OTLP collector, JSON access logs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AccessLogIR", "LogFieldIR", "ObservabilityIR", "TracingIR"]


@dataclass(frozen=True)
class TracingIR:
    collector_host: str
    collector_port: int
    collector_connect_timeout: float
    service_name: str
    sampling_percent: float
    timeout: float


@dataclass(frozen=True)
class LogFieldIR:
    name: str
    format: str


@dataclass(frozen=True)
class AccessLogIR:
    path: str
    """``stdout``, ``stderr`` or an absolute file path."""
    extra_fields: tuple[LogFieldIR, ...]


@dataclass(frozen=True)
class ObservabilityIR:
    tracing: TracingIR | None
    access_log: AccessLogIR | None
    """None when off (absent, or ``enabled: false``)."""
