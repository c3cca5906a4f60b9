"""Cost arithmetic (tools/cost/spend.py), the spend forecast and its budget rule
(spend_forecast.py), the report's assembly (report.py) and the policy's ``cost:`` section:
figures worked out by hand, properties over generated windows, located errors."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferway.policies import PolicyError, load_policy_text
from inferway.tools.cost.report import ServiceSeries, build_report
from inferway.tools.cost.spend import Interval, per_thousand, spend, summarize
from inferway.tools.cost.spend_forecast import (
    WARN_DAYS_AHEAD,
    SpendForecast,
    budget_warning,
    forecast_spend,
)

# -- by hand ------------------------------------------------------------------------------------


def test_the_issue_s_example_four_replicas_for_a_day() -> None:
    day = [Interval(end=h * 3600.0, hours=1.0, per_replica_hour=2.40, replicas=4, requests=720_000)
           for h in range(24)]  # fmt: skip
    cost = summarize("model", "USD", day, budget_per_1k_requests=0.01)
    assert cost.spend == pytest.approx(2.40 * 4 * 24)  # 230.40 USD
    assert cost.cost_per_hour == pytest.approx(9.60)
    assert cost.replica_hours == 96
    # 200 req/s: 9.60 / 720 thousand requests per hour
    assert cost.cost_per_1k_requests == pytest.approx(9.60 / 720)
    assert cost.over_budget_per_1k == pytest.approx(9.60 / 720 / 0.01 - 1)  # 33% over
    assert cost.rows is None and cost.cost_per_row is None and cost.utilization is None


def test_rows_and_busy_time_count_only_where_reported() -> None:
    window = [
        Interval(0, 1.0, 3.0, replicas=2, requests=1000, rows=4000, busy_s=3600),
        Interval(1, 1.0, 3.0, replicas=2, requests=1000, rows=None, busy_s=None),
    ]
    cost = summarize("m", "EUR", window)
    assert cost.rows == 4000 and cost.cost_per_row == pytest.approx(12.0 / 4000)
    assert cost.utilization == pytest.approx(3600 / (4 * 3600))


def test_cost_per_1k_tokens_spreads_replicas_and_priced_tokens_over_the_tokens() -> None:
    # a self-hosted engine (1.80/hour, 1,000 tokens/s) beside a hosted API's priced tokens
    window = [
        Interval(0, 1.0, 1.8, replicas=1, requests=100, tokens=3_600_000, token_spend=0.0),
        Interval(1, 1.0, 0.0, replicas=0, requests=100, tokens=1_000_000, token_spend=2.0),
        Interval(2, 1.0, 1.8, replicas=1, requests=0, tokens=None),
    ]
    cost = summarize("chat", "USD", window, budget_per_1k_tokens=0.0005)
    assert cost.spend == pytest.approx(1.8 + 2.0 + 1.8) and cost.token_spend == 2.0
    assert cost.tokens == 4_600_000
    assert cost.cost_per_1k_tokens == pytest.approx(5.6 / 4600)
    assert cost.over_budget_per_1k_tokens == pytest.approx(5.6 / 4600 / 0.0005 - 1)
    report = build_report(
        [ServiceSeries("chat", "USD", window, budget_per_1k_tokens=0.0005)], start=0, end=3
    )
    assert report.warnings == [
        "chat: cost per 1,000 tokens 0.001217 USD is 143% over the budget of 0.0005 USD"
    ]
    assert report.to_dict()["services"][0]["cost_per_1k_tokens"] == pytest.approx(5.6 / 4600)
    untokened = summarize("m", "USD", [Interval(0, 1.0, 2.0, replicas=1, requests=5)])
    assert untokened.tokens is None and untokened.cost_per_1k_tokens is None


def test_ratios_over_nothing_are_none_not_zero_or_infinite() -> None:
    cost = summarize("idle", "USD", [Interval(0, 1.0, 2.0, replicas=1, requests=0, rows=0)])
    assert cost.spend == 2.0
    assert cost.cost_per_1k_requests is None and cost.cost_per_row is None
    assert per_thousand(5.0, 0) is None
    assert summarize("empty", "USD", []).cost_per_hour is None


def test_a_constant_spend_is_forecast_constant_and_warned_before_the_budget() -> None:
    hourly = [10.0] * 72
    forecast = forecast_spend(hourly, days=5)
    assert forecast.method.startswith("holt-winters")
    assert forecast.daily == pytest.approx((240.0,) * 5)
    assert budget_warning(forecast, 250.0) is None
    warning = budget_warning(forecast, 200.0)
    assert warning is not None and warning.day == 1 and warning.spend == pytest.approx(240)
    assert "exceeds the budget of 200 USD/day within 24 hours" in warning.describe("USD")


def test_a_rising_spend_warns_on_the_day_it_crosses_within_three_days() -> None:
    # +1 per hour for three days: 10 .. 81 per hour; the damped trend keeps rising
    hourly = [10.0 + h for h in range(72)]
    forecast = forecast_spend(hourly, days=6)
    assert list(forecast.daily) == sorted(forecast.daily), forecast.daily
    day_two = forecast.daily[1]
    warning = budget_warning(forecast, (forecast.daily[0] + day_two) / 2)
    assert warning is not None and warning.day == 2
    assert warning.describe("EUR").endswith("EUR/day in 2 days")
    # crossing only on day 5: beyond the guide's 3 days, no warning yet
    assert budget_warning(forecast, (forecast.daily[3] + forecast.daily[4]) / 2) is None


def test_a_daily_season_is_forecast_from_two_days_and_short_history_falls_back() -> None:
    day = [5.0] * 8 + [20.0] * 12 + [5.0] * 4  # busy office hours
    seasonal = forecast_spend(day * 3, days=1)
    assert seasonal.daily[0] == pytest.approx(sum(day), rel=0.02)
    short = forecast_spend(day[:10], days=1)
    assert short.method.startswith("holt, damped trend")
    assert forecast_spend([3.0], days=2) == SpendForecast((72.0, 72.0), short_method())
    assert forecast_spend([], days=1).daily == (0.0,)
    with pytest.raises(ValueError, match="days must be >= 1"):
        forecast_spend([1.0], days=0)


def short_method() -> str:
    return "mean: under 2 hours of history"


def test_the_report_sums_per_currency_and_lists_every_warning() -> None:
    def series(name: str, currency: str, price: float, budget_1k: float | None) -> ServiceSeries:
        intervals = [Interval(h * 3600.0, 1.0, price, 2, 100_000) for h in range(48)]
        return ServiceSeries(name, currency, intervals, budget_1k, budget_per_day=price * 40)

    report = build_report(
        [
            series("b", "USD", 1.0, 0.05),
            series("a", "USD", 2.0, None),
            series("c", "EUR", 3.0, 0.01),
        ],
        start=0,
        end=48 * 3600,
    )
    assert [s.cost.service for s in report.services] == ["a", "b", "c"]
    assert report.totals() == {"EUR": pytest.approx(288.0), "USD": pytest.approx(288.0)}
    # each spends 48x its price a day against a budget of 40x: every one warned, day 1
    assert sum("exceeds the budget" in w for w in report.warnings) == 3
    # c: 6/h over 100 thousand requests/h = 0.06 per 1,000, 500% over its 0.01
    assert any(w.startswith("c: cost per 1,000 requests 0.0600 EUR is 500% over") for w in
               report.warnings)  # fmt: skip
    document = report.to_dict()
    assert document["services"][2]["forecast"]["daily_spend"][0] == pytest.approx(144.0)
    assert len(document["services"][0]["forecast"]["daily_spend"]) == WARN_DAYS_AHEAD


# -- properties ---------------------------------------------------------------------------------

money = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)
intervals = st.lists(
    st.builds(
        Interval,
        end=st.floats(0, 1e9),
        hours=st.floats(min_value=0.01, max_value=24),
        per_replica_hour=money,
        replicas=st.floats(min_value=0, max_value=1000),
        requests=st.integers(0, 10**9).map(float),
        rows=st.none() | st.floats(min_value=0, max_value=1e10),
        busy_s=st.none() | st.floats(min_value=0, max_value=1e7),
    ),
    max_size=30,
)
# pure arithmetic: no wall-clock deadline (a loaded CI host makes one example slow, not wrong)
unhurried = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@unhurried
@given(money, st.floats(0, 1e3), st.floats(0, 1e3), st.floats(min_value=0.5, max_value=10))
def test_spend_is_linear_in_replicas_and_hours(
    price: float, replicas: float, hours: float, k: float
) -> None:
    assert spend(price, replicas, hours) >= 0
    assert math.isclose(spend(price, k * replicas, hours), k * spend(price, replicas, hours),
                        rel_tol=1e-9, abs_tol=1e-9)  # fmt: skip
    assert math.isclose(spend(price, replicas, k * hours), k * spend(price, replicas, hours),
                        rel_tol=1e-9, abs_tol=1e-9)  # fmt: skip


@unhurried
@given(intervals, intervals)
def test_two_halves_of_a_window_add_up_to_the_whole(a: list[Interval], b: list[Interval]) -> None:
    whole, first, second = (summarize("s", "USD", x) for x in (a + b, a, b))
    assert math.isclose(whole.spend, first.spend + second.spend, rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(whole.requests, first.requests + second.requests, rel_tol=1e-9)
    assert math.isclose(whole.hours, first.hours + second.hours, rel_tol=1e-9)
    per_1k = whole.cost_per_1k_requests
    if per_1k is not None:  # the ratio of the sums: per_1k * thousands == spend
        assert math.isclose(per_1k * whole.requests / 1000, whole.spend, rel_tol=1e-9,
                            abs_tol=1e-9)  # fmt: skip
    else:
        assert whole.requests == 0


@unhurried
@given(st.lists(st.floats(min_value=0, max_value=1e5), max_size=100), st.integers(1, 10))
def test_a_forecast_is_never_negative_and_has_the_days_asked(
    hourly: list[float], days: int
) -> None:
    forecast = forecast_spend(hourly, days=days)
    assert len(forecast.daily) == days
    assert all(d >= 0 and math.isfinite(d) for d in forecast.daily)


@unhurried
@given(st.floats(min_value=0.01, max_value=1e4), st.integers(2, 120))
def test_a_flat_history_forecasts_its_own_level(level: float, hours: int) -> None:
    forecast = forecast_spend([level] * hours, days=3)
    assert forecast.daily == pytest.approx((level * 24,) * 3, rel=1e-6)


# -- the policy ---------------------------------------------------------------------------------

POLICY = """\
listeners: [{name: public, port: 10000}]
services:
  - name: model
    replicas: {command: "serve --port {port}", min: 2, max: 4}
    cost: COST
routes: [{name: all, backends: [{service: model}]}]
"""


def load(cost: str) -> object:
    return load_policy_text(POLICY.replace("COST", cost), "policy.yaml")


def test_a_cost_section_loads_with_its_defaults() -> None:
    policy = load("{per_replica_hour: 2.40, budget_per_1k_requests: 0.05, model: resnet}")
    cost = policy.services[0].cost  # type: ignore[attr-defined]
    assert (cost.per_replica_hour, cost.currency, cost.budget_per_1k_requests) == (2.4, "USD", 0.05)
    assert cost.budget_per_day is None and cost.model == "resnet"


@pytest.mark.parametrize(
    ("cost", "expected"),
    [
        ("{currency: USD}", "policy.yaml:5:5: services[0].cost.per_replica_hour: missing "
         "required field 'per_replica_hour'"),
        ("{per_replica_hour: -1}", "policy.yaml:5:30: services[0].cost.per_replica_hour: must be "
         "at least 0.0, got -1"),
        ("{per_replica_hour: 1, currency: dollars}", "services[0].cost.currency: currency "
         "'dollars' is not an ISO 4217 code such as USD or EUR"),
        ("{per_replica_hours: 1}", "policy.yaml:5:12: services[0].cost.per_replica_hours: "
         "unknown key 'per_replica_hours' (did you mean 'per_replica_hour'?)"),
        ("{per_replica_hour: 0, budget_per_1k_requests: 0.1}", "policy.yaml:5:57: "
         "services[0].cost.budget_per_1k_requests: a budget per 1,000 requests on replicas that "
         "cost 0 can never be exceeded"),
        ("{per_replica_hour: 2.4, budget_per_day: 100}", "policy.yaml:5:51: "
         "services[0].cost.budget_per_day: the budget of 100 USD/day is less than the 2 "
         "replicas of replicas.min cost (115.2 USD/day at 2.4/hour)"),
    ],
)  # fmt: skip
def test_a_bad_cost_section_is_a_located_error(cost: str, expected: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load(cost)
    assert expected in str(caught.value), str(caught.value)


def test_token_prices_load_and_a_model_of_cost_models_has_its_own() -> None:
    policy = load(
        "{per_replica_hour: 0, per_1m_input_tokens: 0.5, per_1m_output_tokens: 1.5, "
        "models: {big: {per_1m_output_tokens: 3}}, budget_per_1k_tokens: 0.002}"
    )
    cost = policy.services[0].cost  # type: ignore[attr-defined]
    assert cost.budget_per_1k_tokens == 0.002 and cost.prices_tokens
    small = cost.token_prices("small")
    assert (small.per_1m_input_tokens, small.per_1m_output_tokens) == (0.5, 1.5)
    big = cost.token_prices("big")
    assert (big.per_1m_input_tokens, big.per_1m_output_tokens) == (0.0, 3.0)
    assert cost.token_prices(None) == small


def test_a_replica_price_alone_prices_no_token() -> None:
    cost = load("{per_replica_hour: 2.4, budget_per_1k_tokens: 0.01}").services[0].cost  # type: ignore[attr-defined]
    assert not cost.prices_tokens
    assert cost.token_prices("any").per_1m_output_tokens == 0.0


@pytest.mark.parametrize(
    ("cost", "expected"),
    [
        ("{per_replica_hour: 0, budget_per_1k_tokens: 0.1}",
         "services[0].cost.budget_per_1k_tokens: a budget per 1,000 tokens on a service whose "
         "replicas and tokens cost 0 can never be exceeded"),
        ("{per_replica_hour: 1, per_1m_output_tokens: -2}",
         "services[0].cost.per_1m_output_tokens: must be at least 0.0, got -2"),
        ("{per_replica_hour: 1, models: {big: {}}}", "services[0].cost.models.big: give "
         "per_1m_input_tokens, per_1m_output_tokens or both"),
        ("{per_replica_hour: 1, models: {big: {per_1m_output: 1}}}", "policy.yaml:5:48: "
         "services[0].cost.models.big.per_1m_output: unknown key 'per_1m_output'"),
        ("{per_replica_hour: 1, budget_per_1k_tokens: 0}", "policy.yaml:5:55: "
         "services[0].cost.budget_per_1k_tokens: must be more than 0.0, got 0"),
    ],
)  # fmt: skip
def test_a_bad_token_price_is_a_located_error(cost: str, expected: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load(cost)
    assert expected in str(caught.value), str(caught.value)
