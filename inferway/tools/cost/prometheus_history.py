"""Services' cost history from Prometheus' HTTP API (``/api/v1/query_range``), one hourly
step at a time: the edge that turns the queries of queries.py into report.py's Intervals.
A Prometheus that cannot be reached or refuses a query is a HistoryError with its answer."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import httpx

from inferway.tools.cost.queries import (
    BUDGET_PER_1K_REQUESTS,
    BUDGET_PER_1K_TOKENS,
    BUDGET_PER_DAY,
    PRICE,
    CostQueries,
)
from inferway.tools.cost.report import ServiceSeries
from inferway.tools.cost.spend import Interval

__all__ = ["STEP_S", "HistoryError", "load_history"]

STEP_S = 3600
"""One Interval per hour: the forecaster's daily season is 24 of them."""

_Values = dict[tuple[str, str], dict[float, float]]
"""(service, currency or "") -> time -> value."""


class HistoryError(Exception):
    """Prometheus could not answer; the message says which URL and why."""


class _Client:
    def __init__(self, url: str, timeout: float) -> None:
        self._base = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout, trust_env=False)

    def close(self) -> None:
        self._http.close()

    def _get(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        url = f"{self._base}{path}"
        try:
            response = self._http.get(url, params=params)
        except httpx.HTTPError as exc:
            raise HistoryError(f"cannot reach Prometheus at {url}: {exc}") from None
        try:
            body = response.json()
        except ValueError:
            raise HistoryError(
                f"{url}: HTTP {response.status_code}, not Prometheus' JSON API"
            ) from None
        if body.get("status") != "success":
            raise HistoryError(f"{url}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def series(self, query: str, start: float, end: float) -> _Values:
        result = self._get(
            "/api/v1/query_range", {"query": query, "start": start, "end": end, "step": STEP_S}
        )
        out: _Values = defaultdict(dict)
        for item in result:
            labels = item["metric"]
            key = (labels.get("service", ""), labels.get("currency", ""))
            for t, value in item["values"]:
                out[key][float(t)] = float(value)
        return out

    def instant(self, query: str, at: float) -> dict[str, float]:
        result = self._get("/api/v1/query", {"query": query, "time": at})
        return {r["metric"].get("service", ""): float(r["value"][1]) for r in result}


def _by_service(values: _Values) -> dict[str, dict[float, float]]:
    return {service: points for (service, _), points in values.items()}


def load_history(url: str, *, end: float, hours: int, timeout: float = 30.0) -> list[ServiceSeries]:
    """Every service with a price in the window ``[end - hours h, end]``, hour by hour."""
    start = end - hours * STEP_S
    queries = CostQueries(step="1h")
    first = start + STEP_S  # each point covers the hour before it
    client = _Client(url, timeout)
    try:
        price = client.series(PRICE, first, end)
        replicas = _by_service(client.series(queries.replicas, first, end))
        requests = _by_service(client.series(queries.requests, first, end))
        rows = _by_service(client.series(queries.rows, first, end))
        busy = _by_service(client.series(queries.busy_seconds, first, end))
        tokens = _by_service(client.series(queries.tokens, first, end))
        token_spend = _by_service(client.series(queries.token_spend, first, end))
        per_1k = client.instant(BUDGET_PER_1K_REQUESTS, end)
        per_1k_tokens = client.instant(BUDGET_PER_1K_TOKENS, end)
        per_day = client.instant(BUDGET_PER_DAY, end)
    finally:
        client.close()
    out = []
    currencies: dict[str, str] = {}
    prices: dict[str, dict[float, float]] = defaultdict(dict)
    for (service, currency), points in sorted(price.items(), key=lambda kv: min(kv[1])):
        prices[service].update(points)
        currencies[service] = currency  # the latest-starting series wins: the current code
    for service, points in sorted(prices.items()):
        intervals = [
            Interval(
                end=t,
                hours=1.0,
                per_replica_hour=p,
                replicas=replicas.get(service, {}).get(t, 0.0),
                requests=requests.get(service, {}).get(t, 0.0),
                rows=rows[service].get(t, 0.0) if service in rows else None,
                busy_s=busy[service].get(t, 0.0) if service in busy else None,
                tokens=tokens[service].get(t, 0.0) if service in tokens else None,
                token_spend=token_spend.get(service, {}).get(t, 0.0),
            )
            for t, p in sorted(points.items())
        ]
        out.append(
            ServiceSeries(
                service,
                currencies[service],
                intervals,
                budget_per_1k_requests=per_1k.get(service),
                budget_per_day=per_day.get(service),
                budget_per_1k_tokens=per_1k_tokens.get(service),
            )
        )
    return out
