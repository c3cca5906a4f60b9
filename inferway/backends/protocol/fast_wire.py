"""The pure pieces of the fast HTTP/1.1 front end (fast_http.py): which requests it serves
itself, where a request's bytes end in the connection's buffer, the call the serving core
sees, and the answer's bytes.

Kept apart from the protocol so each is tested on its own, without sockets."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING

from inferway.backends.protocol.decode_plans import DecodePlans
from inferway.backends.protocol.http_server import (
    BINARY_HEADER,
    ENVOY_TIMEOUT_HEADER,
    envoy_timeout_s,
)
from inferway.backends.protocol.json_codec import encode_json_response
from inferway.backends.serving.core import Chosen
from inferway.backends.serving.failures import Failure
from inferway.backends.serving.request import DecodedRequest
from inferway.backends.telemetry import orca, tracing

if TYPE_CHECKING:
    from inferway.backends.models.served_model import ServedModel

__all__ = [
    "HOT_SKIP_HEADERS",
    "Encoded",
    "FastCall",
    "RepeatedHead",
    "RouteMemo",
    "answer_bytes",
    "error_body",
    "head_end",
    "hot_route",
    "repeatable_head",
    "response_bytes",
    "retry_after_value",
    "take_repeats",
]

HOT_SKIP_HEADERS = frozenset({"transfer-encoding", "expect", "prefer", "upgrade"})
"""A request carrying any of these is aiohttp's: chunked bodies, 100-continue, asynchronous
jobs (Prefer: respond-async) and protocol upgrades behave exactly as they always have."""

Encoded = tuple[bytes, int | None]
"""An answer's body and, for the binary extension, its JSON head's length."""
_BINARY_KEY = BINARY_HEADER.lower()
_PREFIX = b"/v2/models/"
_SUFFIX = b"/infer"
_STATUS_LINES: dict[int, bytes] = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus
}
_date_second = -1
_date_header = b""


def hot_route(url: bytes) -> tuple[str, str | None] | None:
    """(model, version or None) when ``url`` is ``/v2/models/{m}[/versions/{v}]/infer``
    (a query string is ignored, as aiohttp's router does); None for anything else, and for a
    percent-encoded path, which is left to aiohttp's decoding."""
    path = url.split(b"?", 1)[0]
    if not path.startswith(_PREFIX) or not path.endswith(_SUFFIX) or b"%" in path:
        return None
    parts = path[len(_PREFIX) : -len(_SUFFIX)].split(b"/")
    if any(not p for p in parts):
        return None
    if len(parts) == 1:
        return parts[0].decode("utf-8", "surrogateescape"), None
    if len(parts) == 3 and parts[1] == b"versions":
        return parts[0].decode("utf-8", "surrogateescape"), parts[2].decode(
            "utf-8", "surrogateescape"
        )
    return None


class RouteMemo:
    """``hot_route``, remembered by URL: a client sends the same few URLs over and over. At
    most ``capacity`` are kept; a client that sends ever new ones gets no help, and no growth."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._routes: dict[bytes, tuple[str, str | None] | None] = {}

    def __len__(self) -> int:
        return len(self._routes)

    def __call__(self, url: bytes) -> tuple[str, str | None] | None:
        routes = self._routes
        try:
            return routes[url]
        except KeyError:
            pass
        if len(routes) >= self.capacity:
            routes.clear()
        route = routes[url] = hot_route(url)
        return route


@dataclass(frozen=True, slots=True)
class RepeatedHead:
    """A request head a connection's parser read whole, and what it read: a client repeats
    one head (method, URL, headers, Content-Length) with every request of a shape, and only
    the body changes. The same bytes parse the same way, so a later request that starts with
    exactly these bytes is taken without the parser (``take_repeats``). Only heads with a
    Content-Length are kept; ``headers`` is shared by every call that repeats it and is never
    written to. A client that opens a new connection per request repeats its head on every
    connection, so the front end keeps the last one across connections too, and
    ``keep_alive`` (what the parser read from these bytes) goes with it."""

    data: bytes
    body_size: int
    route: tuple[str, str | None]
    headers: dict[str, str]
    http10: bool
    keep_alive: bool = True


_UNIQUE_HEADERS = ("x-request-id", "traceparent")
"""Headers that name one request (Envoy adds a fresh x-request-id to each): a head with one
never repeats, so it is not kept."""


def repeatable_head(
    raw: bytes | bytearray,
    head_size: int,
    body: bytes,
    route: tuple[str, str | None],
    headers: dict[str, str],
    http10: bool,
    keep_alive: bool = True,
) -> RepeatedHead | None:
    """The request just parsed (its head the first ``head_size`` bytes of ``raw``), kept for
    repeats when its Content-Length is its body's and no header names the request."""
    if headers.get("content-length") != str(len(body)):
        return None
    if any(name in headers for name in _UNIQUE_HEADERS):
        return None
    return RepeatedHead(bytes(raw[:head_size]), len(body), route, headers, http10, keep_alive)


def take_repeats(data: bytes, head: RepeatedHead) -> tuple[list[bytes], int]:
    """The bodies of the whole requests at the start of ``data`` that repeat ``head`` byte for
    byte, and how many bytes of ``data`` they take; the rest (another head, or a request not
    all there yet) is for the parser."""
    bodies: list[bytes] = []
    start = 0
    size = len(head.data)
    whole = size + head.body_size
    while len(data) - start >= whole and data.startswith(head.data, start):
        bodies.append(data[start + size : start + whole])
        start += whole
    return bodies, start


def head_end(buffer: bytes | bytearray) -> int:
    """The offset just past the request head at the start of ``buffer`` (the empty lines a
    client may send before a request line included); -1 when the head is not all there."""
    start = 0
    while buffer.startswith(b"\r\n", start):
        start += 2
    end = buffer.find(b"\r\n\r\n", start)
    return -1 if end < 0 else end + 4


def retry_after_value(seconds: float) -> str:
    """Retry-After counts whole seconds (RFC 9110); rounded up so clients never retry early."""
    return str(max(1, int(-(-seconds // 1))))


def error_body(message: str) -> bytes:
    """The JSON error answer's body, byte for byte what aiohttp's json_response writes."""
    return json.dumps({"error": message}).encode()


def _date() -> bytes:
    global _date_second, _date_header
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_header = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
    return _date_header


def response_bytes(
    status: int,
    content_type: bytes,
    body: bytes,
    headers: list[tuple[str, str]],
    *,
    keep_alive: bool,
    http10: bool = False,
) -> bytes:
    """One whole HTTP/1.1 answer: status line, headers, body, in one buffer for one write.
    ``http10``: the client spoke HTTP/1.0, so keeping the connection open must be said."""
    parts = [
        _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode(),
        b"Content-Type: ",
        content_type,
        b"\r\nContent-Length: ",
        str(len(body)).encode(),
        b"\r\n",
        _date(),
    ]
    for name, value in headers:
        parts.append(f"{name}: {value}\r\n".encode("latin-1"))
    if not keep_alive:
        parts.append(b"Connection: close\r\n")
    elif http10:
        parts.append(b"Connection: keep-alive\r\n")
    parts.append(b"\r\n")
    parts.append(body)
    return b"".join(parts)


_JSON = b"application/json"
_JSON_ERROR = b"application/json; charset=utf-8"
_BINARY = b"application/octet-stream"


def answer_bytes(
    encoded: Encoded | None,
    failure: Failure | None,
    report: str | None,
    request_id: str | None,
    keep_alive: bool,
    http10: bool,
) -> bytes:
    """The whole answer to an infer request: its outcome (``encoded``, or ``failure`` with its
    status and Retry-After), the ORCA load ``report`` and the request id, when there are any."""
    headers: list[tuple[str, str]] = []
    if failure is not None:
        status, content_type, body = failure.http_status, _JSON_ERROR, error_body(failure.message)
        if failure.retry_after_s is not None:
            headers.append(("Retry-After", retry_after_value(failure.retry_after_s)))
    else:
        assert encoded is not None
        body, head_len = encoded
        status = 200
        if head_len is None:
            content_type = _JSON
        else:
            content_type = _BINARY
            headers.append((BINARY_HEADER, str(head_len)))
    if report is not None:
        headers.append((orca.ORCA_HEADER, report))
    if request_id:
        headers.append((tracing.REQUEST_ID_HEADER, request_id))
    return response_bytes(status, content_type, body, headers, keep_alive=keep_alive, http10=http10)


_NO_PLANS = DecodePlans(capacity=0)


class FastCall:
    """One infer request as the serving core sees it (see InferCall); its body is read.
    ``plans``: the front end's decoding plans (binary-extension heads seen before)."""

    __slots__ = ("body", "headers", "model_name", "model_version", "plans")
    needs_read = False

    def __init__(
        self,
        model: str,
        version: str | None,
        headers: dict[str, str],
        body: bytes,
        plans: DecodePlans = _NO_PLANS,
    ) -> None:
        self.model_name = model
        self.model_version = version
        self.headers = headers
        self.body = body
        self.plans = plans

    def body_size(self) -> int | None:
        return len(self.body)

    async def read_body(self, limit: int, model: str) -> None:  # needs_read is False
        return None

    def decode(self, model: ServedModel) -> DecodedRequest:
        return self.plans.decode(
            model.name, str(model.version), self.body, self.headers.get(_BINARY_KEY), model.inputs
        )

    def may_name_timeout(self) -> bool:
        """Whether the request's JSON could carry ``parameters.timeout``: a byte search of the
        JSON part only (with the binary extension, the tensor bytes after it are not read)."""
        size = self.headers.get(_BINARY_KEY)
        end = (
            int(size) if size is not None and size.isascii() and size.isdigit() else len(self.body)
        )
        return self.body.find(b'"timeout"', 0, end) >= 0

    def transport_timeout_s(self) -> float | None:
        return envoy_timeout_s(self.headers.get(ENVOY_TIMEOUT_HEADER))

    def encode(self, model: ServedModel, decoded: DecodedRequest, outputs: Chosen) -> Encoded:
        return encode_json_response(
            model_name=model.name,
            model_version=str(model.version),
            request_id=decoded.id,
            outputs=outputs,
            binary_default=decoded.binary_output,
        )
