"""Cost arithmetic, pure: replica-hours times the price plus the priced tokens, spread over
requests, rows and tokens.

A window is a list of Intervals (one per query step) per service; every figure of the report
is a sum or a ratio of sums over them, so two halves of a window add up to the whole and a
ratio is never an average of ratios (a quiet hour does not weigh as much as a busy one).
A ratio over nothing (no requests, no rows, no replica time) is None, not 0 or infinity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Interval", "ServiceCost", "per_thousand", "ratio", "spend", "summarize"]


def spend(per_replica_hour: float, replicas: float, hours: float) -> float:
    """What ``replicas`` replicas (a mean over the interval) cost for ``hours``."""
    return per_replica_hour * replicas * hours


def ratio(numerator: float, denominator: float | None) -> float | None:
    return None if not denominator else numerator / denominator


def per_thousand(cost: float, requests: float) -> float | None:
    """Cost per 1,000 requests (None without requests)."""
    return None if requests <= 0 else cost * 1000.0 / requests


@dataclass(frozen=True)
class Interval:
    """One query step of one service. ``replicas`` is the mean replica count over the step,
    ``requests`` the requests answered in it; ``rows`` and ``busy_s`` (seconds the backends
    spent computing batches) are None where the backend's model is not known or reports none.
    ``tokens`` are the LLM tokens the gateway counted for the service (None: it counted none),
    ``token_spend`` what those tokens cost at the policy's per-token prices.
    """

    end: float
    hours: float
    per_replica_hour: float
    replicas: float
    requests: float
    rows: float | None = None
    busy_s: float | None = None
    tokens: float | None = None
    token_spend: float = 0.0

    @property
    def spend(self) -> float:
        return spend(self.per_replica_hour, self.replicas, self.hours) + self.token_spend


@dataclass(frozen=True)
class ServiceCost:
    """A service's cost over a window: sums, and the ratios of those sums."""

    service: str
    currency: str
    hours: float
    replica_hours: float
    spend: float
    requests: float
    rows: float | None
    busy_s: float | None
    budget_per_1k_requests: float | None = None
    budget_per_day: float | None = None
    tokens: float | None = None
    token_spend: float = 0.0
    budget_per_1k_tokens: float | None = None

    @property
    def cost_per_hour(self) -> float | None:
        return ratio(self.spend, self.hours)

    @property
    def cost_per_1k_requests(self) -> float | None:
        return per_thousand(self.spend, self.requests)

    @property
    def cost_per_row(self) -> float | None:
        return None if self.rows is None else ratio(self.spend, self.rows)

    @property
    def cost_per_1k_tokens(self) -> float | None:
        """Everything the service cost (replicas and priced tokens) per 1,000 tokens."""
        return None if self.tokens is None else per_thousand(self.spend, self.tokens)

    @property
    def over_budget_per_1k_tokens(self) -> float | None:
        """Cost per 1,000 tokens over its budget, as a fraction (0.15 = 15% over)."""
        per_1k, budget = self.cost_per_1k_tokens, self.budget_per_1k_tokens
        return None if per_1k is None or budget is None else per_1k / budget - 1.0

    @property
    def utilization(self) -> float | None:
        """Busy seconds per replica-second (above 1 when a replica computes batches of
        several model instances at once)."""
        return None if self.busy_s is None else ratio(self.busy_s, self.replica_hours * 3600)

    @property
    def over_budget_per_1k(self) -> float | None:
        """Cost per 1,000 requests over its budget, as a fraction (0.15 = 15% over)."""
        per_1k, budget = self.cost_per_1k_requests, self.budget_per_1k_requests
        return None if per_1k is None or budget is None else per_1k / budget - 1.0

    def to_dict(self) -> dict[str, object]:
        return {
            "service": self.service,
            "currency": self.currency,
            "hours": self.hours,
            "replica_hours": self.replica_hours,
            "spend": self.spend,
            "requests": self.requests,
            "rows": self.rows,
            "cost_per_hour": self.cost_per_hour,
            "cost_per_1k_requests": self.cost_per_1k_requests,
            "cost_per_row": self.cost_per_row,
            "utilization": self.utilization,
            "budget_per_1k_requests": self.budget_per_1k_requests,
            "over_budget_per_1k": self.over_budget_per_1k,
            "budget_per_day": self.budget_per_day,
            "tokens": self.tokens,
            "token_spend": self.token_spend,
            "cost_per_1k_tokens": self.cost_per_1k_tokens,
            "budget_per_1k_tokens": self.budget_per_1k_tokens,
            "over_budget_per_1k_tokens": self.over_budget_per_1k_tokens,
        }


def _sum_known(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def summarize(
    service: str,
    currency: str,
    intervals: Sequence[Interval],
    *,
    budget_per_1k_requests: float | None = None,
    budget_per_day: float | None = None,
    budget_per_1k_tokens: float | None = None,
) -> ServiceCost:
    """The window's sums; rows, busy time and tokens over the intervals that report them."""
    return ServiceCost(
        service=service,
        currency=currency,
        hours=sum(i.hours for i in intervals),
        replica_hours=sum(i.replicas * i.hours for i in intervals),
        spend=sum(i.spend for i in intervals),
        requests=sum(i.requests for i in intervals),
        rows=_sum_known([i.rows for i in intervals]),
        busy_s=_sum_known([i.busy_s for i in intervals]),
        budget_per_1k_requests=budget_per_1k_requests,
        budget_per_day=budget_per_day,
        tokens=_sum_known([i.tokens for i in intervals]),
        token_spend=sum(i.token_spend for i in intervals),
        budget_per_1k_tokens=budget_per_1k_tokens,
    )
