"""The seam between an xDS stream and the cache, as go-control-plane's ``ConfigWatcher``: what
``xds/stream.py`` needs to serve one stream, and nothing of how snapshots are stored.

A stream opens (naming its node, which decides its group), creates a watch that is called when
its group's snapshot changes (cancelled when the stream ends), reads the group's snapshot, and
reports what it sent and what the node answered. One watch serves both protocols: the pure
protocol states (``SotwState``, ``DeltaState``) compute what to send from the snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.xds.records import NackRecord, SentResponse
from inferway.xds.snapshot import Snapshot

__all__ = ["CancelWatch", "ConfigWatcher", "Notify", "StreamHandle"]

Notify = Callable[[], None]
"""Called synchronously when a watched group changes; must not block."""

CancelWatch = Callable[[], None]
"""Ends a watch; calling it twice, or after the stream closed, does nothing."""


@dataclass(frozen=True)
class StreamHandle:
    """One open stream's identity in the cache (a node may briefly hold two while reconnecting)."""

    stream_id: int
    node_id: str
    cluster: str
    group: str


class ConfigWatcher(Protocol):
    """What one xDS stream asks of the cache (``SnapshotCache`` is the implementation)."""

    def open_stream(self, node: base_pb2.Node) -> StreamHandle:
        """Register a stream of ``node`` (its first request's Node) and say its group."""
        ...

    def create_watch(self, handle: StreamHandle, notify: Notify) -> CancelWatch:
        """Call ``notify()`` whenever the snapshot of ``handle.group`` changes."""
        ...

    def get_snapshot(self, group: str) -> Snapshot | None:
        """The snapshot ``group`` is served now (None: none yet)."""
        ...

    def close_stream(self, handle: StreamHandle) -> None:
        """The stream ended: its watch is cancelled, its node marked disconnected if last."""
        ...

    def record_push(self, handle: StreamHandle, type_url: str, version: str, count: int) -> None:
        """A response is about to be written (before the write: the answer may come first)."""
        ...

    def record_response(self, sent: SentResponse) -> None:
        """A response was written."""
        ...

    def record_ack(self, handle: StreamHandle, type_url: str, version: str) -> None:
        """The node accepted ``version`` of ``type_url``."""
        ...

    def record_nack(
        self,
        handle: StreamHandle,
        type_url: str,
        version: str,
        nonce: str,
        message: str,
        *,
        snapshot: str = "",
        resource_names: tuple[str, ...] = (),
    ) -> NackRecord:
        """The node rejected a response built from ``snapshot`` (the version, "" unknown)."""
        ...
