"""Which streams watch which group: the cache wakes them when that group's snapshot changes.

Plain callbacks, never awaited, so one slow Envoy cannot hold up the others: a stream's
``notify`` only queues an event for its own task.
"""

from __future__ import annotations

from inferway.xds.config_watcher import CancelWatch, Notify

__all__ = ["WatchRegistry"]


class WatchRegistry:
    """group -> stream id -> notify callback."""

    def __init__(self) -> None:
        self._watchers: dict[str, dict[int, Notify]] = {}

    def watch(self, group: str, stream_id: int, notify: Notify) -> CancelWatch:
        """Call ``notify()`` whenever ``group`` changes, until the returned cancel is called."""
        self._watchers.setdefault(group, {})[stream_id] = notify

        def cancel() -> None:
            self.cancel(group, stream_id)

        return cancel

    def cancel(self, group: str, stream_id: int) -> None:
        self._watchers.get(group, {}).pop(stream_id, None)

    def notify(self, group: str) -> None:
        """Wake every stream watching ``group``."""
        for notify in list(self._watchers.get(group, {}).values()):
            notify()
