"""The weights a gateway runs now, where they differ from the policy's: a rollout moves its
route's stable/canary weights step by step (an override in State, never in the file), so
with ``--admin`` verify asks ``GET /rollouts`` and expects the live split, not the start."""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["LiveWeightsError", "fetch_live_weights", "rollout_weights"]


class LiveWeightsError(RuntimeError):
    """The admin API could not be asked (the message says why)."""


def rollout_weights(document: dict[str, Any]) -> dict[str, dict[str, float]]:
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


def fetch_live_weights(admin: str) -> dict[str, dict[str, float]]:
    """The live rollout weights of the gateway whose admin API is at ``admin`` (none when it
    has no rollouts)."""
    url = admin.rstrip("/") + "/rollouts"
    try:
        response = httpx.get(url, timeout=5.0)
    except httpx.HTTPError as error:
        raise LiveWeightsError(f"cannot reach the admin API at {url}: {error}") from None
    if response.status_code == 404:
        return {}
    if response.status_code != 200:
        raise LiveWeightsError(f"{url}: HTTP {response.status_code}: {response.text.strip()}")
    try:
        return rollout_weights(response.json())
    except (ValueError, KeyError, TypeError) as error:
        raise LiveWeightsError(f"{url} did not answer the rollouts document: {error}") from None
