"""Observer hooks for the xDS cache and server, so metrics and tracing attach from outside and
the protocol code stays free of them.

A hook implements :class:`XdsHook`, the whole observer surface; subclass :class:`XdsObserver`
(every method a no-op) and override the events you watch. :class:`HookBus` calls the attached
hooks in order, and an exception raised by one is logged and swallowed: observing the control
plane must never break it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from inferway.xds.records import NackRecord, NodeStatus, Rejection, SentResponse

__all__ = ["HookBus", "XdsHook", "XdsObserver"]

_log = logging.getLogger(__name__)


@runtime_checkable
class XdsHook(Protocol):
    """What the cache and the streams report, one method per event."""

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None:
        """A response is about to be written to ``node_id``'s stream."""

    def on_ack(self, node_id: str, type_url: str, version: str) -> None:
        """``node_id`` accepted ``version`` of ``type_url``."""

    def on_nack(self, record: NackRecord) -> None:
        """A node rejected a response (recorded whether or not it refuses a snapshot)."""

    def on_reject(self, rejection: Rejection) -> None:
        """A snapshot was refused because an Envoy NACKed it; the cache serves the last good."""

    def on_connect(self, status: NodeStatus) -> None:
        """A stream of ``status.node_id`` opened."""

    def on_disconnect(self, status: NodeStatus) -> None:
        """The last stream of ``status.node_id`` closed."""

    def on_response(self, sent: SentResponse) -> None:
        """A response was written (protocol, resources, bytes)."""


class XdsObserver:
    """An :class:`XdsHook` that ignores every event: subclass it and override what you watch
    (a hook then stays valid when an event is added)."""

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None:
        return None

    def on_ack(self, node_id: str, type_url: str, version: str) -> None:
        return None

    def on_nack(self, record: NackRecord) -> None:
        return None

    def on_reject(self, rejection: Rejection) -> None:
        return None

    def on_connect(self, status: NodeStatus) -> None:
        return None

    def on_disconnect(self, status: NodeStatus) -> None:
        return None

    def on_response(self, sent: SentResponse) -> None:
        return None


class HookBus:
    """The attached hooks; each ``on_*`` here calls that method of every hook, in order."""

    def __init__(self) -> None:
        self._hooks: list[XdsHook] = []

    def add(self, hook: XdsHook) -> None:
        if not isinstance(hook, XdsHook):
            raise TypeError(
                f"{hook!r} is not an xDS hook: subclass inferway.xds.hooks.XdsObserver "
                "and override the events it observes"
            )
        self._hooks.append(hook)

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None:
        self._each("on_push", lambda hook: hook.on_push(node_id, type_url, version, resource_count))

    def on_ack(self, node_id: str, type_url: str, version: str) -> None:
        self._each("on_ack", lambda hook: hook.on_ack(node_id, type_url, version))

    def on_nack(self, record: NackRecord) -> None:
        self._each("on_nack", lambda hook: hook.on_nack(record))

    def on_reject(self, rejection: Rejection) -> None:
        self._each("on_reject", lambda hook: hook.on_reject(rejection))

    def on_connect(self, status: NodeStatus) -> None:
        self._each("on_connect", lambda hook: hook.on_connect(status))

    def on_disconnect(self, status: NodeStatus) -> None:
        self._each("on_disconnect", lambda hook: hook.on_disconnect(status))

    def on_response(self, sent: SentResponse) -> None:
        self._each("on_response", lambda hook: hook.on_response(sent))

    def _each(self, event: str, call: Callable[[XdsHook], None]) -> None:
        for hook in self._hooks:
            try:
                call(hook)
            except Exception:  # a broken observer must not break the protocol
                _log.exception("xDS hook %r.%s failed", hook, event)
