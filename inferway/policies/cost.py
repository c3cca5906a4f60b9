"""What a service's replicas cost: a service's ``cost:`` section.

    cost:
      per_replica_hour: 2.40          # what one replica costs per hour (a GPU node's share)
      currency: USD                   # ISO 4217 code; totals are never summed across codes
      budget_per_1k_requests: 0.05    # alert InferwayCostPer1kRequestsOverBudget at +15%
      budget_per_day: 120             # `inferway report cost` warns 3 days before the forecast
      model: resnet50                 # the backend model whose rows this cost is spread over

The gateway exports the section as gauges (``inferway_cost_*``), so Prometheus, the
dashboard, the alerts and ``inferway report cost`` all read the same prices; nothing of it
reaches Envoy, so it is not part of the IR.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Cost"]


class Cost(BaseModel):
    """The price of one replica-hour of a service, and the budgets it is held to."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )

    per_replica_hour: float = Field(ge=0, allow_inf_nan=False)
    currency: str = "USD"
    budget_per_1k_requests: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    budget_per_day: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    model: str | None = Field(default=None, min_length=1)

    @field_validator("currency")
    @classmethod
    def _iso_code(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Z]{3}", value):
            raise ValueError(f"currency {value!r} is not an ISO 4217 code such as USD or EUR")
        return value
