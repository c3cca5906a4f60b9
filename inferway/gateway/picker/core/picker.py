"""The pick: candidates (the pool, or the subset Envoy names), minus saturated ones, scored and
weighed; the winner first, then ordered fallbacks; 503 when there is no endpoint, 429 when all
are saturated and the policy sheds. Each pick says why (scores per endpoint, winner, reason).

Load between scrapes comes from the picker's own count: a request is in flight from its pick
to ``finish(ticket)``; those picked since an endpoint's last scrape are added to the scraped
queue (the scrape could not see them) and those finished since are taken off it (it still
counts them), so a burst between two scrapes spreads instead of herding onto the server
whose last scrape looked emptiest.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferway.gateway.picker.core.metrics import ServerMetrics
from inferway.gateway.picker.core.prefix import PrefixIndex, prompt_blocks
from inferway.gateway.picker.core.scorers import (
    SCORERS,
    Weights,
    kv_cache_score,
    lora_score,
    prefix_score,
    queue_score,
    session_score,
)

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
    block_chars: int = 256
    max_blocks: int = 128
    blocks_per_endpoint: int = 8192
    max_endpoints: int = 256
    """The prefix index's bound: about 150 bytes a block, so at most ~300 MB (64 endpoints
    full: ~75 MB); 8192 blocks of 256 bytes is ~512k tokens of prompts per endpoint."""
    max_sessions: int = 65536


@dataclass(frozen=True, slots=True)
class Pick:
    status: int
    """200: ``endpoints`` holds the winner then the fallbacks; 503: none; 429: shed."""
    endpoints: tuple[str, ...]
    note: str
    """Why, when the pick says it itself (every 503 and 429); a scored pick's reason is
    written from its rows only when asked (``reason``): most picks are never explained."""
    rows: tuple[tuple[float, str, tuple[float, ...], float], ...] = ()
    """Every candidate, best first: (total, endpoint, the scores in ``SCORERS`` order, depth)."""
    ticket: int | None = None
    weights: tuple[tuple[str, float], ...] = ()
    """The weights the rows were scored with (scorer name, weight), for the reason."""
    saturated: int = 0
    """Endpoints found saturated: left out, or, when ``all_saturated``, the least bad won."""
    all_saturated: bool = False

    @property
    def reason(self) -> str:
        """Why this pick: the winner's weighted scores and depth, the runner-up, and how
        many endpoints were saturated; or the note of a pick that chose nobody."""
        if self.note or not self.rows:
            return self.note
        total, winner, scores, depth = self.rows[0]
        parts = ", ".join(
            f"{n} {s:.2f}x{w:g}" for (n, w), s in zip(self.weights, scores, strict=True) if w > 0
        )
        text = f"{winner} total {total:.3f} ({parts}; depth {depth:g})"
        if len(self.rows) > 1:
            text += f"; runner-up {self.rows[1][1]} {self.rows[1][0]:.3f}"
        if self.saturated:
            how = "(all: least bad)" if self.all_saturated else "excluded"
            text += f"; {self.saturated} saturated {how}"
        return text

    @property
    def scores(self) -> dict[str, dict[str, float]]:
        """Endpoint -> scorer -> score, plus ``total`` (weighted mean) and ``depth``."""
        return {
            endpoint: dict(zip(SCORERS, scores, strict=True)) | {"total": total, "depth": depth}
            for total, endpoint, scores, depth in self.rows
        }

    def explain(self, top: int | None = None) -> dict[str, Any]:
        """Span/log attributes: ``picker.winner``, ``picker.reason``, ``picker.scores`` (the
        ``top`` best candidates' scores; all when None) and ``picker.candidates``."""
        rows = self.rows if top is None else self.rows[:top]
        return {
            "picker.status": self.status,
            "picker.winner": self.endpoints[0] if self.endpoints else "",
            "picker.fallbacks": ",".join(self.endpoints[1:]),
            "picker.reason": self.reason,
            "picker.candidates": len(self.rows),
            "picker.scores": {
                endpoint: {k: round(v, 4) for k, v in zip(SCORERS, scores, strict=True)}
                | {"total": round(total, 4), "depth": depth}
                for total, endpoint, scores, depth in rows
            },
        }


@dataclass(slots=True)
class _Endpoint:
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    in_flight: int = 0
    since_scrape: int = 0
    """Picked since the last scrape and still open (the scrape could not count them)."""
    done_since_scrape: int = 0
    """Picked before the last scrape, finished after it (the scrape still counts them)."""
    epoch: int = 0
    picks: int = 0
    blocks_asked: int = 0
    blocks_hit: int = 0

    def kv_cache(self, depth: float) -> float | None:
        """KV-cache use now: the scrape's, moved by the requests opened or finished since at
        the scrape's use per request (a stale gauge herds like a stale queue does)."""
        used = self.metrics.kv_cache
        scraped = (self.metrics.waiting or 0.0) + (self.metrics.running or 0.0)
        if used is None or scraped <= 0:
            return used
        return min(1.0, max(0.0, used + (depth - scraped) * used / scraped))

    def depth(self) -> float:
        scraped = self.metrics.waiting, self.metrics.running
        if scraped == (None, None):
            return float(self.in_flight)
        counted = max(0.0, sum(x or 0.0 for x in scraped) - self.done_since_scrape)
        return max(float(self.in_flight), counted + self.since_scrape)


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
        self._weights = tuple(self.config.weights.items())

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

    def blocks(self, text: str | None) -> list[int]:
        """The prompt's blocks as this picker cuts them (``block_chars``, ``max_blocks``)."""
        if not text:
            return []
        return prompt_blocks(text, self.config.block_chars, self.config.max_blocks)

    def observe(self, endpoint: str, metrics: ServerMetrics) -> None:
        """A fresh scrape: it sees what was picked before it, so the count since restarts."""
        state = self._endpoints.get(endpoint)
        if state is not None:
            state.metrics, state.since_scrape, state.epoch = metrics, 0, state.epoch + 1
            state.done_since_scrape = 0

    def finish(self, ticket: int | None) -> None:
        """The request picked with ``ticket`` is done (answered, failed or cancelled)."""
        if ticket is None or ticket not in self._tickets:
            return
        endpoint, epoch = self._tickets.pop(ticket)
        state = self._endpoints.get(endpoint)
        if state is not None:
            state.in_flight = max(0, state.in_flight - 1)
            if state.epoch == epoch:
                state.since_scrape = max(0, state.since_scrape - 1)
            else:
                state.done_since_scrape += 1

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
            return Pick(503, (), why)
        states = self._endpoints
        config = self.config
        limit, kv_limit = config.queue_limit, config.kv_cache_limit
        loads = {}  # endpoint -> (depth, KV cache use)
        open_ = []
        for endpoint in pool:
            state = states[endpoint]
            depth = state.depth()
            used = state.kv_cache(depth)
            loads[endpoint] = depth, used
            if depth < limit and (used is None or used < kv_limit):
                open_.append(endpoint)
        if not open_ and config.shed:
            return Pick(429, (), f"all {len(pool)} endpoints saturated: shed", ())
        candidates = open_ or list(pool)
        prefix = self.index.matches(blocks, candidates) if blocks else {}
        sticky = self._sessions.get(session) if session else None
        w = config.weights
        weight_sum = (w.queue + w.kv_cache + w.prefix + w.lora + w.session) or 1.0
        n_blocks = len(blocks)
        rows = []
        jitter = self._rng.random
        for endpoint in candidates:  # one pass: a pick over 64 endpoints stays cheap
            depth, used = loads[endpoint]
            scores = (
                queue_score(depth, limit),
                kv_cache_score(used),
                prefix_score(prefix.get(endpoint, 0), n_blocks),
                lora_score(states[endpoint].metrics, lora),
                session_score(endpoint, sticky),
            )
            total = (
                w.queue * scores[0] + w.kv_cache * scores[1] + w.prefix * scores[2]
                + w.lora * scores[3] + w.session * scores[4]
            ) / weight_sum  # fmt: skip
            rows.append((total, jitter(), endpoint, scores, depth))
        rows.sort(reverse=True)  # best first; equal totals in random order
        ranked = tuple([(t, e, s, d) for t, _, e, s, d in rows])
        chosen = tuple([row[1] for row in ranked[: 1 + config.fallbacks]])
        ticket = self._start(chosen[0], blocks, prefix, session)
        saturated = len(pool) - len(open_)
        return Pick(200, chosen, "", ranked, ticket, self._weights, saturated, not open_)

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

    def stats(self) -> dict[str, dict[str, float | None]]:
        """Per endpoint: queue depth, in flight, KV cache use, picks, prefix-hit rate."""
        return {
            e: {
                "depth": s.depth(),
                "in_flight": float(s.in_flight),
                "kv_cache": s.kv_cache(s.depth()),
                "picks": float(s.picks),
                "prefix_hit_rate": s.blocks_hit / s.blocks_asked if s.blocks_asked else None,
            }
            for e, s in self._endpoints.items()
        }
