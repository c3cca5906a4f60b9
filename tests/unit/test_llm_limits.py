"""Token limits, the pure parts: fixed windows per client key, Retry-After to the window's
end, a day limit and a minute limit side by side, and client keys never raw."""

from __future__ import annotations

import asyncio

import pytest

from inferway.gateway.llm.client_key import ANONYMOUS, client_key
from inferway.gateway.llm.limits import LimitSpec, MemoryBudgetStore, TokenBudget


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_minute_limit_refuses_until_the_window_ends() -> None:
    clock = Clock(600.0 + 45.0)  # 45 s into a minute
    budget = TokenBudget([LimitSpec("tokens_per_minute", 100)], MemoryBudgetStore(clock), clock)

    async def run() -> None:
        assert await budget.check("a") is None
        await budget.debit("a", 60)
        assert await budget.check("a") is None  # 60 < 100: one more may overshoot
        await budget.debit("a", 60)
        refusal = await budget.check("a")
        assert refusal is not None
        assert (refusal.limit, refusal.tokens, refusal.used, refusal.retry_after_s) == (
            "tokens_per_minute",
            100,
            120,
            15,
        )
        assert await budget.check("b") is None, "limits are per client key"
        clock.now = 660.0  # the next minute
        assert await budget.check("a") is None

    asyncio.run(run())


def test_the_day_limit_holds_across_minutes() -> None:
    clock = Clock(86_400.0 * 3 + 100.0)
    limits = [LimitSpec("tokens_per_minute", 1000), LimitSpec("tokens_per_day", 150)]
    budget = TokenBudget(limits, MemoryBudgetStore(clock), clock)

    async def run() -> None:
        await budget.debit("a", 100)
        clock.now += 120
        await budget.debit("a", 100)
        refusal = await budget.check("a")
        assert refusal is not None and refusal.limit == "tokens_per_day"
        assert refusal.retry_after_s == 86_400 - 220

    asyncio.run(run())


def test_unknown_limits_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown token limit 'tokens_per_hour'"):
        TokenBudget([LimitSpec("tokens_per_hour", 1)], MemoryBudgetStore())


def test_client_keys_are_hashed_never_raw() -> None:
    key = client_key({"x-api-key": "sk-secret"}, "x-api-key")
    assert key.startswith("key-") and "secret" not in key
    assert key == client_key({"authorization": "Bearer sk-secret"}, "x-api-key")
    assert client_key({"x-tenant": "team-a"}, "x-tenant", hashed=False) == "team-a"
    assert client_key({"authorization": "Basic abc"}, "x-api-key") == ANONYMOUS
