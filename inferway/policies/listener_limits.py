"""A listener's slow-client and size limits (issue 33): on by default, so a client that sends
part of its headers or body and then nothing is cut off, and a declared body larger than the
backend accepts is refused at once (413) instead of being waited for.

    listeners:
      - name: public
        port: 10000
        limits:
          request_headers_timeout: 10s   # first byte to the end of the headers
          stream_idle_timeout: 5m        # no byte either way on a request for this long
          request_timeout: 5m            # the whole request (not the answer) received
          max_request_bytes: 67108864    # Content-Length above it: 413 from Envoy

A timeout of 0 turns it off (a long-lived gRPC stream needs ``request_timeout: 0``: its
request lasts as long as the stream). ``max_request_bytes`` defaults to the backend's
``--max-body-bytes`` default (64 MiB)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from inferway.policies.types import parse_duration

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_REQUEST_HEADERS_TIMEOUT_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_STREAM_IDLE_TIMEOUT_S",
    "ListenerLimits",
]

DEFAULT_REQUEST_HEADERS_TIMEOUT_S = 10.0
DEFAULT_STREAM_IDLE_TIMEOUT_S = 300.0
DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""The backend's DEFAULT_MAX_BODY_BYTES (serving/settings.py; the gateway does not import the
backend): a request the backend would refuse is refused by Envoy before it is forwarded."""

_LimitSeconds = Annotated[
    float, BeforeValidator(parse_duration), Field(ge=0, le=86400, allow_inf_nan=False)
]
"""Seconds, 0 (off) to one day; '10s', '5m' or a number."""


class ListenerLimits(BaseModel):
    """What a client may take and send on a listener before Envoy cuts it off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_headers_timeout: _LimitSeconds = DEFAULT_REQUEST_HEADERS_TIMEOUT_S
    stream_idle_timeout: _LimitSeconds = DEFAULT_STREAM_IDLE_TIMEOUT_S
    request_timeout: _LimitSeconds = DEFAULT_REQUEST_TIMEOUT_S
    max_request_bytes: int = Field(default=DEFAULT_MAX_REQUEST_BYTES, ge=1, le=2**53, strict=True)
