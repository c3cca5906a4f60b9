"""The control loops' configs of one policy, compiled once from its validated sections.

The policy loader validates ``rollouts:`` and every ``autoscale:`` block (located errors, a
bad edit refused before it is applied); compiling them into the pure controllers' own types
cannot fail. ``plan_gateway`` compiles the policy it plans, and the drivers (the rollout
driver, the autoscaling loop) take the compiled configs of each policy they are handed, so
one policy is compiled once however many drivers and state sources read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferway.controllers.autoscale.params import AutoscaleConfig
from inferway.controllers.rollout.config import RolloutConfig
from inferway.gateway.autoscale_policy import build_autoscale_config
from inferway.gateway.rollouts.config import build_rollout_config
from inferway.policies.model import Policy
from inferway.policies.scale_target import ScaleTargetSpec, read_scale_target

__all__ = ["LoopConfigs", "ScaledService", "compile_loops"]


@dataclass(frozen=True)
class ScaledService:
    """One autoscaled service: how it is sized and what the decision acts on."""

    config: AutoscaleConfig
    target: ScaleTargetSpec


@dataclass(frozen=True)
class LoopConfigs:
    """Every loop's config of ``policy``, by service (autoscale) and rollout name."""

    policy: Policy
    autoscale: dict[str, ScaledService] = field(default_factory=dict)
    rollouts: dict[str, RolloutConfig] = field(default_factory=dict)


_last: list[LoopConfigs] = []
"""The last policy compiled: its drivers and state sources all ask for the same one."""


def compile_loops(policy: Policy) -> LoopConfigs:
    """The configs of ``policy`` (a loaded, hence validated, policy), compiled on the first
    call for this policy object and reused after."""
    if _last and _last[0].policy is policy:
        return _last[0]
    loops = LoopConfigs(
        policy,
        autoscale={
            service.name: ScaledService(
                build_autoscale_config(service.name, service.autoscale),
                read_scale_target(service.autoscale, has_replicas=service.replicas is not None),
            )
            for service in policy.services
            if service.autoscale is not None
        },
        rollouts={spec.name: build_rollout_config(spec) for spec in policy.rollouts},
    )
    _last[:] = [loops]
    return loops
