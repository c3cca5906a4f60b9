"""Fleet-wide rate limits (``rate_limit: {scope: fleet}``): the leader splits each limit
between the Envoys by their offered load, every replica serves the split.

Why shares of a local limit, not Envoy's global rate limit service: the service costs a gRPC
call to the control plane per request (a few hundred microseconds on the request path, and a
control plane that must answer every request of the fleet, whose loss fails requests open or
closed), where shares cost nothing per request and keep working, at their last split, while
no control plane answers. The price is accuracy: a split is as fresh as the Envoys' last
reports (``stats_push_s``) and the leader's last pass (``SPLIT_S``), so when the load moves
between Envoys the fleet admits less than the limit, or up to the light Envoys' headroom more,
until the next split, and a new Envoy holds the floor (a tenth of the limit) until it is
counted in. With steady load the fleet admits the limit to whole-token rounding (measured in
tests/e2e/test_fleet_rate_limit.py).

:class:`FleetLimits` runs on every replica: it follows ``ratelimits/<route>`` (each node's
tokens per fill) into the control plane's State, so every replica pushes the same split. Its
``splitter`` runs on the leader: every ``SPLIT_S`` it reads each Envoy's limiter counters from
the fleet's evidence (``requests`` = offered, ``errors`` = refused, under
``ratelimit:<route>``), splits each fleet-wide limit (:func:`split_limit`) and writes it with
its fence when an Envoy came or went or the fleet would admit 5% of the limit more or less.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from inferway import background
from inferway.gateway.control_plane import ControlPlane, PolicyRefusedError
from inferway.gateway.fleet.envoy_reports import LIMITER_KEY, ReportView
from inferway.gateway.fleet.limit_shares import split_limit
from inferway.gateway.fleet.prefix_watch import PrefixWatch
from inferway.gateway.fleet.store import Fence, FencedError, Record, Store, StoreUnavailableError
from inferway.policies.model import Policy
from inferway.resolve.routes import fleet_floor

__all__ = ["PREFIX", "SPLIT_S", "FleetLimits", "fleet_limits", "local_limit_warnings"]

log = logging.getLogger("inferway.fleet")

PREFIX = "ratelimits/"
SPLIT_S = 2.0
"""How often the leader splits the limits again."""
RATE_WINDOW_S = 10.0
"""An Envoy's offered rate is measured over its reports of the last 10 s: over one push
(0.5 s) a 4 req/s Envoy reads anywhere from 2 to 6, and every split that follows such noise
refills the buckets (a new route configuration), which admits more than the limit."""


def fleet_limits(policy: Policy | None) -> dict[str, int]:
    """Route -> tokens per fill of each fleet-wide limit of ``policy``."""
    if policy is None:
        return {}
    return {
        r.name: r.rate_limit.tokens_per_fill
        for r in policy.routes
        if r.rate_limit is not None and r.rate_limit.scope == "fleet"
    }


def local_limit_warnings(policy: Policy | None, envoys: int) -> list[str]:
    """``status``'s warning for each per-Envoy limit while more than one Envoy serves it."""
    if policy is None or envoys < 2:
        return []
    return [
        f"route {r.name}: rate_limit holds per Envoy (scope: envoy) and {envoys} Envoys serve "
        f"it: the fleet admits up to {envoys} x {r.rate_limit.tokens_per_fill} per fill; "
        "say scope: fleet for a limit on their sum"
        for r in policy.routes
        if r.rate_limit is not None and r.rate_limit.scope == "envoy"
    ]


class _Splitter:
    """The leader's part (a component LeaderWork starts and stops)."""

    def __init__(self, limits: FleetLimits) -> None:
        self._limits = limits
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = background.start(
            self._limits.split_forever(), name="rate limit split", log=log
        )

    async def stop(self) -> None:
        await background.cancel(self._task)
        self._task = None


class FleetLimits:
    def __init__(
        self,
        plane: ControlPlane,
        store: Store,
        evidence: ReportView,
        fence: Callable[[], Fence | None],
        *,
        silent_after_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.plane, self.store, self.evidence = plane, store, evidence
        self._fence = fence
        self._silent_after_s = silent_after_s
        self._clock = clock
        self._splits: dict[str, dict[str, int]] = {}
        self._seen = 0
        self._counts: dict[tuple[str, str], deque[tuple[float, int]]] = {}
        """(route, node) -> (report time, offered) of its reports of the last RATE_WINDOW_S."""
        self._rates: dict[tuple[str, str], float] = {}
        self._watch = PrefixWatch(
            self.store, PREFIX, self._take, lambda: self._seen, "rate limit split watch"
        )
        self.splitter = _Splitter(self)
        self.writes = 0
        """Splits this replica wrote (each refills the Envoys' buckets)."""
        self.fenced: Callable[[str], None] = lambda reason: None

    # -- every replica: the store's splits into the State ------------------------------------

    def splits(self) -> dict[str, dict[str, int]]:
        return {route: dict(shares) for route, shares in self._splits.items()}

    def _take(self, record: Record) -> None:
        self._seen = max(self._seen, record.version)
        try:
            split = json.loads(record.value)
            shares = {str(n): int(t) for n, t in split["shares"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("%s: not readable: %s", record.key, exc)
            return
        self._splits[record.key.removeprefix(PREFIX)] = shares
        self._apply()

    def _apply(self) -> None:
        state = self.plane.state
        wanted = {route: dict(shares) for route, shares in self._splits.items()}
        if {k: dict(v) for k, v in state.rate_shares.items()} == wanted:
            return
        try:
            self.plane.update_state(replace(state, rate_shares=wanted), "fleet rate limits")
        except PolicyRefusedError as exc:
            log.error("fleet rate limits: split refused: %s", exc)

    async def start(self) -> None:
        self._watch.start()

    async def stop(self) -> None:
        await self._watch.stop()

    # -- the leader: split each fleet-wide limit by the offered load -------------------------

    def offered(self, route: str) -> dict[str, float | None]:
        """Each reporting Envoy's offered tokens per second on ``route``'s limiter (None: not
        measured yet), over its own reports of the last ``RATE_WINDOW_S``."""
        now = self._clock()
        out: dict[str, float | None] = {}
        for node, report in self.evidence.reports().items():
            if now - report.at > self._silent_after_s:
                continue
            totals = report.totals.get(LIMITER_KEY + route)
            key = (route, node)
            if totals is None:
                out[node] = self._rates.get(key)
                continue
            seen = self._counts.setdefault(key, deque())
            if seen and totals.requests < seen[-1][1]:
                seen.clear()  # a restarted Envoy's counters went down: measure afresh
            if not seen or report.at > seen[-1][0]:
                seen.append((report.at, totals.requests))
            while len(seen) > 2 and seen[1][0] <= report.at - RATE_WINDOW_S:
                seen.popleft()
            if len(seen) >= 2:
                (then, first), (at, last) = seen[0], seen[-1]
                self._rates[key] = (last - first) / (at - then)
            out[node] = self._rates.get(key)
        return out

    def split(
        self, route: str, limit: int, fill_s: float
    ) -> tuple[dict[str, int], dict[str, float | None]]:
        """The route's new split, and the offered tokens per fill it was made from."""
        per_fill = {n: None if r is None else r * fill_s for n, r in self.offered(route).items()}
        return split_limit(limit, per_fill, floor=fleet_floor(limit)), per_fill

    async def split_once(self) -> dict[str, dict[str, Any]]:
        """One pass: every fleet-wide limit split and written where it moved."""
        fence = self._fence()
        written: dict[str, dict[str, Any]] = {}
        policy = self.plane.policy
        if fence is None or policy is None:
            return written
        fills = {
            r.name: r.rate_limit.refill_seconds
            for r in policy.routes
            if r.rate_limit is not None and r.rate_limit.scope == "fleet"
        }
        for route, limit in fleet_limits(policy).items():
            shares, offered = self.split(route, limit, fills[route])
            if not shares or not _moved(self._splits.get(route), shares, offered, limit):
                continue
            body = {"limit": limit, "shares": shares, "at": self._clock(), "term": fence.term}
            try:
                record = await self.store.put(
                    PREFIX + route, json.dumps(body, sort_keys=True).encode(), fence=fence
                )
            except FencedError as exc:
                self.fenced(str(exc))
                raise
            self._take(record)
            self.writes += 1
            written[route] = body
            log.info("rate limit %s: split %s", route, shares)
        return written

    async def split_forever(self) -> None:
        await background.repeat(
            self.split_once,
            every_s=SPLIT_S,
            what="rate limit split",
            log=log,
            expected=(StoreUnavailableError,),
        )


def _moved(
    before: Mapping[str, int] | None,
    after: Mapping[str, int],
    offered: Mapping[str, float | None],
    limit: int,
) -> bool:
    """Worth a new split (each one refills the Envoys' buckets, so noise is not pushed): an
    Envoy came or went, the fleet would admit at least 5% of the limit more or less on the
    offered load (and at least 2 tokens), or a share moved by a quarter of the limit (fairness
    between Envoys)."""
    if before is None or set(before) != set(after):
        return True

    def admitted(shares: Mapping[str, int]) -> float:
        return sum(min(float(shares[n]), offered.get(n) or 0.0) for n in shares)

    if abs(admitted(after) - admitted(before)) >= max(2.0, 0.05 * limit):
        return True
    return any(abs(before[n] - after[n]) >= max(1, limit // 4) for n in after)
