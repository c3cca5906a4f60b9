"""Observer hooks for the xDS cache and server, so metrics and tracing attach from outside and
the protocol code stays free of them.

A hook is any object with some of these methods; missing ones are skipped, and an exception
raised by a hook is logged and swallowed: observing the control plane must never break it.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from inferway.xds.records import NackRecord, NodeStatus, Rejection
from inferway.xds.stats import SentResponse

__all__ = ["HOOK_METHODS", "XdsHook", "call_hooks"]

_log = logging.getLogger(__name__)

HOOK_METHODS = (
    "on_push",
    "on_ack",
    "on_nack",
    "on_reject",
    "on_connect",
    "on_disconnect",
    "on_response",
)


class XdsHook(Protocol):
    """The full observer surface; implement any subset (duck-typed, checked by name)."""

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None: ...

    def on_ack(self, node_id: str, type_url: str, version: str) -> None: ...

    def on_nack(self, record: NackRecord) -> None: ...

    def on_reject(self, rejection: Rejection) -> None:
        """A snapshot was refused because an Envoy NACKed it; the cache serves the last good."""

    def on_connect(self, status: NodeStatus) -> None: ...

    def on_disconnect(self, status: NodeStatus) -> None: ...

    def on_response(self, sent: SentResponse) -> None: ...


def call_hooks(hooks: list[Any], method: str, *args: Any) -> None:
    for hook in hooks:
        handler = getattr(hook, method, None)
        if handler is None:
            continue
        try:
            handler(*args)
        except Exception:  # a broken observer must not break the protocol
            _log.exception("xDS hook %r.%s failed", hook, method)
