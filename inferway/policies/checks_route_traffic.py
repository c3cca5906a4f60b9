"""Semantic checks of the per-route traffic tools (route_traffic.py): a mirror must name a
service, and should not shadow a route onto the very backend that already answers it."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from inferway.policies.model import Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["check_route_traffic"]


def check_route_traffic(policy: Policy) -> Iterator[tuple[Loc, str]]:
    services = [s.name for s in policy.services]
    for r, route in enumerate(policy.routes):
        mirror = route.mirror
        if mirror is None:
            continue
        loc: Loc = ("routes", r, "mirror", "service")
        if mirror.service not in services:
            close = difflib.get_close_matches(mirror.service, services, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            yield (
                loc,
                f"unknown service '{mirror.service}'{hint}; "
                f"known: {', '.join(services) or 'none defined'}",
            )
        elif [b.service for b in route.backends] == [mirror.service]:
            yield (
                loc,
                f"service '{mirror.service}' is this route's only backend: every mirrored "
                "request would hit it twice and nothing would be compared; mirror to another "
                "service (e.g. the canary)",
            )
