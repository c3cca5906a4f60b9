"""The live policy's ``cost:`` sections as gauges on the gateway's ``/metrics``, read at scrape
time so an edit shows on the next scrape. Prometheus joins them with Envoy's and the
backends' series (deploy/prometheus/alerts.yaml, the dashboard, ``inferway report cost``):
the price lives in one place, the policy. Token prices are per 1,000,000 tokens, one series per
service, type (``input``/``output``) and model, where ``model=""`` is the service's price for
every request model ``cost.models`` does not name (the recording rules fall back to it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferway.policies.model import Policy

__all__ = ["CostCollector"]


class CostCollector(Collector):
    def __init__(self, policy: Callable[[], Policy | None]) -> None:
        self._policy = policy

    def collect(self) -> Iterator[Metric]:
        labels = ["service", "currency"]
        price = GaugeMetricFamily(
            "inferway_cost_per_replica_hour",
            "What one replica of the service costs per hour (policy services[].cost).",
            labels=labels,
        )
        per_1k = GaugeMetricFamily(
            "inferway_cost_budget_per_1k_requests",
            "The service's budget per 1,000 requests (cost.budget_per_1k_requests).",
            labels=labels,
        )
        per_day = GaugeMetricFamily(
            "inferway_cost_budget_per_day",
            "The service's daily budget (cost.budget_per_day).",
            labels=labels,
        )
        model = GaugeMetricFamily(
            "inferway_cost_model_info",
            "1 for the backend model whose rows and compute time the service's cost covers.",
            labels=["service", "model"],
        )
        tokens = GaugeMetricFamily(
            "inferway_cost_per_1m_tokens",
            "Price of 1,000,000 tokens of the service (policy services[].cost.per_1m_*_tokens; "
            'model="" for models cost.models does not name).',
            labels=["service", "currency", "model", "type"],
        )
        per_1k_tokens = GaugeMetricFamily(
            "inferway_cost_budget_per_1k_tokens",
            "The service's budget per 1,000 tokens (cost.budget_per_1k_tokens).",
            labels=labels,
        )
        policy = self._policy()
        for service in policy.services if policy is not None else ():
            cost = service.cost
            if cost is None:
                continue
            key = [service.name, cost.currency]
            price.add_metric(key, cost.per_replica_hour)
            if cost.budget_per_1k_requests is not None:
                per_1k.add_metric(key, cost.budget_per_1k_requests)
            if cost.budget_per_day is not None:
                per_day.add_metric(key, cost.budget_per_day)
            if cost.model is not None:
                model.add_metric([service.name, cost.model], 1.0)
            if cost.budget_per_1k_tokens is not None:
                per_1k_tokens.add_metric(key, cost.budget_per_1k_tokens)
            for name in ("", *sorted(cost.models)):
                prices = cost.token_prices(name or None)
                tokens.add_metric([*key, name, "input"], prices.per_1m_input_tokens)
                tokens.add_metric([*key, name, "output"], prices.per_1m_output_tokens)
        yield from (price, per_1k, per_day, model, tokens, per_1k_tokens)

    def describe(self) -> Iterator[Metric]:
        return iter(())
