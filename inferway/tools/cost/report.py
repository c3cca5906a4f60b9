"""``inferway report cost`` as data, pure: each service's Intervals over the window in, its
sums and ratios, the forecast of the next days' spend and any budget warning out. The
fetching (Prometheus) and the printing (the CLI) are elsewhere."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferway.tools.cost.spend import Interval, ServiceCost, summarize
from inferway.tools.cost.spend_forecast import (
    WARN_DAYS_AHEAD,
    BudgetWarning,
    SpendForecast,
    budget_warning,
    forecast_spend,
)

__all__ = ["CostReport", "ServiceReport", "ServiceSeries", "build_report"]


@dataclass(frozen=True)
class ServiceSeries:
    """What the history holds for one service: hourly Intervals, oldest first."""

    service: str
    currency: str
    intervals: Sequence[Interval]
    budget_per_1k_requests: float | None = None
    budget_per_day: float | None = None
    budget_per_1k_tokens: float | None = None


@dataclass(frozen=True)
class ServiceReport:
    cost: ServiceCost
    forecast: SpendForecast
    warning: BudgetWarning | None

    @property
    def budget_per_1k_exceeded(self) -> bool:
        over = self.cost.over_budget_per_1k
        return over is not None and over > 0

    @property
    def budget_per_1k_tokens_exceeded(self) -> bool:
        over = self.cost.over_budget_per_1k_tokens
        return over is not None and over > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.cost.to_dict(),
            "forecast": {
                "method": self.forecast.method,
                "daily_spend": list(self.forecast.daily),
            },
            "warning": None if self.warning is None else self.warning.describe(self.cost.currency),
        }


@dataclass(frozen=True)
class CostReport:
    start: float
    end: float
    services: tuple[ServiceReport, ...]

    def totals(self) -> dict[str, float]:
        """Spend per currency over the window (never summed across currencies)."""
        out: dict[str, float] = {}
        for s in self.services:
            out[s.cost.currency] = out.get(s.cost.currency, 0.0) + s.cost.spend
        return dict(sorted(out.items()))

    @property
    def warnings(self) -> list[str]:
        found = []
        for s in self.services:
            if s.warning is not None:
                found.append(f"{s.cost.service}: {s.warning.describe(s.cost.currency)}")
            if s.budget_per_1k_exceeded:
                over = s.cost.over_budget_per_1k or 0.0
                found.append(
                    f"{s.cost.service}: cost per 1,000 requests {s.cost.cost_per_1k_requests:.4f} "
                    f"{s.cost.currency} is {over:.0%} over the budget of "
                    f"{s.cost.budget_per_1k_requests:g} {s.cost.currency}"
                )
            if s.budget_per_1k_tokens_exceeded:
                over = s.cost.over_budget_per_1k_tokens or 0.0
                found.append(
                    f"{s.cost.service}: cost per 1,000 tokens {s.cost.cost_per_1k_tokens:.6f} "
                    f"{s.cost.currency} is {over:.0%} over the budget of "
                    f"{s.cost.budget_per_1k_tokens:g} {s.cost.currency}"
                )
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "services": [s.to_dict() for s in self.services],
            "totals": self.totals(),
            "warnings": self.warnings,
        }


def build_report(
    series: Sequence[ServiceSeries],
    *,
    start: float,
    end: float,
    days: int = WARN_DAYS_AHEAD,
) -> CostReport:
    """One ServiceReport per service, by name; the forecast runs on the hourly spend."""
    reports = []
    for s in sorted(series, key=lambda x: x.service):
        cost = summarize(
            s.service,
            s.currency,
            s.intervals,
            budget_per_1k_requests=s.budget_per_1k_requests,
            budget_per_day=s.budget_per_day,
            budget_per_1k_tokens=s.budget_per_1k_tokens,
        )
        hourly = [i.spend / i.hours for i in s.intervals if i.hours > 0]
        forecast = forecast_spend(hourly, days=max(days, WARN_DAYS_AHEAD))
        reports.append(ServiceReport(cost, forecast, budget_warning(forecast, s.budget_per_day)))
    return CostReport(start, end, tuple(reports))
