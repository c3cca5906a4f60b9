"""The weights a gateway runs now, where they differ from the policy's: a rollout moves its
route's stable/canary weights step by step (an override in State, never in the file), so
with ``--admin`` verify asks ``GET /rollouts`` (the CLI's ``AdminClient``) and expects the
live split, not the start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["rollout_weights"]


def rollout_weights(document: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``GET /rollouts``'s document -> route -> {stable: 100 - w, canary: w}, as the
    rollout's override sets them."""
    out: dict[str, dict[str, float]] = {}
    for rollout in document.get("rollouts", []):
        canary = round(float(rollout["weight_percent"]), 1)
        out[rollout["route"]] = {
            rollout["stable"]: round(100.0 - canary, 1),
            rollout["canary"]: canary,
        }
    return out
