"""The per-route traffic tools in the IR: percentages as parts of a million, the sticky
``hash`` as the route's first hash policy, cookie matches as written."""

from __future__ import annotations

from inferway.policies.model import Route
from inferway.policies.route_traffic import CookieMatch, Fault, Mirror
from inferway.resolve.ir.route_traffic import (
    CookieMatchIR,
    FaultAbortIR,
    FaultDelayIR,
    FaultIR,
    MirrorIR,
)

__all__ = ["per_million", "resolve_cookie_match", "resolve_fault", "resolve_mirror"]


def per_million(percent: float) -> int:
    return round(percent * 10_000)


def resolve_mirror(mirror: Mirror | None) -> MirrorIR | None:
    if mirror is None:
        return None
    return MirrorIR(service=mirror.service, per_million=per_million(mirror.percent))


def resolve_fault(route: Route) -> FaultIR | None:
    fault: Fault | None = route.fault
    if fault is None:
        return None
    return FaultIR(
        abort=None
        if fault.abort is None
        else FaultAbortIR(per_million=per_million(fault.abort.percent), status=fault.abort.status),
        delay=None
        if fault.delay is None
        else FaultDelayIR(
            per_million=per_million(fault.delay.percent), seconds=fault.delay.duration
        ),
    )


def resolve_cookie_match(cookie: CookieMatch) -> CookieMatchIR:
    return CookieMatchIR(name=cookie.name, exact=cookie.exact, present=cookie.present)
