"""``picker: {transport: http}``: inferway's picker answering Envoy's ``ext_authz`` HTTP
service, one plain HTTP/1.1 request per pick over Envoy's keep-alive connections.

Envoy holds the request's headers until the answer, sends the request's body with it
(``with_request_body``) and the original path after the filter's prefix: ``POST
/pick/<service><path>``. The answer:

* 200 with ``x-gateway-destination-endpoint: ip:port,ip:port…`` (winner, then the ordered
  fallbacks, as the ext_proc answer lists them) and ``x-inferway-picker-ticket``; Envoy copies
  both onto the request (``allowed_upstream_headers``) and ``override_host`` reads the first;
* 503 (no endpoint, or a service this process does not pick for) or 429 (every replica
  saturated and the policy sheds) with a JSON body: ext_authz passes a denial's status and body
  to the client.

ext_authz sends nothing when the request ends, but the queue scorer counts a pick in flight
until ``Picker.finish``: Envoy's gRPC access log (an entry per request, answered, reset or timed
out, batched) carries the ticket header to the picker's gRPC server (server.py), which ends
the pick.

Why this lane exists: over ext_proc the picker spends most of its CPU per request in grpc.aio's
per-message work (two messages each way); here a pick costs one httptools parse and one write
(bench/picker_transport.py measures both through Envoy).
"""

from __future__ import annotations

import asyncio
import json
import logging

from inferway.gateway.envoy_http_lane import LaneConnection, LaneServer
from inferway.gateway.picker.core.picker import Pick
from inferway.gateway.picker.server import PoolPicker, _parse, pick_for
from inferway.xds.translate.picker import DESTINATION_HEADER, HTTP_PATH_PREFIX, TICKET_HEADER

__all__ = ["PickerHttpServer"]

log = logging.getLogger(__name__)

PATH_PREFIX = HTTP_PATH_PREFIX.encode()
_REASONS = {200: b"OK", 429: b"Too Many Requests", 503: b"Service Unavailable"}
_OK_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n"
    + DESTINATION_HEADER.encode()
    + b": %s\r\n"
    + TICKET_HEADER.encode()
    + b": %s\r\n\r\n"
)


def _denial(pick: Pick) -> bytes:
    body = json.dumps({"error": pick.reason, "status": pick.status}).encode()
    reason = _REASONS.get(pick.status, b"Denied")
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        pick.status,
        reason,
        len(body),
        body,
    )


class _Lane(LaneConnection):
    """One Envoy connection; a request's service and session header read as they come."""

    lane: PickerHttpServer

    def __init__(self, server: PickerHttpServer) -> None:
        super().__init__(server)
        self.service = ""
        self.pool: PoolPicker | None = None
        self.session_header = b""
        self.session: str | None = None
        self._resolved = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.session = None
        self._resolved = False

    def _resolve(self) -> None:
        """The service (``/pick/<service>/…``) and its pool, once the URL is complete."""
        name = self.url[len(PATH_PREFIX) :].split(b"/", 1)[0].split(b"?", 1)[0]
        self.service = name.decode("latin-1")
        self.pool = self.lane.pools.get(self.service)
        self.session_header = self.pool.session_header.lower().encode() if self.pool else b""
        self._resolved = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._resolved:
            self._resolve()
        if self.session_header and name.lower() == self.session_header:
            self.session = value.decode("latin-1")

    def on_message_complete(self) -> None:
        self.lane.requests += 1
        if not self._resolved:
            self._resolve()
        transport, pool = self.transport, self.pool
        if transport is None or transport.is_closing():
            return
        try:
            text, model = _parse(b"".join(self.body)) if self.body else (None, None)
            pick = pick_for(pool, text, model, self.session, None)
        except Exception:
            self.lane.errors += 1
            log.exception("picker http lane: a pick failed; Envoy applies the fail mode")
            transport.close()
            return
        if pick.status != 200 or pool is None:
            if pool is not None:
                pool.picker.finish(pick.ticket)
            transport.write(_denial(pick))
        else:
            endpoints = ",".join(pick.endpoints).encode()
            transport.write(_OK_HEAD % (endpoints, pool.ticket(self.service, pick)))
        if not self.parser.should_keep_alive():
            transport.close()


class PickerHttpServer(LaneServer):
    """The HTTP lane on ``host:port`` (port 0: the OS picks; ``port`` tells), serving the
    pools in ``pools`` (service name -> its picker; edits replace entries in place)."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port, "endpoint picker (transport http)", "picker.http_listen")
        self.pools: dict[str, PoolPicker] = {}

    def connection(self) -> asyncio.Protocol:
        return _Lane(self)
