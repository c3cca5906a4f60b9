"""The pick: candidates (the pool, or the subset Envoy names), minus saturated ones, scored and
weighed; the winner first, then ordered fallbacks; 503 when there is no endpoint, 429 when all
are saturated and the policy sheds. Each pick says why (scores per endpoint, winner, reason).

Load between scrapes comes from the picker's own count: a request is in flight from its pick
to ``finish(ticket)``; those picked since an endpoint's last scrape are added to the scraped
queue (the scrape could not see them), so a burst between two scrapes still spreads.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferway.gateway.picker.core.metrics import ServerMetrics
from inferway.gateway.picker.core.prefix import PrefixIndex
from inferway.gateway.picker.core.scorers import EndpointView, Request, Weights, score_all

__all__ = ["Pick", "Picker", "PickerConfig"]


@dataclass(frozen=True, slots=True)
class PickerConfig:
    weights: Weights = field(default_factory=Weights)
    queue_limit: float = 8.0
    """An endpoint with this many requests waiting or running is saturated."""
    kv_cache_limit: float = 0.95
    """... or with this fraction of its KV cache in use."""
    fallbacks: int = 2
    shed: bool = False
    """All candidates saturated: 429 (shed) when True, else the least loaded still gets it."""
    block_chars: int = 64
    max_blocks: int = 256
    blocks_per_endpoint: int = 8192
    max_endpoints: int = 256
    """The prefix index's bound: about 150 bytes a block, so at most ~300 MB (64 endpoints
    full: ~75 MB); 8192 blocks of 64 characters is ~128k tokens of prompts per endpoint."""
    max_sessions: int = 65536


@dataclass(frozen=True, slots=True)
class Pick:
    status: int
    """200: ``endpoints`` holds the winner then the fallbacks; 503: none; 429: shed."""
    endpoints: tuple[str, ...]
    reason: str
    scores: dict[str, dict[str, float]]
    """Endpoint -> scorer -> score, plus ``total`` (weighted mean) and ``depth``."""
    ticket: int | None = None

    def explain(self) -> dict[str, Any]:
        """Span/log attributes: ``picker.winner``, ``picker.reason``, ``picker.scores``."""
        return {
            "picker.status": self.status,
            "picker.winner": self.endpoints[0] if self.endpoints else "",
            "picker.fallbacks": ",".join(self.endpoints[1:]),
            "picker.reason": self.reason,
            "picker.scores": {
                e: {k: round(v, 4) for k, v in s.items()} for e, s in self.scores.items()
            },
        }


@dataclass(slots=True)
class _Endpoint:
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    in_flight: int = 0
    since_scrape: int = 0
    epoch: int = 0
    picks: int = 0
    blocks_asked: int = 0
    blocks_hit: int = 0

    def depth(self) -> float:
        scraped = self.metrics.waiting, self.metrics.running
        if scraped == (None, None):
            return float(self.in_flight)
        return max(float(self.in_flight), sum(x or 0.0 for x in scraped) + self.since_scrape)


class Picker:
    """The picker's state: the pool, each endpoint's load, the prefix index, the sessions."""

    def __init__(
        self, config: PickerConfig | None = None, rng: random.Random | None = None
    ) -> None:
        self.config = config or PickerConfig()
        self.index = PrefixIndex(self.config.blocks_per_endpoint, self.config.max_endpoints)
        self._endpoints: dict[str, _Endpoint] = {}
        self._tickets: dict[int, tuple[str, int]] = {}
        self._next_ticket = 0
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._rng = rng or random.Random()

    def set_endpoints(self, endpoints: Iterable[str]) -> None:
        """The pool now: new endpoints start empty, removed ones are forgotten."""
        wanted = list(dict.fromkeys(endpoints))
        for gone in set(self._endpoints) - set(wanted):
            del self._endpoints[gone]
            self.index.forget(gone)
        for endpoint in wanted:
            self._endpoints.setdefault(endpoint, _Endpoint())

    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def observe(self, endpoint: str, metrics: ServerMetrics) -> None:
        """A fresh scrape: it sees what was picked before it, so the count since restarts."""
        state = self._endpoints.get(endpoint)
        if state is not None:
            state.metrics, state.since_scrape, state.epoch = metrics, 0, state.epoch + 1

    def finish(self, ticket: int | None) -> None:
        """The request picked with ``ticket`` is done (answered, failed or cancelled)."""
        if ticket is None or ticket not in self._tickets:
            return
        endpoint, epoch = self._tickets.pop(ticket)
        state = self._endpoints.get(endpoint)
        if state is not None:
            state.in_flight = max(0, state.in_flight - 1)
            if state.epoch == epoch and state.since_scrape > 0:
                state.since_scrape -= 1

    def _saturated(self, state: _Endpoint, depth: float) -> bool:
        used = state.metrics.kv_cache
        return depth >= self.config.queue_limit or (
            used is not None and used >= self.config.kv_cache_limit
        )

    def pick(
        self,
        blocks: Sequence[int] = (),
        *,
        lora: str | None = None,
        session: str | None = None,
        subset: Sequence[str] | None = None,
    ) -> Pick:
        """Choose for one request (``subset``: Envoy's hint, GAIE's endpoint subset)."""
        pool = self._endpoints if subset is None else [e for e in subset if e in self._endpoints]
        if not pool:
            why = "no endpoint in the pool" if subset is None else "no pool endpoint in the subset"
            return Pick(503, (), why, {})
        depths = {e: self._endpoints[e].depth() for e in pool}
        open_ = [e for e in pool if not self._saturated(self._endpoints[e], depths[e])]
        if not open_ and self.config.shed:
            return Pick(429, (), f"all {len(pool)} endpoints saturated: shed", {})
        candidates = open_ or list(pool)
        prefix = self.index.matches(blocks, candidates) if blocks else {}
        sticky = self._sessions.get(session) if session else None
        views = {
            e: EndpointView(depths[e], self._endpoints[e].metrics, prefix.get(e, 0))
            for e in candidates
        }
        scores = score_all(views, Request(blocks, lora, sticky))
        weights = [(n, w) for n, w in self.config.weights.items() if w > 0]
        weight_sum = sum(w for _, w in weights) or 1.0
        table: dict[str, dict[str, float]] = {}
        for endpoint in candidates:
            row = {name: scores[name][endpoint] for name, _ in weights}
            row["total"] = sum(scores[n][endpoint] * w for n, w in weights) / weight_sum
            row["depth"] = depths[endpoint]
            table[endpoint] = row
        ranked = sorted(candidates, key=lambda e: (-table[e]["total"], self._rng.random()))
        chosen = tuple(ranked[: 1 + self.config.fallbacks])
        winner = chosen[0]
        reason = self._reason(winner, table, weights, len(pool) - len(open_), bool(open_))
        return Pick(200, chosen, reason, table, self._start(winner, blocks, prefix, session))

    def _start(
        self, winner: str, blocks: Sequence[int], prefix: dict[str, int], session: str | None
    ) -> int:
        state = self._endpoints[winner]
        state.in_flight += 1
        state.since_scrape += 1
        state.picks += 1
        state.blocks_asked += len(blocks)
        state.blocks_hit += prefix.get(winner, 0)
        if blocks:
            self.index.record(winner, blocks)
        if session:
            self._sessions[session] = winner
            self._sessions.move_to_end(session)
            if len(self._sessions) > self.config.max_sessions:
                self._sessions.popitem(last=False)
        self._next_ticket += 1
        self._tickets[self._next_ticket] = (winner, state.epoch)
        return self._next_ticket

    @staticmethod
    def _reason(
        winner: str,
        table: dict[str, dict[str, float]],
        weights: list[tuple[str, float]],
        saturated: int,
        any_open: bool,
    ) -> str:
        row = table[winner]
        parts = ", ".join(f"{n} {row[n]:.2f}x{w:g}" for n, w in weights)
        text = f"{winner} total {row['total']:.3f} ({parts}; depth {row['depth']:g})"
        others = sorted((r["total"], e) for e, r in table.items() if e != winner)
        if others:
            text += f"; runner-up {others[-1][1]} {others[-1][0]:.3f}"
        if saturated:
            text += f"; {saturated} saturated " + ("excluded" if any_open else "(all: least bad)")
        return text

    def stats(self) -> dict[str, dict[str, float | None]]:
        """Per endpoint: queue depth, in flight, KV cache use, picks, prefix-hit rate."""
        return {
            e: {
                "depth": s.depth(),
                "in_flight": float(s.in_flight),
                "kv_cache": s.metrics.kv_cache,
                "picks": float(s.picks),
                "prefix_hit_rate": s.blocks_hit / s.blocks_asked if s.blocks_asked else None,
            }
            for e, s in self._endpoints.items()
        }
