"""Token limits per client key: tokens per minute and per day, in fixed windows.

A request is checked at its headers (before any body is read or any backend asked) against
what the client used in the current windows, and its tokens are debited when its ``usage``
is known, so one request may overshoot a limit by its own size; the next is refused, with
``Retry-After`` the seconds until the window that is full ends. The counts live behind
:class:`BudgetStore`; :class:`MemoryBudgetStore` is per gateway (per Envoy). The interface is
async and keyed by plain strings so a shared store (the fleet's, inferway/gateway/fleet/)
can back it without a change here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "WINDOWS",
    "BudgetStore",
    "LimitSpec",
    "MemoryBudgetStore",
    "Refusal",
    "TokenBudget",
]

WINDOWS = {"tokens_per_minute": 60.0, "tokens_per_day": 86_400.0}
"""Limit name -> window length in seconds (windows start on the epoch's minute / UTC day)."""


class BudgetStore(Protocol):
    """Token counts per (client key, window); a window is named by its limit and index."""

    async def used(self, key: str, window: str) -> int: ...

    async def add(self, key: str, window: str, tokens: int, expires_at: float) -> int:
        """Add ``tokens``; returns the new total. ``expires_at``: when the count can go."""
        ...


class MemoryBudgetStore:
    """This process's counts; expired windows are dropped as new ones are written."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counts: dict[tuple[str, str], tuple[int, float]] = {}

    async def used(self, key: str, window: str) -> int:
        return self._counts.get((key, window), (0, 0.0))[0]

    async def add(self, key: str, window: str, tokens: int, expires_at: float) -> int:
        now = self._clock()
        if len(self._counts) > 1024:  # keep the table small on a long-lived gateway
            self._counts = {k: v for k, v in self._counts.items() if v[1] > now}
        total = self._counts.get((key, window), (0, expires_at))[0] + tokens
        self._counts[(key, window)] = (total, expires_at)
        return total


@dataclass(frozen=True)
class LimitSpec:
    name: str
    """A key of :data:`WINDOWS`: ``tokens_per_minute`` or ``tokens_per_day``."""
    tokens: int


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: which limit, its size, what was used, when to come back."""

    limit: str
    tokens: int
    used: int
    retry_after_s: int


class TokenBudget:
    """The limits every client key gets; ``clock`` is wall-clock seconds (windows are UTC)."""

    def __init__(
        self,
        limits: Sequence[LimitSpec],
        store: BudgetStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for spec in limits:
            if spec.name not in WINDOWS:
                raise ValueError(f"unknown token limit {spec.name!r}; known: {sorted(WINDOWS)}")
        self.limits = tuple(limits)
        self._store = store
        self._clock = clock

    def _window(self, spec: LimitSpec, now: float) -> tuple[str, float]:
        length = WINDOWS[spec.name]
        index = math.floor(now / length)
        return f"{spec.name}:{index}", (index + 1) * length

    async def check(self, key: str) -> Refusal | None:
        """The first limit ``key`` has used up in its current window, if any."""
        now = self._clock()
        for spec in self.limits:
            window, ends = self._window(spec, now)
            used = await self._store.used(key, window)
            if used >= spec.tokens:
                return Refusal(spec.name, spec.tokens, used, max(1, math.ceil(ends - now)))
        return None

    async def debit(self, key: str, tokens: int) -> None:
        if tokens <= 0:
            return
        now = self._clock()
        for spec in self.limits:
            window, ends = self._window(spec, now)
            await self._store.add(key, window, tokens, ends)
