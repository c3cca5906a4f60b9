"""A rollout's ``GET /rollouts/{name}`` document (``admin_documents.RolloutStatus``): where it
stands, the evidence it has counted, its last analysis and its recent decisions."""

from __future__ import annotations

from typing import Any

from inferway.controllers.rollout.config import TOTAL_WEIGHT
from inferway.controllers.rollout.controller import RolloutController
from inferway.gateway.admin_documents import RolloutStatus
from inferway.gateway.rollouts.targets import backend_evidence

__all__ = ["rollout_status"]


def rollout_status(
    name: str,
    route: str,
    controller: RolloutController,
    gate: dict[str, Any] | None,
    history: int = 20,
) -> RolloutStatus:
    """``history``: how many of the latest decisions to list (0: none)."""
    s, config = controller.state, controller.config
    last = next((d for d in reversed(s.history) if d.verdicts), None)
    return {
        "name": name,
        "route": route,
        "stable": config.stable,
        "canary": config.canary,
        "phase": s.phase.value,
        "paused_by": s.paused_by,
        "step": s.step,
        "steps": [step.percent for step in config.steps],
        "weight_percent": s.weight * 100 / TOTAL_WEIGHT,
        "reason": s.reason,
        "run": s.run,
        "interval_s": config.analysis.interval_s,
        "evidence": {
            "canary": {
                "requests": s.evidence.canary.requests,
                "errors": s.evidence.canary.errors,
            },
            "stable": {
                "requests": s.evidence.stable.requests,
                "errors": s.evidence.stable.errors,
            },
            "step_canary_requests": s.evidence.step_canary_requests,
            **(backend_evidence(s) if config.needs_backend_metrics else {}),
        },
        "last_analysis": None if last is None else last.to_json(),
        "gate": gate,
        "history": [d.to_json() for d in s.history[-history:]] if history else [],
    }
