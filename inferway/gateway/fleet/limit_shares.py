"""How a fleet-wide rate limit is split between Envoys: max-min fair on each Envoy's offered
load, in whole tokens that add up to the limit. Pure.

An Envoy's demand is its offered rate (every request its limiter saw, admitted or not) plus
``headroom`` (room to grow until the next split), and at least ``floor``. When the demands fit
in the limit, each Envoy gets its demand and the rest is shared in proportion to them (nothing
of the limit is left unused); when they do not, water-filling: an Envoy asking less than an
equal part of what is left gets what it asks, the rest is split equally between the others.
The fleet then admits ``min(limit, offered)`` but for the headroom of the lighter Envoys that
they do not use (at most ``headroom`` of their load) and the rounding to whole tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["HEADROOM", "split_limit"]

HEADROOM = 0.25
"""Each Envoy's demand is its offered rate and a quarter more."""


def split_limit(
    limit: int, offered: Mapping[str, float | None], *, floor: int, headroom: float = HEADROOM
) -> dict[str, int]:
    """Node -> whole tokens per fill, summing to ``limit`` (each at least one while there are
    tokens enough). ``offered``: tokens per fill each node saw asked; None: not measured yet
    (it gets the floor's demand)."""
    if not offered:
        return {}
    nodes = sorted(offered)
    if limit < len(nodes):  # fewer tokens than Envoys: one each to the busiest
        busiest = sorted(nodes, key=lambda n: -(offered[n] or 0.0))[:limit]
        return {n: int(n in busiest) for n in nodes}
    demand = {n: max((offered[n] or 0.0) * (1.0 + headroom), float(floor), 1.0) for n in nodes}
    total = sum(demand.values())
    share: dict[str, float] = {}
    if total <= limit:
        share = {n: limit * d / total for n, d in demand.items()}
    else:
        left, open_nodes = float(limit), set(nodes)
        while open_nodes:
            equal = left / len(open_nodes)
            small = {n for n in open_nodes if demand[n] <= equal}
            if not small:
                share.update({n: equal for n in open_nodes})
                break
            for n in small:
                share[n] = demand[n]
                left -= demand[n]
            open_nodes -= small
    return _whole(limit, share)


def _whole(limit: int, share: Mapping[str, float]) -> dict[str, int]:
    """Largest remainder: whole tokens, each at least one, adding up to ``limit``."""
    whole = {n: max(1, math.floor(s)) for n, s in share.items()}
    spare = limit - sum(whole.values())
    by_remainder = sorted(share, key=lambda n: (-(share[n] - math.floor(share[n])), n))
    i = 0
    while spare > 0:
        whole[by_remainder[i % len(by_remainder)]] += 1
        spare -= 1
        i += 1
    while spare < 0:  # the minimum of one took more than the floors left: take from the largest
        largest = max(whole, key=lambda n: (whole[n], n))
        whole[largest] -= 1
        spare += 1
    return whole
