"""Each service's ``autoscale:`` block, read into an AutoscaleConfig with located errors.

The policy layer only knows ``autoscale:`` is a mapping on a service with ``replicas:``; the
autoscaler's own reader (controllers/autoscale) lives above it, so the gateway reads the block
here, after the policy loaded, and places each problem on its line of the policy file. Both
forms are accepted: the native one (``build_autoscale_config``) and the issue's
``scaling_policy`` rule (``build_from_scaling_policy``). The block's ``scale_target`` (what
the decision acts on) is the policy layer's (policies/scale_target.py) and is left out here;
a target other than the gateway's own replicas cannot use ``queue_length`` or ``utilization``,
which are read from each replica's /metrics and only the gateway's replicas are known one by
one (behind a headless Service's name, a scrape reaches one pod of many).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferway.controllers.autoscale.config import build_autoscale_config
from inferway.controllers.autoscale.config_reader import AutoscaleConfigError
from inferway.controllers.autoscale.params import AutoscaleConfig
from inferway.controllers.autoscale.rule import (
    build_from_scaling_policy,
    is_scaling_policy,
)
from inferway.gateway.autoscale_inputs import BACKEND_METRICS
from inferway.policies import PolicyError
from inferway.policies.errors import PolicyIssue
from inferway.policies.located import place_issues
from inferway.policies.model import Policy
from inferway.policies.scale_target import SCALE_TARGET_KEY

__all__ = ["autoscale_configs", "build_config"]


def autoscale_configs(policy: Policy, text: str, source: str) -> dict[str, AutoscaleConfig]:
    """Service name -> its autoscale config. Raises PolicyError with every problem of every
    block, each on its field in ``source`` (whose content is ``text``)."""
    configs: dict[str, AutoscaleConfig] = {}
    issues: list[PolicyIssue] = []
    for index, service in enumerate(policy.services):
        if service.autoscale is None:
            continue
        try:
            config = build_config(service.name, service.autoscale)
        except AutoscaleConfigError as error:
            issues.extend(
                PolicyIssue(source, None, None, _path(field, service.name, index), message)
                for field, message in error.problems
            )
            continue
        if service.replicas is None and config.metric in BACKEND_METRICS:
            field = (
                "scaling_policy.metric_type" if is_scaling_policy(service.autoscale) else "metric"
            )
            issues.append(
                PolicyIssue(
                    source,
                    None,
                    None,
                    f"services[{index}].autoscale.{field}",
                    f"{config.metric} is read from each replica's /metrics, which only the "
                    "gateway's own replicas (replicas:) give it; with this scale_target use "
                    "in_flight, request_rate or p99_latency (Envoy's view of the cluster)",
                )
            )
            continue
        configs[service.name] = config
    if issues:
        raise PolicyError(place_issues(text, source, issues))
    return configs


def build_config(service: str, block: Mapping[str, Any]) -> AutoscaleConfig:
    """One block in either form; raises AutoscaleConfigError (fields named by service)."""
    block = {k: v for k, v in block.items() if k != SCALE_TARGET_KEY}
    if is_scaling_policy(block):
        return build_from_scaling_policy(service, block)
    return build_autoscale_config(service, block)


def _path(field: str, service: str, index: int) -> str:
    """``services.NAME.autoscale.cooldown.up`` -> ``services[3].autoscale.cooldown.up``."""
    prefix = f"services.{service}."
    rest = field[len(prefix) :] if field.startswith(prefix) else field
    return f"services[{index}].{rest.rstrip('.')}"
