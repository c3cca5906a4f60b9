"""What every connection of the fast front end shares (fast_http_connection.py reads it,
fast_http.py's server owns it): the serving core, aiohttp for the requests it hands over,
the limits and timeouts, the decode and route memos, the open connections and the counters."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web_server

from inferway.backends.protocol.decode_plans import DecodePlans
from inferway.backends.protocol.fast_wire import FastCall, RepeatedHead, RouteMemo
from inferway.backends.protocol.http_server import ENVOY_TIMEOUT_HEADER
from inferway.backends.serving.core import ServingCore
from inferway.backends.telemetry import tracing

__all__ = ["Connection", "FrontEnd"]


class Connection(Protocol):
    """What the server asks of a connection (the sweep and the close)."""

    def close_if_idle(self, now: float | None) -> None: ...

    def abort(self) -> None: ...


class FrontEnd:
    """The fast front end's shared state over ``core``; requests it does not serve go to
    connections of ``aiohttp_server`` (an AppRunner's ``server``)."""

    def __init__(self, core: ServingCore, aiohttp_server: web_server.Server) -> None:
        self.core = core
        self.aiohttp_server = aiohttp_server
        self.max_body_bytes = core.settings.max_body_bytes
        self.plans = DecodePlans()
        """Binary-extension heads seen before, decoded once (see decode_plans)."""
        self.connections: set[Connection] = set()
        self.route = RouteMemo()
        """``hot_route``, remembered per URL."""
        self.repeated_heads = 0
        """Requests taken without the parser: they repeated their connection's last head, or
        ``last_head``."""
        self.last_head: RepeatedHead | None = None
        """The last repeatable head any connection sent, for connections that repeat it."""
        settings = core.settings
        self.header_timeout_s = settings.header_timeout_s
        self.body_timeout_s = settings.body_timeout_s
        self.idle_timeout_s = settings.idle_timeout_s
        self.timed_out = 0
        """Connections closed because a request's head or body came too slowly."""
        self.closing = False

    def plain(self, call: FastCall) -> bool:
        """Whether ``call`` may take the core's callback path (ServingCore.submit): it needs
        no request span, no answer digest, and names no deadline (which ``infer`` bounds
        even while its batch runs)."""
        core = self.core
        return (
            core.outputs is None
            and core.settings.default_timeout_s is None
            and ENVOY_TIMEOUT_HEADER not in call.headers
            and not call.may_name_timeout()
            and not tracing.is_tracing(core.tracer)
        )
