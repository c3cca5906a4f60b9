"""The next days' spend, forecast from the window's hourly spend with the autoscaler's own
Holt-Winters forecaster (a daily season of 24 hourly buckets once two days are known,
Holt's damped trend before that), and the deployment guide's rule: warn when the forecast
crosses the daily budget within the next 3 days. Pure: series in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferway.controllers.autoscale.forecast import HoltWinters

__all__ = ["WARN_DAYS_AHEAD", "BudgetWarning", "SpendForecast", "budget_warning", "forecast_spend"]

WARN_DAYS_AHEAD = 3
"""The guide's rule: a warning 3 days before a budget is exceeded."""
_SEASON = 24
# The predictive autoscaler's smoothing defaults (controllers/autoscale/params.py): slow trend,
# damped so that three days ahead do not run away on one busy afternoon.
_ALPHA, _BETA, _GAMMA, _PHI = 0.3, 0.02, 0.3, 0.95


@dataclass(frozen=True)
class SpendForecast:
    """Forecast spend per coming day (``daily[0]`` is the next 24 hours) and how it was made."""

    daily: tuple[float, ...]
    method: str


@dataclass(frozen=True)
class BudgetWarning:
    day: int  # 1 = the next 24 hours
    spend: float
    budget: float

    def describe(self, currency: str) -> str:
        when = "within 24 hours" if self.day == 1 else f"in {self.day} days"
        return (
            f"forecast spend {self.spend:.2f} {currency}/day exceeds the budget of "
            f"{self.budget:g} {currency}/day {when}"
        )


def forecast_spend(hourly: Sequence[float], *, days: int) -> SpendForecast:
    """``days`` daily totals after the last of ``hourly`` (spend per hourly bucket, oldest
    first). Under 2 hours of history there is nothing to fit: each day repeats the mean."""
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    if not hourly:
        return SpendForecast((0.0,) * days, "none: no history")
    if len(hourly) < 2:
        mean = sum(hourly) / len(hourly)
        return SpendForecast((mean * 24,) * days, "mean: under 2 hours of history")
    seasonal = len(hourly) >= 2 * _SEASON
    model = HoltWinters(
        alpha=_ALPHA,
        beta=_BETA,
        gamma=_GAMMA,
        phi=_PHI,
        season_length=_SEASON if seasonal else None,
    )
    for value in hourly:
        model.update(value)
    daily = []
    for day in range(days):
        total = 0.0
        for hour in range(1, 25):
            ahead = model.forecast(day * 24 + hour)
            total += max(0.0, ahead if ahead is not None else 0.0)
        daily.append(total)
    method = (
        "holt-winters, daily season"
        if seasonal
        else "holt, damped trend (no daily season under 48 hours of history)"
    )
    return SpendForecast(tuple(daily), method)


def budget_warning(
    forecast: SpendForecast, budget_per_day: float | None, *, within: int = WARN_DAYS_AHEAD
) -> BudgetWarning | None:
    """The first of the next ``within`` forecast days over ``budget_per_day``, if any."""
    if budget_per_day is None:
        return None
    for day, value in enumerate(forecast.daily[:within], start=1):
        if value > budget_per_day:
            return BudgetWarning(day, value, budget_per_day)
    return None
