"""What a service costs: a service's ``cost:`` section.

    cost:
      per_replica_hour: 2.40          # what one replica costs per hour (a GPU node's share)
      currency: USD                   # ISO 4217 code; totals are never summed across codes
      budget_per_1k_requests: 0.05    # alert InferwayCostPer1kRequestsOverBudget at +15%
      budget_per_day: 120             # `inferway report cost` warns 3 days before the forecast
      model: resnet50                 # the backend model whose rows this cost is spread over
      # LLM services (OpenAI-compatible routes; the gateway counts their tokens):
      per_1m_input_tokens: 0.15       # a price per token on top of the replicas (a hosted API,
      per_1m_output_tokens: 0.60      #   a chargeback rate); 0 where only replicas are paid for
      models:                         # per request model, in place of the two prices above
        llama-3-70b: {per_1m_input_tokens: 0.60, per_1m_output_tokens: 0.80}
      budget_per_1k_tokens: 0.002     # alert InferwayCostPer1kTokensOverBudget at +15%

Cost per 1,000 tokens is everything the service costs (its replicas' hours and its priced
tokens) over the tokens the gateway counted for it: a self-hosted engine's cost per token comes
from its replica price alone, a hosted API's from its token prices.

The gateway exports the section as gauges (``inferway_cost_*``), so Prometheus, the
dashboard, the alerts and ``inferway report cost`` all read the same prices; nothing of it
reaches Envoy, so it is not part of the IR.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["Cost", "TokenPrices"]

_CONFIG = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False)


class TokenPrices(BaseModel):
    """Prices per 1,000,000 tokens of one request model (``cost.models``)."""

    model_config = _CONFIG

    per_1m_input_tokens: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    per_1m_output_tokens: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _some_price(self) -> TokenPrices:
        if not self.model_fields_set:
            raise ValueError("give per_1m_input_tokens, per_1m_output_tokens or both")
        return self


class Cost(BaseModel):
    """The price of one replica-hour of a service and of its tokens, and the budgets it is
    held to."""

    model_config = _CONFIG

    per_replica_hour: float = Field(ge=0, allow_inf_nan=False)
    currency: str = "USD"
    budget_per_1k_requests: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    budget_per_day: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    model: str | None = Field(default=None, min_length=1)
    per_1m_input_tokens: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    per_1m_output_tokens: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    models: dict[str, TokenPrices] = Field(default_factory=dict)
    budget_per_1k_tokens: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("currency")
    @classmethod
    def _iso_code(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Z]{3}", value):
            raise ValueError(f"currency {value!r} is not an ISO 4217 code such as USD or EUR")
        return value

    @field_validator("models")
    @classmethod
    def _model_names(cls, value: dict[str, TokenPrices]) -> dict[str, TokenPrices]:
        for name in value:
            if not name.strip():
                raise ValueError("a model name in cost.models is empty")
        return value

    def token_prices(self, model: str | None) -> TokenPrices:
        """The prices of ``model``'s tokens: its own entry in ``models``, else the service's."""
        own = self.models.get(model) if model is not None else None
        if own is not None:
            return own
        return TokenPrices(
            per_1m_input_tokens=self.per_1m_input_tokens,
            per_1m_output_tokens=self.per_1m_output_tokens,
        )

    @property
    def prices_tokens(self) -> bool:
        """Some token of the service has a price."""
        return bool(self.per_1m_input_tokens or self.per_1m_output_tokens) or any(
            p.per_1m_input_tokens or p.per_1m_output_tokens for p in self.models.values()
        )
