"""Drives one ADS stream: requests in, responses out, the cache in between.

The stream interface is deliberately small: an async iterator of ``DiscoveryRequest`` and an
async ``send`` callback. gRPC supplies them in production; tests pass in-memory ones. Requests
and snapshot changes are serialised through one queue, so the pure ``SotwState`` sees one event
at a time and each stream runs as its own task, independent of every other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Final

from envoy.service.discovery.v3 import discovery_pb2

from inferway.xds.cache import SnapshotCache, StreamHandle
from inferway.xds.sotw import SotwState, Step, counter_nonces

__all__ = ["XdsProtocolError", "serve_sotw_stream"]

_log = logging.getLogger(__name__)

Send = Callable[[discovery_pb2.DiscoveryResponse], Awaitable[None]]

_SNAPSHOT_CHANGED: Final = object()
_END: Final = object()


class XdsProtocolError(Exception):
    """The client broke the protocol (e.g. its first request names no node)."""


async def serve_sotw_stream(
    requests: AsyncIterable[discovery_pb2.DiscoveryRequest],
    send: Send,
    cache: SnapshotCache,
) -> None:
    """Serve one state-of-the-world ADS stream until the client ends it (or the task is
    cancelled); the node's status is marked disconnected on the way out."""
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

    cache.watch(handle.group, handle.stream_id, on_change)
    state = SotwState(counter_nonces(f"{handle.stream_id}-"))
    reader = asyncio.create_task(_read(iterator, events), name=f"xds-read-{handle.node_id}")
    try:
        await _apply(cache, handle, state.on_request(first, cache.get_snapshot(handle.group)), send)
        while True:
            event = await events.get()
            if event is _END:
                break
            if isinstance(event, BaseException):
                raise event
            if event is _SNAPSHOT_CHANGED:
                pending_change = False
                step = state.on_snapshot(cache.get_snapshot(handle.group))
            else:
                assert isinstance(event, discovery_pb2.DiscoveryRequest)
                _log.debug(
                    "node %s requests %s names=%s nonce=%r version=%r error=%r",
                    handle.node_id,
                    event.type_url,
                    list(event.resource_names),
                    event.response_nonce,
                    event.version_info,
                    event.error_detail.message,
                )
                step = state.on_request(event, cache.get_snapshot(handle.group))
            await _apply(cache, handle, step, send)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
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


async def _apply(cache: SnapshotCache, handle: StreamHandle, step: Step, send: Send) -> None:
    for ack in step.acks:
        cache.record_ack(handle, ack.type_url, ack.version)
    for nack in step.nacks:
        record = cache.record_nack(handle, nack.type_url, nack.version, nack.nonce, nack.message)
        _log.warning(
            "node %s rejected %s version %s: %s",
            record.node_id,
            record.type_url,
            record.version,
            record.message,
        )
    for response in step.responses:
        _log.debug(
            "node %s <- %s version=%s nonce=%s resources=%d",
            handle.node_id,
            response.type_url,
            response.version_info,
            response.nonce,
            len(response.resources),
        )
        await send(response)
        cache.record_push(handle, response.type_url, response.version_info, len(response.resources))
