"""The policy's ``observability`` section: distributed tracing and access logs through Envoy.

.. code-block:: yaml

    observability:
      tracing:
        collector: 127.0.0.1:4317      # OTLP/gRPC collector (host:port)
        service_name: inferway-gateway
        sampling_percent: 1.5          # 0..100, 0.01 resolution
      access_log:
        path: stdout                   # or a file path
        extra_fields:                  # more JSON keys, Envoy command operators
          user_agent: "%REQ(USER-AGENT)%"

Envoy creates the ingress span and propagates W3C ``traceparent``; backends continue the same
trace. Access log lines are JSON with the request id and trace id, so a log line leads to its
trace. Credentials (Authorization, cookies, API keys) never appear in either.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferway.observability.redaction import CREDENTIAL_HEADERS
from inferway.policies.types import split_host_port

__all__ = ["AccessLog", "Observability", "Tracing", "logged_headers"]

_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_HEADER_OPERATOR = re.compile(r"%(?:REQ|RESP|TRAILER|REQ_WITHOUT_QUERY)\(([^)]*)\)", re.IGNORECASE)


def logged_headers(fmt: str) -> list[str]:
    """Header names an Envoy format string reads (``%REQ(A?B):N%`` reads A and B)."""
    found: list[str] = []
    for inner in _HEADER_OPERATOR.findall(fmt):
        for part in inner.split("?"):
            name = part.split(":")[0].strip().lower()
            if name and name not in found:
                found.append(name)
    return found


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


class Tracing(_Model):
    """Where Envoy sends its spans and how many requests it traces."""

    collector: str = Field(min_length=3)
    """OTLP/gRPC collector address, ``host:port`` (e.g. ``127.0.0.1:4317``)."""
    service_name: str = Field(default="inferway-gateway", min_length=1, max_length=128)
    sampling_percent: Annotated[float, Field(ge=0, le=100)] = 100.0
    """Share of new requests traced, 0..100 with 0.01 resolution. A caller's sampled
    ``traceparent`` is honoured whatever this says."""
    protocol: Literal["grpc"] = "grpc"
    timeout: Annotated[float, Field(gt=0, le=60)] = 1.0
    """Seconds Envoy waits for the collector per export."""

    @field_validator("collector")
    @classmethod
    def _host_port(cls, value: str) -> str:
        if "://" in value:
            raise ValueError(
                f"collector is 'host:port' without a scheme (e.g. 127.0.0.1:4317), got {value!r}"
            )
        split_host_port(value)
        return value

    @field_validator("sampling_percent")
    @classmethod
    def _resolution(cls, value: float) -> float:
        if abs(value * 100 - round(value * 100)) > 1e-6:
            raise ValueError(f"sampling_percent has 0.01 resolution (e.g. 0.05), got {value:g}")
        return value

    @property
    def collector_host_port(self) -> tuple[str, int]:
        return split_host_port(self.collector)


class AccessLog(_Model):
    """Structured JSON access logs, one line per request."""

    enabled: bool = True
    path: str = Field(default="stdout", min_length=1)
    """``stdout``, ``stderr`` or an absolute file path."""
    format: Literal["json"] = "json"
    extra_fields: dict[str, str] = Field(default_factory=dict)
    """More JSON keys: name -> Envoy format string (e.g. ``"%REQ(USER-AGENT)%"``)."""

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if value not in ("stdout", "stderr") and not value.startswith("/"):
            raise ValueError(f"path is 'stdout', 'stderr' or an absolute file path, got {value!r}")
        return value

    @field_validator("extra_fields")
    @classmethod
    def _fields(cls, value: dict[str, str]) -> dict[str, str]:
        for name, fmt in value.items():
            if not _FIELD_NAME.match(name):
                raise ValueError(
                    f"extra field name {name!r}: letters, digits, '_', '.', '-' (max 64)"
                )
            for base in logged_headers(fmt):
                if base in CREDENTIAL_HEADERS:
                    raise ValueError(
                        f"extra field {name!r} would log the {base!r} header, which carries "
                        "credentials and is never logged"
                    )
        return value


class Observability(_Model):
    tracing: Tracing | None = None
    access_log: AccessLog | None = None
