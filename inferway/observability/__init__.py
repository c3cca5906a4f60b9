"""Observability helpers shared by inferway's processes (OpenTelemetry setup)."""

from inferway.observability.otel import setup_tracing

__all__ = ["setup_tracing"]
