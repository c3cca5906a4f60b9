"""The smallest canary policy, as a ``Policy``: one listener, services v1 and v2, one route
``model`` splitting between them, for control-plane unit tests that change only the split."""

from __future__ import annotations

from inferway.policies.model import Policy

__all__ = ["make_policy"]


def make_policy(canary_weight: float) -> Policy:
    """v2 gets ``canary_weight`` percent of route ``model``, v1 the rest."""
    return Policy.model_validate(
        {
            "listeners": [{"name": "public", "port": 10000}],
            "services": [
                {"name": "v1", "endpoints": ["127.0.0.1:8001"]},
                {"name": "v2", "endpoints": ["127.0.0.1:8002"]},
            ],
            "routes": [
                {
                    "name": "model",
                    "backends": [
                        {"service": "v1", "weight": 100 - canary_weight},
                        {"service": "v2", "weight": canary_weight},
                    ],
                }
            ],
        }
    )
