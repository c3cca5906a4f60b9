"""A listener's slow-client and size limits in Envoy (policies/listener_limits.py): the HTTP
connection manager's header, idle and request timeouts, and a first route that answers a
declared body above ``max_request_bytes`` with 413 at once. (Envoy has no body limit of its
own that answers before the body comes: the buffer filter would wait for the bytes. A
Content-Length range match decides on the header alone; a body without one, chunked or
HTTP/2, is bounded by the backend's own limit as it streams.)"""

from __future__ import annotations

import json

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.type.v3 import range_pb2
from inferway.resolve.ir.listener import ListenerIR
from inferway.xds.translate._protos import duration

__all__ = ["apply_listener_timeouts", "build_too_large_route", "too_large_route_name"]

_INT64_END = 2**63 - 1


def apply_listener_timeouts(manager: hcm_pb2.HttpConnectionManager, listener: ListenerIR) -> None:
    """Set the listener's timeouts on its connection manager (0 in Envoy turns one off)."""
    limits = listener.limits
    manager.request_headers_timeout.CopyFrom(duration(limits.request_headers_timeout_s))
    manager.stream_idle_timeout.CopyFrom(duration(limits.stream_idle_timeout_s))
    manager.request_timeout.CopyFrom(duration(limits.request_timeout_s))


def too_large_route_name(listener: ListenerIR) -> str:
    """``<listener>_too_large`` (``_`` is never in a policy name)."""
    return f"{listener.name}_too_large"


def build_too_large_route(listener: ListenerIR) -> rc_pb2.Route:
    """Any request declaring a body above the limit: 413 with a JSON error, before a byte
    of the body is read or a backend is asked."""
    limit = listener.limits.max_request_bytes
    body = json.dumps(
        {
            "error": f"request body larger than {limit} bytes, the limit of listener "
            f"'{listener.name}' (limits.max_request_bytes)"
        }
    )
    return rc_pb2.Route(
        name=too_large_route_name(listener),
        match=rc_pb2.RouteMatch(
            prefix="/",
            headers=[
                rc_pb2.HeaderMatcher(
                    name="content-length",
                    range_match=range_pb2.Int64Range(start=limit + 1, end=_INT64_END),
                )
            ],
        ),
        direct_response=rc_pb2.DirectResponseAction(
            status=413, body=base_pb2.DataSource(inline_string=body)
        ),
        response_headers_to_add=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="content-type", value="application/json"),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            ),
        ],
    )
