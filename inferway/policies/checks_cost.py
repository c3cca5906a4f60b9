"""Semantic checks of ``services[].cost``: budgets that cannot be met or never alert."""

from __future__ import annotations

from collections.abc import Iterator

from inferway.policies.model import Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["check_cost"]


def check_cost(policy: Policy) -> Iterator[tuple[Loc, str]]:
    for s, service in enumerate(policy.services):
        cost = service.cost
        if cost is None:
            continue
        loc: Loc = ("services", s, "cost")
        if cost.per_replica_hour == 0 and cost.budget_per_1k_requests is not None:
            yield (
                (*loc, "budget_per_1k_requests"),
                "a budget per 1,000 requests on replicas that cost 0 can never be exceeded; "
                "set per_replica_hour or remove the budget",
            )
        if (
            cost.budget_per_1k_tokens is not None
            and cost.per_replica_hour == 0
            and not cost.prices_tokens
        ):
            yield (
                (*loc, "budget_per_1k_tokens"),
                "a budget per 1,000 tokens on a service whose replicas and tokens cost 0 can "
                "never be exceeded; set per_replica_hour or a token price, or remove the budget",
            )
        floor = service.replicas.min if service.replicas is not None else None
        if cost.budget_per_day is not None and floor:
            least = floor * cost.per_replica_hour * 24
            if least > cost.budget_per_day:
                yield (
                    (*loc, "budget_per_day"),
                    f"the budget of {cost.budget_per_day:g} {cost.currency}/day is less than "
                    f"the {floor} replicas of replicas.min cost ({least:g} {cost.currency}/day "
                    f"at {cost.per_replica_hour:g}/hour); raise the budget or lower min",
                )
