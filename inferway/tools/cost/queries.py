"""The PromQL behind ``inferway report cost``, per service and per query step, from the raw
series only (Envoy's cluster stats, the backends' batch histograms, the gateway's
``inferway_cost_*`` gauges), so the report needs no recording rule loaded in Prometheus.

Envoy names a service's cluster ``envoy_cluster_name``; it becomes ``service`` here. Replicas
are the endpoints Envoy holds for the cluster (local replicas in EDS, or every address of a
Kubernetes headless Service), the maximum over the gateways; requests are summed over the
gateways (each sees its own share). Rows and busy time come from the backend's model named
by ``cost.model`` (``inferway_cost_model_info``). Tokens are the gateway's LLM token counts
(``inferway_llm_tokens_total``, whose ``backend`` is the service), priced per request model
by ``inferway_cost_per_1m_tokens`` (a model's own price, else the service's ``model=""``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BUDGET_PER_1K_REQUESTS",
    "BUDGET_PER_1K_TOKENS",
    "BUDGET_PER_DAY",
    "PRICE",
    "SERVICE_FROM_CLUSTER",
    "CostQueries",
]

SERVICE_FROM_CLUSTER = '"service", "$1", "envoy_cluster_name", "(.+)"'

PRICE = "max by (service, currency) (inferway_cost_per_replica_hour)"
BUDGET_PER_1K_REQUESTS = "max by (service, currency) (inferway_cost_budget_per_1k_requests)"
BUDGET_PER_DAY = "max by (service, currency) (inferway_cost_budget_per_day)"
BUDGET_PER_1K_TOKENS = "max by (service, currency) (inferway_cost_budget_per_1k_tokens)"
SERVICE_FROM_BACKEND = '"service", "$1", "backend", "(.+)"'
_OWN_PRICE = 'max by (service, model, type, currency) (inferway_cost_per_1m_tokens{model!=""})'
_SERVICE_PRICE = 'max by (service, type, currency) (inferway_cost_per_1m_tokens{model=""})'


def _per_model(series: str, step: str) -> str:
    return (
        f"sum by (service) (sum by (model) (increase({series}[{step}])) "
        f"* on (model) group_right max by (service, model) (inferway_cost_model_info))"
    )


@dataclass(frozen=True)
class CostQueries:
    """Each value at time t covers the step that ends at t."""

    step: str

    @property
    def replicas(self) -> str:
        return (
            "max by (service) (label_replace(avg_over_time("
            f"envoy_cluster_membership_total[{self.step}]), {SERVICE_FROM_CLUSTER}))"
        )

    @property
    def requests(self) -> str:
        return (
            "sum by (service) (label_replace(increase("
            f"envoy_cluster_upstream_rq_total[{self.step}]), {SERVICE_FROM_CLUSTER}))"
        )

    @property
    def _tokens_by_model(self) -> str:
        return (
            "sum by (service, model, type) (label_replace(increase("
            f"inferway_llm_tokens_total[{self.step}]), {SERVICE_FROM_BACKEND}))"
        )

    @property
    def tokens(self) -> str:
        return f"sum by (service) ({self._tokens_by_model})"

    @property
    def token_spend(self) -> str:
        """What the step's tokens cost, by (service, currency): each model's own price where
        ``cost.models`` names it, the service's for every other model."""
        tokens = self._tokens_by_model
        own = f"{tokens} * on (service, model, type) group_left (currency) {_OWN_PRICE}"
        rest = (
            f"({tokens} unless on (service, model, type) "
            f'max by (service, model, type) (inferway_cost_per_1m_tokens{{model!=""}})) '
            f"* on (service, type) group_left (currency) {_SERVICE_PRICE}"
        )
        return f"sum by (service, currency) (({own}) or ({rest})) / 1e6"

    @property
    def rows(self) -> str:
        return _per_model("inferway_backend_batch_size_sum", self.step)

    @property
    def busy_seconds(self) -> str:
        return _per_model("inferway_backend_compute_seconds_sum", self.step)
