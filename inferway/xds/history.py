"""Which snapshot a group is served: the newest one set, unless an Envoy rejected it, in which
case the last one an Envoy accepted (DESIGN: "a config Envoy rejects is a refused edit").

Pure bookkeeping, no callbacks: the cache asks it and does the waking. A snapshot becomes
"good" when a node of its group holds all of it (every type ACKed); the good one before it is
kept too, so a snapshot one Envoy ACKed and another then NACKed still has somewhere to go back.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from inferway.xds.snapshot import Snapshot

__all__ = ["SnapshotHistory"]


@dataclass
class _Group:
    served: Snapshot
    good: Snapshot | None = None
    good_before: Snapshot | None = None


class SnapshotHistory:
    """Per group: the served snapshot, the last two good ones, and (for every group) the
    versions refused because an Envoy rejected them (bounded, newest kept)."""

    def __init__(self, max_rejected: int = 64) -> None:
        self._groups: dict[str, _Group] = {}
        self._rejected: OrderedDict[str, str] = OrderedDict()  # version -> Envoy's message
        self._max_rejected = max_rejected

    def groups(self) -> list[str]:
        """The groups a snapshot was served to, sorted."""
        return sorted(self._groups)

    def served(self, group: str) -> Snapshot | None:
        state = self._groups.get(group)
        return None if state is None else state.served

    def good(self, group: str) -> Snapshot | None:
        """The last snapshot of ``group`` that a node ACKed completely (None: none yet)."""
        state = self._groups.get(group)
        return None if state is None else state.good

    def serve(self, group: str, snapshot: Snapshot) -> bool:
        """Serve ``snapshot`` to ``group``; False when it is already served."""
        state = self._groups.get(group)
        if state is None:
            self._groups[group] = _Group(snapshot)
            return True
        if state.served.version == snapshot.version:
            return False
        state.served = snapshot
        return True

    def accepted(self, group: str, version: str) -> None:
        """A node of ``group`` holds all of snapshot ``version``: it is good, unless refused."""
        state = self._groups.get(group)
        if state is None or state.served.version != version or version in self._rejected:
            return
        if state.good is None or state.good.version != version:
            state.good_before, state.good = state.good, state.served

    def is_rejected(self, version: str) -> bool:
        return version in self._rejected

    def reject(self, group: str, version: str, message: str) -> Snapshot | None:
        """Refuse snapshot ``version``; when ``group`` serves it, go back to the newest good
        snapshot that is not refused and return it (None: nothing to go back to, or the group
        serves another version already)."""
        self._rejected[version] = message
        self._rejected.move_to_end(version)
        while len(self._rejected) > self._max_rejected:
            self._rejected.popitem(last=False)
        state = self._groups.get(group)
        if state is None:
            return None
        if state.good is not None and state.good.version == version:
            state.good, state.good_before = state.good_before, None
        if state.good_before is not None and state.good_before.version in self._rejected:
            state.good_before = None
        if state.served.version != version or state.good is None:
            return None
        state.served = state.good
        return state.good
