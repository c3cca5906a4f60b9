"""Server-Sent Events as an OpenAI-compatible engine streams them, split at event boundaries.

Pure: bytes in, events out. A chunk from Envoy may end in the middle of an event, so the
splitter keeps the unfinished tail for the next chunk. Events are kept as the exact bytes the
engine sent (separator included), so passing them on changes nothing a client sees; only an
event the gateway itself asked for (the usage chunk, docs/llm.md) is ever dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DONE", "SseEvent", "SseSplitter", "event_data"]

DONE = "[DONE]"
"""OpenAI's last ``data:`` payload of a stream."""
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


@dataclass(frozen=True)
class SseEvent:
    raw: bytes
    """The event's bytes as received, its blank-line separator included."""
    data: str | None
    """Its ``data:`` lines joined by newlines (None: a comment or an event without data)."""


def event_data(raw: bytes) -> str | None:
    """The ``data`` field of one event (WHATWG HTML, "event stream interpretation")."""
    lines: list[str] = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
        elif line == "data":
            lines.append("")
    return "\n".join(lines) if lines else None


class SseSplitter:
    """Feed the body chunk by chunk; get every event completed so far."""

    def __init__(self) -> None:
        self._tail = b""

    @property
    def pending(self) -> bytes:
        """Bytes of an event not finished yet."""
        return self._tail

    def feed(self, chunk: bytes) -> list[SseEvent]:
        data = self._tail + chunk
        events: list[SseEvent] = []
        start = 0
        for match in _BOUNDARY.finditer(data):
            raw = data[start : match.end()]
            events.append(SseEvent(raw=raw, data=event_data(raw)))
            start = match.end()
        self._tail = data[start:]
        return events

    def finish(self) -> list[SseEvent]:
        """At the end of the body: an unterminated last event still counts."""
        tail, self._tail = self._tail, b""
        if not tail.strip():
            return [SseEvent(raw=tail, data=None)] if tail else []
        return [SseEvent(raw=tail, data=event_data(tail))]
