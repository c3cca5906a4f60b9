"""What the xDS server sent, counted by protocol and type: responses, resources, bytes.

A cache hook (``on_response``), so the protocol code only reports each response it wrote and
tests and benchmarks read plain counters: "this endpoint change sent exactly one resource"
is an assertion on :meth:`XdsStats.totals`, not on a log line. No metrics library here; a
Prometheus exporter can be another hook.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from inferway.xds.hooks import XdsObserver
from inferway.xds.records import SentResponse

__all__ = ["TypeCounts", "XdsStats"]


@dataclass(frozen=True)
class TypeCounts:
    responses: int = 0
    resources: int = 0
    removed: int = 0
    bytes: int = 0

    def __add__(self, other: TypeCounts) -> TypeCounts:
        return TypeCounts(
            self.responses + other.responses,
            self.resources + other.resources,
            self.removed + other.removed,
            self.bytes + other.bytes,
        )


class XdsStats(XdsObserver):
    """Running totals per (protocol, type_url); attach with ``cache.add_hook(stats)``."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], TypeCounts] = {}
        self.last: SentResponse | None = None

    def on_response(self, sent: SentResponse) -> None:
        key = (sent.protocol, sent.type_url)
        self._counts[key] = self._counts.get(key, TypeCounts()) + TypeCounts(
            1, sent.resources, sent.removed, sent.bytes
        )
        self.last = sent

    def totals(self, *, protocol: str | None = None, type_url: str | None = None) -> TypeCounts:
        """Sum over every (protocol, type) matching the filters (None matches all)."""
        total = TypeCounts()
        for (p, t), counts in self._counts.items():
            if (protocol is None or p == protocol) and (type_url is None or t == type_url):
                total = total + counts
        return total

    def by_type(self, protocol: str | None = None) -> dict[str, TypeCounts]:
        """type_url -> counts (summed over protocols unless ``protocol`` is given)."""
        out: dict[str, TypeCounts] = {}
        for (p, t), counts in self._counts.items():
            if protocol is None or p == protocol:
                out[t] = out.get(t, TypeCounts()) + counts
        return out

    def __iter__(self) -> Iterator[tuple[str, str, TypeCounts]]:
        for (p, t), counts in sorted(self._counts.items()):
            yield p, t, counts

    def reset(self) -> None:
        self._counts.clear()
        self.last = None
