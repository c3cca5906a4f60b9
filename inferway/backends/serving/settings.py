"""The serving limits, configured once for every front end: how large a request may be and how
long it may take when the caller names no deadline. The HTTP and gRPC servers both read these
through the serving core, so one setting refuses the same request on both wires."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # standard library only at run time: the CLI imports this before serving
    from inferway.backends.models.config import ModelConfig

__all__ = [
    "DEFAULT_BACKLOG",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_HTTP_FRONTEND",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "GRPC_FRAMING_HEADROOM_BYTES",
    "HTTP_FRONTENDS",
    "HTTP_FRONTEND_ENV",
    "HttpFrontend",
    "ServingSettings",
]

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
GRPC_FRAMING_HEADROOM_BYTES = 1024 * 1024
"""gRPC itself refuses a message above its receive limit before any handler sees it (with a
message of its own, and uncounted). The core must see a request just over the serving limit to
answer it as HTTP does, so the transport's limit sits this much above the serving limit."""
DEFAULT_BACKLOG = 4096
"""The HTTP listen backlog. aiohttp's 128 overflows when a burst of clients opens new
connections at once: the kernel drops their SYNs and each retries a second later, a stall,
where the queue limit should have answered 429 at once. (The kernel caps it at
net.core.somaxconn, 4096 on current kernels.)"""
DEFAULT_HEADER_TIMEOUT_S = 10.0
"""Seconds from a request's first byte to the end of its head: a client that sends part of
its headers and then nothing (slowloris) is cut off, not kept forever."""
DEFAULT_BODY_TIMEOUT_S = 60.0
"""Seconds from the end of a request's head to the end of its body (64 MiB at ~1 MiB/s)."""
DEFAULT_IDLE_TIMEOUT_S = 75.0
"""Seconds a keep-alive connection may sit idle between requests (aiohttp's default)."""
HttpFrontend = Literal["fast", "aiohttp"]
HTTP_FRONTENDS: tuple[HttpFrontend, ...] = ("fast", "aiohttp")
HTTP_FRONTEND_ENV = "INFERWAY_HTTP_FRONTEND"
"""Names the HTTP front end when the settings do not (``inferway serve --http-frontend``)."""
DEFAULT_HTTP_FRONTEND: HttpFrontend = "fast"


def _default_http_frontend() -> str:
    return os.environ.get(HTTP_FRONTEND_ENV) or DEFAULT_HTTP_FRONTEND


@dataclass(frozen=True, slots=True)
class ServingSettings:
    """``max_body_bytes`` caps every request (a model's ``max_input_bytes`` can only lower it);
    ``default_timeout_s`` bounds requests that name no deadline of their own (None: unbounded);
    ``record_outputs`` > 0 keeps digests of that many recent answers by request id, for a
    rollout's output-agreement check (telemetry/output_digest.py; 0: off); ``mask``: built-in
    names (``email``, ``phone``, ``id_number``) and RE2 patterns masked in the backend's log
    lines, span errors and recorded text outputs (observability/masking.py).
    ``http_frontend``: ``fast`` serves infer requests with protocol/fast_http.py (httptools)
    and hands every other request to aiohttp; ``aiohttp`` serves all with aiohttp (default:
    $INFERWAY_HTTP_FRONTEND, else DEFAULT_HTTP_FRONTEND). The slow-client limits, in
    seconds: ``header_timeout_s`` from a request's first byte to the end of its head,
    ``body_timeout_s`` from there to the end of its body, ``idle_timeout_s`` between
    requests on a keep-alive connection; past one the connection is closed (408 when no
    answer is owed first)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    default_timeout_s: float | None = None
    record_outputs: int = 0
    mask: tuple[str, ...] = ()
    http_frontend: str = field(default_factory=_default_http_frontend)
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not value > 0 or value == float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if isinstance(self.max_body_bytes, bool) or self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes!r}")
        if self.default_timeout_s is not None and not self.default_timeout_s > 0:
            raise ValueError(
                f"default_timeout_s must be > 0 seconds or None, got {self.default_timeout_s!r}"
            )
        if isinstance(self.record_outputs, bool) or self.record_outputs < 0:
            raise ValueError(f"record_outputs must be >= 0, got {self.record_outputs!r}")
        if self.http_frontend not in HTTP_FRONTENDS:
            raise ValueError(
                f"http_frontend must be one of {', '.join(HTTP_FRONTENDS)}, got "
                f"{self.http_frontend!r} (from ${HTTP_FRONTEND_ENV} when not given)"
            )

    def body_limit(self, config: ModelConfig) -> int:
        """The largest request body accepted for a model with this config."""
        return min(config.max_input_bytes, self.max_body_bytes)

    @property
    def grpc_max_message_bytes(self) -> int:
        """The receive limit to give gRPC itself (see GRPC_FRAMING_HEADROOM_BYTES)."""
        return self.max_body_bytes + GRPC_FRAMING_HEADROOM_BYTES

    def timeout_s(self, requested: float | None, transport: float | None) -> float | None:
        """The request's deadline in seconds from now: the tighter of what the request asked
        (its ``timeout`` parameter) and what its transport imposes (the gRPC deadline, Envoy's
        expected timeout), else the configured default."""
        if requested is None:
            return self.default_timeout_s if transport is None else transport
        return requested if transport is None else min(requested, transport)
