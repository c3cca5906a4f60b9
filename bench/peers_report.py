"""The summary of ``peers.py``: medians over rounds of every (server, client, connections, c),
each round's throughput divided by the aiohttp yardstick's and by Mosec's *of the same round
and client* (an ``@defaults`` row by ``mosec@defaults``'s, where it ran), so the machine's
drift between rounds cancels."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["report_rows", "summarize"]

Key = tuple[str, str, int]  # client, connections, concurrency


def _key(point: dict[str, Any]) -> Key:
    return (point.get("client", "loadgen"), point["connections"], point["concurrency"])


def _ratio(points: list[dict[str, Any]], mine: list[dict[str, Any]], base: str) -> float | None:
    """The median over rounds of ``mine``'s throughput / ``base``'s of the same round."""
    ratios = []
    for p in mine:
        same = [
            q
            for q in points
            if q["round"] == p["round"] and q["server"] == base and _key(q) == _key(p)
        ]
        if same and same[0]["throughput"] > 0:
            ratios.append(p["throughput"] / same[0]["throughput"])
    return statistics.median(ratios) if ratios else None


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(points: list[dict[str, Any]], servers: Sequence[str]) -> list[dict[str, Any]]:
    """One row per server and (client, connections, c): medians over the rounds."""
    out = []
    for server in servers:
        for key in sorted({_key(p) for p in points}):
            mine = [p for p in points if p["server"] == server and _key(p) == key]
            if not mine:
                continue
            # a server with its own thread defaults is compared with Mosec with its own
            peer = "mosec@defaults" if server.endswith("@defaults") else "mosec"
            if not any(p["server"] == peer for p in points):
                peer = "mosec"
            mosec = [p for p in points if p["server"] == peer and _key(p) == key]
            out.append(
                {
                    "server": server,
                    "client": key[0],
                    "connections": key[1],
                    "concurrency": key[2],
                    "throughput": statistics.median(p["throughput"] for p in mine),
                    "ratio_to_aiohttp": _ratio(points, mine, "aiohttp"),
                    "ratio_to_mosec": _ratio(points, mine, peer),
                    "p50_ms": _median([p["p50_ms"] for p in mine]),
                    "p99_ms": _median([p["p99_ms"] for p in mine]),
                    "mosec_p99_ms": _median([p["p99_ms"] for p in mosec]),
                    "errors": sum(p["errors"] for p in mine),
                }
            )
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report_rows(summary: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The table's rows, in the order of the columns ``peers.py`` prints."""
    return [
        (
            s["server"],
            s["client"],
            s["connections"],
            s["concurrency"],
            f"{s['throughput']:.0f}",
            _fmt(s["ratio_to_aiohttp"], ".2f"),
            _fmt(s["ratio_to_mosec"], ".2f"),
            _fmt(s["p50_ms"], ".2f"),
            _fmt(s["p99_ms"], ".2f"),
            _fmt(s["mosec_p99_ms"], ".2f"),
            s["errors"],
        )
        for s in summary
    ]
