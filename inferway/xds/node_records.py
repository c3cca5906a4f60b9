"""What each Envoy (node) has: its open streams, the version of each type it ACKed, its last
NACK, and the most recent NACKs of all nodes (bounded).

Bookkeeping only: the cache decides what an ACK or NACK means for the snapshots (see
``xds/rollback.py``) and tells the hooks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from types import MappingProxyType

from inferway.xds import type_urls
from inferway.xds.config_watcher import StreamHandle
from inferway.xds.records import NackRecord, NodeStatus
from inferway.xds.snapshot import Snapshot

__all__ = ["DISCONNECTED_NODE_TTL_S", "NodeRecords", "node_in_sync"]

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
    address: str = ""
    address_source: str = ""

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
            address=self.address,
            address_source=self.address_source,
        )


class NodeRecords:
    """Nodes by id. ``clock`` gives unix time; a node without a stream is listed for
    ``disconnected_node_ttl`` seconds (a gone Envoy must not be listed forever)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_nacks: int = 100,
        disconnected_node_ttl: float = DISCONNECTED_NODE_TTL_S,
    ) -> None:
        self._clock = clock
        self._nodes: dict[str, _Node] = {}
        self._nacks: deque[NackRecord] = deque(maxlen=max_nacks)
        self._disconnected_node_ttl = disconnected_node_ttl

    def opened(
        self, handle: StreamHandle, address: str = "", address_source: str = ""
    ) -> NodeStatus:
        """A stream of ``handle.node_id`` opened (its listeners at ``address``). A node
        reconnecting to the same group keeps what it ACKed (Envoy keeps its config across a
        reconnect)."""
        state = self._nodes.get(handle.node_id)
        if state is None or not state.streams:
            acked = state.acked if state is not None and state.group == handle.group else {}
            now = self._clock()
            state = _Node(
                handle.node_id, handle.cluster, handle.group, now, acked=dict(acked), last_seen=now
            )
            self._nodes[handle.node_id] = state
        state.cluster, state.group = handle.cluster, handle.group
        state.address, state.address_source = address, address_source
        state.streams.add(handle.stream_id)
        return state.view()

    def closed(self, handle: StreamHandle) -> NodeStatus | None:
        """The stream ended; the node's status when that was its last stream (else None)."""
        state = self._nodes.get(handle.node_id)
        if state is None or handle.stream_id not in state.streams:
            return None
        state.streams.discard(handle.stream_id)
        if state.streams:
            return None
        state.last_seen = self._clock()
        return state.view()

    def is_open(self, handle: StreamHandle) -> bool:
        state = self._nodes.get(handle.node_id)
        return state is not None and handle.stream_id in state.streams

    def acked(self, handle: StreamHandle, type_url: str, version: str) -> NodeStatus | None:
        """Record the ACK; the node's status after it (None: the node is not known)."""
        state = self._nodes.get(handle.node_id)
        if state is None:
            return None
        state.acked[type_url] = version
        return state.view()

    def nack(
        self,
        handle: StreamHandle,
        type_url: str,
        version: str,
        nonce: str,
        message: str,
        snapshot: str,
        resource_names: tuple[str, ...],
    ) -> NackRecord:
        """Record a NACK of the node and return it."""
        at = self._clock()
        record = NackRecord(
            handle.node_id, type_url, version, nonce, message, at, snapshot, resource_names
        )
        self._nacks.append(record)
        state = self._nodes.get(handle.node_id)
        if state is not None:
            state.last_nack = record
            state.last_seen = record.at
        return record

    def nacks(self) -> list[NackRecord]:
        """The most recent NACKs (bounded), oldest first."""
        return list(self._nacks)

    def connected_groups(self) -> set[str]:
        return {state.group for state in self._nodes.values() if state.streams}

    def get(self, node_id: str) -> NodeStatus | None:
        """One node's status (None: not known), without a view of every other node."""
        state = self._nodes.get(node_id)
        return None if state is None else state.view()

    def status(self) -> list[NodeStatus]:
        """Connected nodes, and disconnected ones for ``disconnected_node_ttl`` seconds."""
        gone = [state for state in self._nodes.values() if not state.streams]
        if gone:
            expired_before = self._clock() - self._disconnected_node_ttl
            for state in gone:
                if (state.last_seen or 0.0) < expired_before:
                    del self._nodes[state.node_id]
        return [self._nodes[node_id].view() for node_id in sorted(self._nodes)]

    def all_acked(
        self,
        version: str,
        node_ids: list[str] | None,
        served: Callable[[str], Snapshot | None],
        pushed_with: Callable[[str], Collection[str]] = lambda _version: (),
    ) -> bool:
        """Every node of ``node_ids`` (None: every connected node whose group is ``served``
        ``version``, at least one) holds all of the snapshot its group is served: ``version``,
        or for a named node its group's rendering of the same push (``pushed_with``: a zone's,
        or that of the Envoys with the native SSE reader)."""

        def same(held: Snapshot | None) -> bool:
            return held is not None and (
                held.version == version
                or (node_ids is not None and version in pushed_with(held.version))
            )

        if node_ids is None:
            nodes = [n for n in self._nodes.values() if n.streams and same(served(n.group))]
        else:
            nodes = [self._nodes[i] for i in node_ids if i in self._nodes]
            if len(nodes) != len(node_ids):
                return False
        if not nodes:
            return False
        for node in nodes:
            snapshot = served(node.group)
            if snapshot is None or not same(snapshot):
                return False
            if not node_in_sync(node.view(), snapshot):
                return False
        return True
