"""The snapshot cache: one snapshot per node group, watched by the open xDS streams, plus what
each Envoy has accepted or rejected.

The cache is the only shared state between streams. Setting a snapshot wakes the watching streams
through plain callbacks (never awaited), so one slow Envoy cannot hold up the others. A snapshot
an Envoy NACKs is refused: the group goes back to the last snapshot a node ACKed, for connected
and newly connecting Envoys alike, and the rejected version is remembered so it is not sent
again (re-sending a rejected snapshot loops forever; see ``SnapshotHistory``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.xds import type_urls
from inferway.xds.history import SnapshotHistory
from inferway.xds.hooks import HOOK_METHODS, call_hooks
from inferway.xds.records import NackRecord, NodeStatus, Rejection
from inferway.xds.snapshot import Snapshot
from inferway.xds.stats import SentResponse

__all__ = ["DISCONNECTED_NODE_TTL_S", "SnapshotCache", "StreamHandle", "node_in_sync"]

DEFAULT_GROUP = "default"
DISCONNECTED_NODE_TTL_S = 300.0
"""How long ``status`` keeps listing an Envoy after its last stream closed."""


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
        self._history = SnapshotHistory()
        self._rejections: deque[Rejection] = deque(maxlen=max_nacks)
        self._watchers: dict[str, dict[int, Callable[[], None]]] = {}
        self._nodes: dict[str, _Node] = {}
        self._nacks: deque[NackRecord] = deque(maxlen=max_nacks)
        self._hooks: list[Any] = []
        self._stream_ids = itertools.count(1)
        self._changed: asyncio.Event | None = None
        self._group_builder: Callable[[str], Snapshot | None] | None = None
        self._disconnected_node_ttl = disconnected_node_ttl

    # -- snapshots ---------------------------------------------------------------------------

    def set_snapshot(self, snapshot: Snapshot, group: str = DEFAULT_GROUP) -> bool:
        """Store ``snapshot`` for ``group`` and wake its streams; False (and nobody woken) when
        the group already holds that version."""
        if not self._history.serve(group, snapshot):
            return False
        self._wake(group)
        return True

    def get_snapshot(self, group: str = DEFAULT_GROUP) -> Snapshot | None:
        """The snapshot ``group`` is served now (the last good one after a rejection)."""
        return self._history.served(group)

    def good_snapshot(self, group: str = DEFAULT_GROUP) -> Snapshot | None:
        """The last snapshot of ``group`` that a node ACKed completely (None: none yet)."""
        return self._history.good(group)

    def is_rejected(self, version: str) -> bool:
        """An Envoy NACKed snapshot ``version``: setting it again would only be rejected again."""
        return self._history.is_rejected(version)

    def rejection_of(self, version: str) -> Rejection | None:
        """The newest recorded rejection of snapshot ``version`` (None: not rejected)."""
        for rejection in reversed(self._rejections):
            if rejection.version == version:
                return rejection
        return None

    def rejections(self) -> list[Rejection]:
        """The most recent snapshots refused because an Envoy rejected them, oldest first."""
        return list(self._rejections)

    def _wake(self, group: str) -> None:
        for notify in list(self._watchers.get(group, {}).values()):
            notify()
        self._signal()

    def groups(self) -> list[str]:
        """Every group that holds a snapshot or has a connected node, sorted."""
        connected = {state.group for state in self._nodes.values() if state.streams}
        return sorted(set(self._history.groups()) | connected)

    def set_group_builder(self, builder: Callable[[str], Snapshot | None]) -> None:
        """``builder(group)`` makes the first snapshot of a group no snapshot was set for,
        when a node of it connects (a scope seen for the first time); None: none yet."""
        self._group_builder = builder

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
        if self._history.served(group) is None and self._group_builder is not None:
            first = self._group_builder(group)
            if first is not None:
                self.set_snapshot(first, group)
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
            served = self._history.served(state.group)
            if served is not None and node_in_sync(state.view(), served):
                self._history.accepted(state.group, served.version)
        call_hooks(self._hooks, "on_ack", handle.node_id, type_url, version)
        self._signal()

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
        """Record a NACK; with ``snapshot`` (the version the rejected response was built from)
        that snapshot is refused and the node's group goes back to its last good one."""
        record = NackRecord(
            handle.node_id,
            type_url,
            version,
            nonce,
            message,
            self._clock(),
            snapshot,
            resource_names,
        )
        self._nacks.append(record)
        state = self._nodes.get(handle.node_id)
        if state is not None:
            state.last_nack = record
            state.last_seen = record.at
        call_hooks(self._hooks, "on_nack", record)
        if snapshot and not self._history.is_rejected(snapshot):
            restored = self._history.reject(handle.group, snapshot, message)
            rejection = Rejection(
                handle.group, snapshot, record, None if restored is None else restored.version
            )
            self._rejections.append(rejection)
            call_hooks(self._hooks, "on_reject", rejection)
            if restored is not None:
                self._wake(handle.group)
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
        """Attach an observer with any of the methods in ``HOOK_METHODS``."""
        if not any(callable(getattr(hook, name, None)) for name in HOOK_METHODS):
            raise TypeError(f"{hook!r} has none of the hook methods {', '.join(HOOK_METHODS)}")
        self._hooks.append(hook)

    async def wait_for_acks(
        self, version: str, *, node_ids: Iterable[str] | None = None, timeout: float
    ) -> bool:
        """True once every node in ``node_ids`` (default: every connected node of the groups
        whose snapshot is ``version``, at least one; other groups, e.g. proxyless gRPC
        clients, hold other snapshots) has acked each type of snapshot ``version``: CDS and
        LDS always, other types when the snapshot holds resources of them. False when
        ``timeout`` seconds pass first, or as soon as an Envoy rejects that snapshot."""
        wanted = None if node_ids is None else sorted(set(node_ids))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            if self._all_acked(version, wanted):
                return True
            if self._history.is_rejected(version):
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return self._all_acked(version, wanted)

    def _all_acked(self, version: str, node_ids: list[str] | None) -> bool:
        if node_ids is None:
            nodes = [
                n
                for n in self._nodes.values()
                if n.streams and getattr(self._history.served(n.group), "version", None) == version
            ]
        else:
            nodes = [self._nodes[i] for i in node_ids if i in self._nodes]
            if len(nodes) != len(node_ids):
                return False
        if not nodes:
            return False
        for node in nodes:
            snapshot = self._history.served(node.group)
            if snapshot is None or snapshot.version != version:
                return False
            if not node_in_sync(node.view(), snapshot):
                return False
        return True

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
