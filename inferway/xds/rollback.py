"""The NACK-rollback policy: a snapshot an Envoy rejects is refused, and its group goes back
to the last snapshot a node accepted (DESIGN: "a config Envoy rejects is a refused edit").

A snapshot becomes "good" when a node of its group holds all of it (every type ACKed); the
good one before it is kept too, so a snapshot one Envoy ACKed and another then NACKed still
has somewhere to go back. Refused versions are remembered (bounded, newest kept) so they are
never served again: re-sending a rejected snapshot loops forever. Pure bookkeeping, no
callbacks: the cache serves what this returns and does the waking.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from inferway.xds.records import NackRecord, Rejection
from inferway.xds.snapshot import Snapshot

__all__ = ["RollbackPolicy"]


@dataclass
class _Good:
    good: Snapshot | None = None
    good_before: Snapshot | None = None


class RollbackPolicy:
    """Per group: the last two good snapshots; for every group: the refused versions and the
    most recent rejections (``max_rejections`` kept, oldest first)."""

    def __init__(self, *, max_rejected: int = 64, max_rejections: int = 100) -> None:
        self._groups: dict[str, _Good] = {}
        self._rejected: OrderedDict[str, str] = OrderedDict()  # version -> Envoy's message
        self._max_rejected = max_rejected
        self._rejections: deque[Rejection] = deque(maxlen=max_rejections)

    def good(self, group: str) -> Snapshot | None:
        """The last snapshot of ``group`` that a node ACKed completely (None: none yet)."""
        state = self._groups.get(group)
        return None if state is None else state.good

    def accepted(self, group: str, served: Snapshot) -> None:
        """A node of ``group`` holds all of ``served``: it is good, unless refused."""
        if served.version in self._rejected:
            return
        state = self._groups.setdefault(group, _Good())
        if state.good is None or state.good.version != served.version:
            state.good_before, state.good = state.good, served

    def is_rejected(self, version: str) -> bool:
        return version in self._rejected

    def rejections(self) -> list[Rejection]:
        return list(self._rejections)

    def rejection_of(self, version: str) -> Rejection | None:
        """The newest recorded rejection of snapshot ``version`` (None: not rejected)."""
        for rejection in reversed(self._rejections):
            if rejection.version == version:
                return rejection
        return None

    def refuse(
        self, group: str, nack: NackRecord, served: Snapshot | None
    ) -> tuple[Rejection, Snapshot | None] | None:
        """Refuse snapshot ``nack.snapshot`` of ``group`` (served now: ``served``). Returns the
        rejection and, when ``group`` serves the refused version, the newest good snapshot that
        is not refused, to serve instead (None: nothing to go back to). None when the NACK
        names no snapshot or that one is refused already (another node's NACK of it)."""
        version = nack.snapshot
        if not version or version in self._rejected:
            return None
        self._rejected[version] = nack.message
        while len(self._rejected) > self._max_rejected:
            self._rejected.popitem(last=False)
        restored = self._restore(group, version, served)
        rejection = Rejection(group, version, nack, None if restored is None else restored.version)
        self._rejections.append(rejection)
        return rejection, restored

    def _restore(self, group: str, version: str, served: Snapshot | None) -> Snapshot | None:
        state = self._groups.get(group)
        if state is None:
            return None
        if state.good is not None and state.good.version == version:
            state.good, state.good_before = state.good_before, None
        if state.good_before is not None and state.good_before.version in self._rejected:
            state.good_before = None
        if served is None or served.version != version:
            return None
        return state.good
