"""The snapshot each group is served now: the newest one set, or the last good one the
rollback policy (``xds/rollback.py``) restored after a rejection.

Pure bookkeeping, no callbacks: the cache stores here and does the waking.
"""

from __future__ import annotations

from inferway.xds.snapshot import Snapshot

__all__ = ["SnapshotStore"]


class SnapshotStore:
    """group -> served snapshot."""

    def __init__(self) -> None:
        self._served: dict[str, Snapshot] = {}

    def groups(self) -> list[str]:
        """The groups a snapshot was served to, sorted."""
        return sorted(self._served)

    def served(self, group: str) -> Snapshot | None:
        return self._served.get(group)

    def serve(self, group: str, snapshot: Snapshot) -> bool:
        """Serve ``snapshot`` to ``group``; False when that version is already served."""
        served = self._served.get(group)
        if served is not None and served.version == snapshot.version:
            return False
        self._served[group] = snapshot
        return True
