"""The snapshot cache: one snapshot per node group, watched by the open xDS streams, plus what
each Envoy has accepted or rejected.

The cache is the only shared state between streams. Setting a snapshot wakes the watching streams
through plain callbacks (never awaited), so one slow Envoy cannot hold up the others.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from envoy.config.core.v3 import base_pb2

from inferway.xds import type_urls
from inferway.xds.hooks import HOOK_METHODS, call_hooks
from inferway.xds.snapshot import Snapshot
from inferway.xds.stats import SentResponse

__all__ = [
    "DISCONNECTED_NODE_TTL_S",
    "NackRecord",
    "NodeStatus",
    "SnapshotCache",
    "StreamHandle",
    "node_in_sync",
]

DEFAULT_GROUP = "default"
DISCONNECTED_NODE_TTL_S = 300.0
"""How long ``status`` keeps listing an Envoy after its last stream closed."""


@dataclass(frozen=True)
class NackRecord:
    """Envoy rejected ``version`` of ``type_url`` (sent with ``nonce``), saying ``message``."""

    node_id: str
    type_url: str
    version: str
    nonce: str
    message: str
    at: float


@dataclass(frozen=True)
class NodeStatus:
    node_id: str
    cluster: str
    group: str
    connected: bool
    connected_since: float
    acked: Mapping[str, str]
    last_nack: NackRecord | None
    last_seen: float | None = None
    """When the node last connected, NACKed or disconnected."""


def node_in_sync(node: NodeStatus, snapshot: Snapshot | None) -> bool:
    """The node acked each type of ``snapshot``: CDS and LDS always, other types when the
    snapshot holds resources of them. Per type version: an EDS/RDS ACK of a version counts
    even if a later subscription of that version is still unanswered (Envoy does not always
    answer a resend of content it already holds)."""
    if snapshot is None:
        return False
    for type_url, version in snapshot.versions.items():
        required = type_url in (type_urls.CLUSTER, type_urls.LISTENER) or bool(
            snapshot.resources_of(type_url)
        )
        if required and node.acked.get(type_url) != version:
            return False
    return True


@dataclass(frozen=True)
class StreamHandle:
    """One open stream's identity in the cache (a node may briefly hold two while reconnecting)."""

    stream_id: int
    node_id: str
    cluster: str
    group: str


@dataclass
class _Node:
    node_id: str
    cluster: str
    group: str
    connected_since: float
    streams: set[int] = field(default_factory=set)
    acked: dict[str, str] = field(default_factory=dict)
    last_nack: NackRecord | None = None
    last_seen: float | None = None

    def view(self) -> NodeStatus:
        return NodeStatus(
            node_id=self.node_id,
            cluster=self.cluster,
            group=self.group,
            connected=bool(self.streams),
            connected_since=self.connected_since,
            acked=MappingProxyType(dict(self.acked)),
            last_nack=self.last_nack,
            last_seen=self.last_seen,
        )


def _default_group(_node: base_pb2.Node) -> str:
    return DEFAULT_GROUP


class SnapshotCache:
    """Snapshots by group; ``node_group`` maps an Envoy's Node (first request of its stream) to
    the group whose snapshot it receives. ``clock`` gives unix time for records.

    Not thread-safe: use it from the event loop that runs the xDS server.
    A snapshot is stored as given; check ``Snapshot.consistent()`` before setting it."""

    def __init__(
        self,
        node_group: Callable[[base_pb2.Node], str] = _default_group,
        *,
        clock: Callable[[], float] = time.time,
        max_nacks: int = 100,
        disconnected_node_ttl: float = DISCONNECTED_NODE_TTL_S,
    ) -> None:
        """``disconnected_node_ttl``: seconds a node without a stream stays in
        ``node_status`` (a gone Envoy must not be listed forever)."""
        self._node_group = node_group
        self._clock = clock
        self._snapshots: dict[str, Snapshot] = {}
        self._watchers: dict[str, dict[int, Callable[[], None]]] = {}
        self._nodes: dict[str, _Node] = {}
        self._nacks: deque[NackRecord] = deque(maxlen=max_nacks)
        self._hooks: list[Any] = []
        self._stream_ids = itertools.count(1)
        self._changed: asyncio.Event | None = None
        self._disconnected_node_ttl = disconnected_node_ttl

    # -- snapshots ---------------------------------------------------------------------------

    def set_snapshot(self, snapshot: Snapshot, group: str = DEFAULT_GROUP) -> bool:
        """Store ``snapshot`` for ``group`` and wake its streams; False (and nobody woken) when
        the group already holds that version."""
        current = self._snapshots.get(group)
        if current is not None and current.version == snapshot.version:
            return False
        self._snapshots[group] = snapshot
        for notify in list(self._watchers.get(group, {}).values()):
            notify()
        self._signal()
        return True

    def get_snapshot(self, group: str = DEFAULT_GROUP) -> Snapshot | None:
        return self._snapshots.get(group)

    def watch(self, group: str, stream_id: int, notify: Callable[[], None]) -> None:
        """Call ``notify()`` (synchronously, must not block) whenever ``group`` changes."""
        self._watchers.setdefault(group, {})[stream_id] = notify

    def unwatch(self, group: str, stream_id: int) -> None:
        self._watchers.get(group, {}).pop(stream_id, None)

    # -- node bookkeeping (called by the server) ---------------------------------------------

    def group_of(self, node: base_pb2.Node) -> str:
        return self._node_group(node)

    def open_stream(self, node: base_pb2.Node) -> StreamHandle:
        group = self._node_group(node)
        handle = StreamHandle(next(self._stream_ids), node.id, node.cluster, group)
        state = self._nodes.get(node.id)
        if state is None or not state.streams:
            acked = state.acked if state is not None and state.group == group else {}
            now = self._clock()
            state = _Node(node.id, node.cluster, group, now, acked=dict(acked), last_seen=now)
            self._nodes[node.id] = state
        state.cluster, state.group = node.cluster, group
        state.streams.add(handle.stream_id)
        call_hooks(self._hooks, "on_connect", state.view())
        self._signal()
        return handle

    def close_stream(self, handle: StreamHandle) -> None:
        self.unwatch(handle.group, handle.stream_id)
        state = self._nodes.get(handle.node_id)
        if state is None or handle.stream_id not in state.streams:
            return
        state.streams.discard(handle.stream_id)
        if not state.streams:
            state.last_seen = self._clock()
            call_hooks(self._hooks, "on_disconnect", state.view())
        self._signal()

    def record_push(self, handle: StreamHandle, type_url: str, version: str, count: int) -> None:
        call_hooks(self._hooks, "on_push", handle.node_id, type_url, version, count)

    def record_response(self, sent: SentResponse) -> None:
        """Report one written response (protocol, resources, bytes) to the hooks."""
        call_hooks(self._hooks, "on_response", sent)

    def record_ack(self, handle: StreamHandle, type_url: str, version: str) -> None:
        state = self._nodes.get(handle.node_id)
        if state is not None:
            state.acked[type_url] = version
        call_hooks(self._hooks, "on_ack", handle.node_id, type_url, version)
        self._signal()

    def record_nack(
        self, handle: StreamHandle, type_url: str, version: str, nonce: str, message: str
    ) -> NackRecord:
        record = NackRecord(handle.node_id, type_url, version, nonce, message, self._clock())
        self._nacks.append(record)
        state = self._nodes.get(handle.node_id)
        if state is not None:
            state.last_nack = record
            state.last_seen = record.at
        call_hooks(self._hooks, "on_nack", record)
        self._signal()
        return record

    # -- views -------------------------------------------------------------------------------

    def node_status(self) -> list[NodeStatus]:
        """Connected nodes, and disconnected ones for ``disconnected_node_ttl`` seconds."""
        gone = [state for state in self._nodes.values() if not state.streams]
        if gone:
            expired_before = self._clock() - self._disconnected_node_ttl
            for state in gone:
                if (state.last_seen or 0.0) < expired_before:
                    del self._nodes[state.node_id]
        return [self._nodes[node_id].view() for node_id in sorted(self._nodes)]

    def nacks(self) -> list[NackRecord]:
        """The most recent NACKs (bounded), oldest first."""
        return list(self._nacks)

    def add_hook(self, hook: Any) -> None:
        """Attach an observer with any of on_push/on_ack/on_nack/on_connect/on_disconnect."""
        if not any(callable(getattr(hook, name, None)) for name in HOOK_METHODS):
            raise TypeError(f"{hook!r} has none of the hook methods {', '.join(HOOK_METHODS)}")
        self._hooks.append(hook)

    async def wait_for_acks(
        self, version: str, *, node_ids: Iterable[str] | None = None, timeout: float
    ) -> bool:
        """True once every node in ``node_ids`` (default: every connected node, at least one)
        has acked each type of snapshot ``version``: CDS and LDS always, other types when the
        snapshot holds resources of them. False when ``timeout`` seconds pass first."""
        wanted = None if node_ids is None else sorted(set(node_ids))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            if self._all_acked(version, wanted):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return self._all_acked(version, wanted)

    def _all_acked(self, version: str, node_ids: list[str] | None) -> bool:
        if node_ids is None:
            nodes = [n for n in self._nodes.values() if n.streams]
        else:
            nodes = [self._nodes[i] for i in node_ids if i in self._nodes]
            if len(nodes) != len(node_ids):
                return False
        if not nodes:
            return False
        for node in nodes:
            snapshot = self._snapshots.get(node.group)
            if snapshot is None or snapshot.version != version:
                return False
            if not node_in_sync(node.view(), snapshot):
                return False
        return True

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
