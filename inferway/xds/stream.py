"""Drives one ADS stream: requests in, responses out, the cache in between.

The stream interface is deliberately small: an async iterator of requests and an async
``send`` callback (gRPC supplies them in production; tests pass in-memory ones), and the
cache seen only as a ``ConfigWatcher`` (``xds/config_watcher.py``). Requests and
snapshot changes are serialised through one queue, so the pure protocol state (``SotwState``
for state-of-the-world, ``DeltaState`` for incremental xDS) sees one event at a time and each
stream runs as its own task, independent of every other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, Final, Protocol

from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2
from inferway.xds.config_watcher import ConfigWatcher, StreamHandle
from inferway.xds.delta import DeltaState
from inferway.xds.records import SentResponse, XdsProtocol
from inferway.xds.snapshot import Snapshot
from inferway.xds.sotw import SotwState, counter_nonces

__all__ = ["XdsProtocolError", "serve_delta_stream", "serve_sotw_stream"]

_log = logging.getLogger(__name__)

Send = Callable[[discovery_pb2.DiscoveryResponse], Awaitable[None]]
DeltaSend = Callable[[discovery_pb2.DeltaDiscoveryResponse], Awaitable[None]]

_SNAPSHOT_CHANGED: Final = object()
_END: Final = object()


class XdsProtocolError(Exception):
    """The client broke the protocol (e.g. its first request names no node)."""


class _ProtocolState(Protocol):
    def on_request(self, request: Any, snapshot: Snapshot | None) -> Any: ...

    def on_snapshot(self, snapshot: Snapshot | None) -> Any: ...

    @property
    def waiting(self) -> bool: ...

    def release(self) -> Any: ...


HOLD_TIMEOUT_S = 10.0
"""How long a make-before-break stage waits for the client's answer before the rest goes out
anyway (a client that never answers must not freeze its config)."""


async def serve_sotw_stream(
    requests: AsyncIterable[discovery_pb2.DiscoveryRequest],
    send: Send,
    cache: ConfigWatcher,
) -> None:
    """Serve one state-of-the-world ADS stream until the client ends it (or the task is
    cancelled); the node's status is marked disconnected on the way out."""
    await _serve(requests, send, cache, "sotw")


async def serve_delta_stream(
    requests: AsyncIterable[discovery_pb2.DeltaDiscoveryRequest],
    send: DeltaSend,
    cache: ConfigWatcher,
) -> None:
    """Serve one incremental (delta) ADS stream; same lifecycle as ``serve_sotw_stream``."""
    await _serve(requests, send, cache, "delta")


async def _serve(
    requests: AsyncIterable[Any],
    send: Callable[[Any], Awaitable[None]],
    cache: ConfigWatcher,
    protocol: XdsProtocol,
) -> None:
    iterator = aiter(requests)
    try:
        first = await anext(iterator)
    except StopAsyncIteration:
        return
    if not first.HasField("node") or not first.node.id:
        raise XdsProtocolError(
            "the first DiscoveryRequest of a stream must carry node.id "
            "(set node.id in the Envoy bootstrap)"
        )
    handle = cache.open_stream(first.node)
    events: asyncio.Queue[object] = asyncio.Queue()
    pending_change = False

    def on_change() -> None:
        nonlocal pending_change
        if not pending_change:
            pending_change = True
            events.put_nowait(_SNAPSHOT_CHANGED)

    cancel_watch = cache.create_watch(handle, on_change)
    nonces = counter_nonces(f"{handle.stream_id}-")
    state: _ProtocolState = SotwState(nonces) if protocol == "sotw" else DeltaState(nonces)
    reader = asyncio.create_task(_read(iterator, events), name=f"xds-read-{handle.node_id}")
    try:
        first_step = state.on_request(first, cache.get_snapshot(handle.group))
        await _apply(cache, handle, first_step, send, protocol)
        while True:
            if state.waiting:
                try:
                    async with asyncio.timeout(HOLD_TIMEOUT_S):
                        event = await events.get()
                except TimeoutError:
                    _log.warning(
                        "node %s did not answer within %.0f s; sending the held changes",
                        handle.node_id,
                        HOLD_TIMEOUT_S,
                        extra={"node_id": handle.node_id, "stream_id": handle.stream_id},
                    )
                    await _apply(cache, handle, state.release(), send, protocol)
                    continue
            else:
                event = await events.get()
            if event is _END:
                break
            if isinstance(event, BaseException):
                raise event
            if event is _SNAPSHOT_CHANGED:
                pending_change = False
                step = state.on_snapshot(cache.get_snapshot(handle.group))
            else:
                _log_request(handle, event)
                step = state.on_request(event, cache.get_snapshot(handle.group))
            await _apply(cache, handle, step, send, protocol)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        cancel_watch()
        cache.close_stream(handle)


async def _read(
    iterator: AsyncIterator[discovery_pb2.DiscoveryRequest], events: asyncio.Queue[object]
) -> None:
    try:
        async for request in iterator:
            events.put_nowait(request)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # the transport failed: end the stream with that error
        events.put_nowait(error)
        return
    events.put_nowait(_END)


def _log_request(handle: StreamHandle, request: Any) -> None:
    if not _log.isEnabledFor(logging.DEBUG):
        return
    if isinstance(request, discovery_pb2.DeltaDiscoveryRequest):
        names = (
            f"+{list(request.resource_names_subscribe)} -{list(request.resource_names_unsubscribe)}"
        )
    else:
        names = f"{list(request.resource_names)} version={request.version_info!r}"
    _log.debug(
        "node %s requests %s %s nonce=%r error=%r",
        handle.node_id,
        request.type_url,
        names,
        request.response_nonce,
        request.error_detail.message,
    )


async def _apply(
    cache: ConfigWatcher,
    handle: StreamHandle,
    step: Any,
    send: Callable[[Any], Awaitable[None]],
    protocol: XdsProtocol,
) -> None:
    for ack in step.acks:
        cache.record_ack(handle, ack.type_url, ack.version)
    for nack in step.nacks:
        record = cache.record_nack(
            handle,
            nack.type_url,
            nack.version,
            nack.nonce,
            nack.message,
            snapshot=nack.snapshot,
            resource_names=nack.resource_names,
        )
        _log.warning(
            "node %s rejected %s version %s (snapshot %s): %s",
            record.node_id,
            record.type_url,
            record.version,
            record.snapshot or "?",
            record.message,
            extra={
                "node_id": record.node_id,
                "stream_id": handle.stream_id,
                "type_url": record.type_url,
                "version": record.version,
                "nonce": nack.nonce,
            },
        )
    for response in step.responses:
        if protocol == "sotw":
            version, removed = response.version_info, 0
        else:
            version, removed = response.system_version_info, len(response.removed_resources)
        _log.debug(
            "node %s <- %s version=%s nonce=%s resources=%d removed=%d",
            handle.node_id,
            response.type_url,
            version,
            response.nonce,
            len(response.resources),
            removed,
        )
        count = len(response.resources)
        # Recorded before the write: the node's answer may be read while send() awaits.
        cache.record_push(handle, response.type_url, version, count)
        await send(response)
        cache.record_response(
            SentResponse(
                handle.node_id,
                protocol,
                response.type_url,
                version,
                count,
                removed,
                response.ByteSize(),
            )
        )
