"""Pure helpers of the rollout driver: a rollout's target (route, stable, canary), the route
weights its state means, and the backends' own evidence as ``rollout status`` shows it."""

from __future__ import annotations

from typing import Any

from inferway.controllers.rollout.config import TOTAL_WEIGHT
from inferway.controllers.rollout.state import Phase, RolloutState
from inferway.gateway.rollouts.store import RolloutTarget
from inferway.policies.rollouts import Rollout

__all__ = ["backend_evidence", "build_weights", "rollout_target", "same_target"]


def build_weights(rollout: Rollout, state: RolloutState) -> dict[str, float] | None:
    """The route override for ``state`` (None while it has not started: the policy's own
    weights apply)."""
    if state.phase == Phase.WAITING:
        return None
    canary = state.weight / (TOTAL_WEIGHT / 100)
    return {rollout.stable: round(100 - canary, 1), rollout.canary: round(canary, 1)}


def rollout_target(spec: Rollout) -> RolloutTarget:
    return RolloutTarget(spec.route, spec.stable, spec.canary)


def backend_evidence(s: RolloutState) -> dict[str, Any]:
    """What the backends themselves reported, as ``rollout status`` shows it."""
    return {
        "backend": {
            role: {"requests": counts.requests, "errors": counts.errors}
            for role, counts in (
                ("canary", s.evidence.backend_canary),
                ("stable", s.evidence.backend_stable),
            )
        }
    }


def same_target(a: Rollout, b: Rollout) -> bool:
    return rollout_target(a) == rollout_target(b)
