"""How a fleet-wide rate limit is split between Envoys: max-min fair on each Envoy's offered
load, in whole tokens. Pure.

When the offered load fits in the limit, each Envoy gets its load plus ``headroom`` (room to
grow until the next split), and the rest of the limit in proportion: the shares add up to the
limit and the fleet admits everything. When it does not (the limit binds), water-filling on the
offered load: an Envoy offering less than an equal part of what is left is *light*: it keeps
its load plus headroom, and the heavy Envoys split what the light ones actually use
(``limit - their load``). So in steady state the fleet admits the limit (the light Envoys'
headroom is not taken from the heavy ones, which would leave it unused), and while a light
Envoy grows into its headroom the fleet admits up to that headroom more, until the next split
measures it. An Envoy not measured yet asks for the floor.
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
    if sum(demand.values()) <= limit:
        total = sum(demand.values())
        return _whole(limit, {n: limit * d / total for n, d in demand.items()})
    load = {n: max(offered[n] or 0.0, float(floor) if offered[n] is None else 0.0) for n in nodes}
    left, heavy, light = float(limit), set(nodes), set[str]()
    while heavy:
        equal = left / len(heavy)
        small = {n for n in heavy if load[n] <= equal}
        if not small:
            break
        for n in small:
            left -= load[n]  # what it uses, not what it may grow into
        heavy -= small
        light |= small
    shares = {n: math.ceil(demand[n]) for n in light}
    used = round(sum(load[n] for n in light))  # not ceil: a load at 4.0 +- noise would flap
    if heavy:
        shares.update(_whole(max(limit - used, len(heavy)), {n: 1.0 for n in heavy}))
    return shares


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
