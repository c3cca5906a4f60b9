"""The snapshot cache: one snapshot per node group, watched by the open xDS streams, plus what
each Envoy has accepted or rejected.

The cache is the only shared state between streams, and the :class:`ConfigWatcher` they use.
It composes one part per job: the served snapshots (``SnapshotStore``), the streams' watches
(``WatchRegistry``), what each node ACKed and NACKed (``NodeRecords``), the NACK-rollback
policy (``RollbackPolicy``) and the observers (``HookBus``). Setting a snapshot wakes the
watching streams through plain callbacks (never awaited), so one slow Envoy cannot hold up
the others. A snapshot an Envoy NACKs is refused: the group goes back to the last snapshot a
node ACKed, for connected and newly connecting Envoys alike, and the rejected version is
remembered so it is not sent again.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.xds.config_watcher import CancelWatch, Notify, StreamHandle
from inferway.xds.hooks import HookBus, XdsHook
from inferway.xds.node_address import node_address
from inferway.xds.node_records import DISCONNECTED_NODE_TTL_S, NodeRecords, node_in_sync
from inferway.xds.records import NackRecord, NodeStatus, Rejection, SentResponse
from inferway.xds.rollback import RollbackPolicy
from inferway.xds.snapshot import Snapshot
from inferway.xds.snapshot_store import SnapshotStore
from inferway.xds.watches import WatchRegistry

__all__ = ["DISCONNECTED_NODE_TTL_S", "SnapshotCache", "StreamHandle", "node_in_sync"]

DEFAULT_GROUP = "default"


def _default_group(_node: base_pb2.Node) -> str:
    return DEFAULT_GROUP


_ALONGSIDE_KEPT = 1024
"""Group snapshot versions remembered with the default versions they were pushed with."""


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
        self._store = SnapshotStore()
        self._rollback = RollbackPolicy(max_rejections=max_nacks)
        self._watches = WatchRegistry()
        self._nodes = NodeRecords(
            clock=clock, max_nacks=max_nacks, disconnected_node_ttl=disconnected_node_ttl
        )
        self._hooks = HookBus()
        self._stream_ids = itertools.count(1)
        self._changed: asyncio.Event | None = None
        self._group_builder: Callable[[str], Snapshot | None] | None = None
        self._alongside: OrderedDict[str, set[str]] = OrderedDict()
        """A group's snapshot version -> the default group's versions it was pushed with."""

    # -- snapshots ---------------------------------------------------------------------------

    def set_snapshot(
        self, snapshot: Snapshot, group: str = DEFAULT_GROUP, *, alongside: str | None = None
    ) -> bool:
        """Store ``snapshot`` for ``group`` and wake its streams; False (and nobody woken) when
        the group already holds that version. ``alongside``: the default group's snapshot
        version this one renders the same policy for (a zone's, or that of the Envoys with
        the native SSE reader), so waiting for that version's ACKs counts this group's."""
        if alongside is not None and alongside != snapshot.version:
            self._alongside.setdefault(snapshot.version, set()).add(alongside)
            self._alongside.move_to_end(snapshot.version)
            while len(self._alongside) > _ALONGSIDE_KEPT:
                self._alongside.popitem(last=False)
        if not self._store.serve(group, snapshot):
            return False
        self._wake(group)
        return True

    def get_snapshot(self, group: str = DEFAULT_GROUP) -> Snapshot | None:
        """The snapshot ``group`` is served now (the last good one after a rejection)."""
        return self._store.served(group)

    def good_snapshot(self, group: str = DEFAULT_GROUP) -> Snapshot | None:
        """The last snapshot of ``group`` that a node ACKed completely (None: none yet)."""
        return self._rollback.good(group)

    def is_rejected(self, version: str) -> bool:
        """An Envoy NACKed snapshot ``version``: setting it again would only be rejected again."""
        return self._rollback.is_rejected(version)

    def rejection_of(self, version: str) -> Rejection | None:
        """The newest recorded rejection of snapshot ``version`` (None: not rejected)."""
        return self._rollback.rejection_of(version)

    def rejections(self) -> list[Rejection]:
        """The most recent snapshots refused because an Envoy rejected them, oldest first."""
        return self._rollback.rejections()

    def groups(self) -> list[str]:
        """Every group that holds a snapshot or has a connected node, sorted."""
        return sorted(set(self._store.groups()) | self._nodes.connected_groups())

    def set_group_builder(self, builder: Callable[[str], Snapshot | None]) -> None:
        """``builder(group)`` makes the first snapshot of a group no snapshot was set for,
        when a node of it connects (a scope seen for the first time); None: none yet."""
        self._group_builder = builder

    def _pushed_with(self, version: str) -> Collection[str]:
        return self._alongside.get(version, ())

    def _wake(self, group: str) -> None:
        self._watches.notify(group)
        self._signal()

    # -- the streams' side (ConfigWatcher) ---------------------------------------------------

    def open_stream(self, node: base_pb2.Node) -> StreamHandle:
        group = self._node_group(node)
        if self._store.served(group) is None and self._group_builder is not None:
            first = self._group_builder(group)
            if first is not None:
                default = self._store.served(DEFAULT_GROUP)
                self.set_snapshot(first, group, alongside=default.version if default else None)
        handle = StreamHandle(next(self._stream_ids), node.id, node.cluster, group)
        self._hooks.on_connect(self._nodes.opened(handle, *node_address(node)))
        self._signal()
        return handle

    def create_watch(self, handle: StreamHandle, notify: Notify) -> CancelWatch:
        """Call ``notify()`` (synchronously, must not block) whenever ``handle.group``
        changes, until the returned cancel is called or the stream closes."""
        return self._watches.watch(handle.group, handle.stream_id, notify)

    def close_stream(self, handle: StreamHandle) -> None:
        self._watches.cancel(handle.group, handle.stream_id)
        if not self._nodes.is_open(handle):
            return
        gone = self._nodes.closed(handle)
        if gone is not None:
            self._hooks.on_disconnect(gone)
        self._signal()

    def record_push(self, handle: StreamHandle, type_url: str, version: str, count: int) -> None:
        self._hooks.on_push(handle.node_id, type_url, version, count)

    def record_response(self, sent: SentResponse) -> None:
        """Report one written response (protocol, resources, bytes) to the hooks."""
        self._hooks.on_response(sent)

    def record_ack(self, handle: StreamHandle, type_url: str, version: str) -> None:
        status = self._nodes.acked(handle, type_url, version)
        if status is not None:
            served = self._store.served(status.group)
            if served is not None and node_in_sync(status, served):
                self._rollback.accepted(status.group, served)
        self._hooks.on_ack(handle.node_id, type_url, version)
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
        record = self._nodes.nack(
            handle, type_url, version, nonce, message, snapshot, resource_names
        )
        self._hooks.on_nack(record)
        refused = self._rollback.refuse(handle.group, record, self._store.served(handle.group))
        if refused is not None:
            rejection, restored = refused
            if restored is not None:
                self._store.serve(handle.group, restored)
            self._hooks.on_reject(rejection)
            if restored is not None:
                self._wake(handle.group)
        self._signal()
        return record

    # -- views -------------------------------------------------------------------------------

    def node_status(self) -> list[NodeStatus]:
        """Connected nodes, and disconnected ones for ``disconnected_node_ttl`` seconds."""
        return self._nodes.status()

    def node(self, node_id: str) -> NodeStatus | None:
        """One node's status (None: not known): O(1), for hooks that run on every ACK (a
        fleet's push is an ACK from each of thousands of Envoys)."""
        return self._nodes.get(node_id)

    def nacks(self) -> list[NackRecord]:
        """The most recent NACKs (bounded), oldest first."""
        return self._nodes.nacks()

    def add_hook(self, hook: XdsHook) -> None:
        """Attach an observer (subclass ``XdsObserver``); TypeError for anything else."""
        self._hooks.add(hook)

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
            if self._nodes.all_acked(version, wanted, self._store.served, self._pushed_with):
                return True
            if self._rollback.is_rejected(version):
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                return self._nodes.all_acked(version, wanted, self._store.served, self._pushed_with)

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
