"""What a policy may not ask of a fleet: local ``replicas:`` (processes a gateway starts on its
own host). On a fleet every control-plane replica would start its own set, so the count would
be multiplied by the replicas and die with each pod; a fleet scales its backends through the
leader's one published count instead (the autoscaler's ``kubernetes`` target, or the KEDA/HPA
components reading ``inferway_autoscale_desired_replicas``)."""

from __future__ import annotations

from inferway.policies.errors import PolicyIssue
from inferway.policies.model import Policy

__all__ = ["fleet_policy_issues"]


def fleet_policy_issues(policy: Policy, source: str) -> list[PolicyIssue]:
    """One issue per service with local ``replicas:``, named by its field path."""
    return [
        PolicyIssue(
            source,
            None,
            None,
            f"services[{index}].replicas",
            f"service {service.name!r} runs local replicas, which a fleet (--store) cannot "
            "share: each control-plane replica would start its own. Scale it with the "
            "autoscaler's kubernetes target or the KEDA/HPA components (docs/fleet.md), or "
            "run this policy on one node without --store",
        )
        for index, service in enumerate(policy.services)
        if service.replicas is not None
    ]
