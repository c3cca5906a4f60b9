"""The functional check: send the generated requests to a live gateway, read which pool
served each (the ``x-inferway-pool`` response header; ``x-inferway-replica`` names the
replica), and compare with what the policy says; then the pools' activation frequencies
against the policy's weights.

A request is routed correctly when a pool it may reach served it (any status: a backend's
own 4xx is still the right pool), when the gateway refused it with 400 and no pool for a
``reject`` rule, or answered 404 and no pool when no route matches. 5xx answers and
connection errors are errors, never correct.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import httpx

from inferway.tools.verify.cases import Coverage
from inferway.tools.verify.expect import Expected, Outcome, Probe, expect
from inferway.tools.verify.routes import VerifyRoute
from inferway.tools.verify.stats import ChiSquare, chi_square

__all__ = [
    "POOL_HEADER",
    "REPLICA_HEADER",
    "FunctionalReport",
    "Observation",
    "judge",
    "run_functional",
    "summarize",
]

POOL_HEADER = "x-inferway-pool"
REPLICA_HEADER = "x-inferway-replica"


@dataclass(frozen=True)
class Observation:
    covers: str
    expected: Expected
    status: int
    """0: no answer (connection error, timeout)."""
    pool: str | None
    replica: str | None
    correct: bool


@dataclass
class FunctionalReport:
    requests: int
    correct: int
    bar: float
    """Correctness % the run must reach."""
    mismatches: list[dict[str, object]]
    routes: dict[str, dict[str, int]]
    """route (or "no route") -> {"requests", "correct"}."""
    activation: ChiSquare
    per_route: dict[str, ChiSquare]
    replicas: dict[str, dict[str, int]]
    """pool -> replica -> requests it served."""
    uncovered: list[str] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)
    """Routes no generated request is expected to reach (shadowed by an earlier one)."""

    @property
    def correctness(self) -> float:
        return 100.0 * self.correct / self.requests if self.requests else 0.0

    @property
    def ok(self) -> bool:
        tests = [self.activation.ok, *(c.ok for c in self.per_route.values())]
        routed = self.correctness >= self.bar or not self.requests  # openai routes only
        return routed and all(t is not False for t in tests)


def judge(expected: Expected, status: int, pool: str | None) -> bool:
    """Whether an answer is the one the policy asks for (module docstring)."""
    if status == 0 or status >= 500:
        return False
    if expected.outcome is Outcome.pool:
        return pool is not None and pool in expected.services
    wanted = 400 if expected.outcome is Outcome.reject else 404
    return pool is None and status == wanted


def _sticky(probe: Probe, routes: list[VerifyRoute]) -> Probe:
    """A fresh key for every sticky split: verify plays many users, not one."""
    headers = dict(probe.headers)
    for route in routes:
        if route.sticky == "header" and route.sticky_key.lower() not in headers:
            headers[route.sticky_key.lower()] = uuid.uuid4().hex
        elif route.sticky == "cookie":
            cookie = f"{route.sticky_key}={uuid.uuid4().hex}"
            headers["cookie"] = f"{headers['cookie']}; {cookie}" if "cookie" in headers else cookie
    return Probe(probe.covers, probe.path, tuple(sorted(headers.items())), probe.body)


async def _send(client: httpx.AsyncClient, probe: Probe) -> tuple[int, str | None, str | None]:
    try:
        response = await client.post(probe.path, content=probe.body, headers=dict(probe.headers))
    except httpx.HTTPError:
        return 0, None, None
    return (
        response.status_code,
        response.headers.get(POOL_HEADER),
        response.headers.get(REPLICA_HEADER),
    )


async def run_functional(
    gateway: str,
    routes: list[VerifyRoute],
    probes: list[Probe],
    *,
    requests: int,
    concurrency: int = 8,
    timeout: float = 10.0,
) -> list[Observation]:
    """Send ``requests`` requests (at least one per probe), cycling through ``probes``."""
    total = max(requests, len(probes))
    queue = iter(range(total))
    observations: list[Observation] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=gateway, timeout=timeout, limits=limits) as client:

        async def worker() -> None:
            for i in queue:
                probe = _sticky(probes[i % len(probes)], routes)
                expected = expect(routes, probe)
                status, pool, replica = await _send(client, probe)
                correct = judge(expected, status, pool)
                observations.append(
                    Observation(probe.covers, expected, status, pool, replica, correct)
                )

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return observations


def _expected_text(expected: Expected) -> str:
    if expected.outcome is Outcome.pool:
        return f"{expected.route} -> {' | '.join(sorted(expected.services))}"
    return "400 (rejected)" if expected.outcome is Outcome.reject else "404 (no route)"


def summarize(
    observations: list[Observation],
    routes: list[VerifyRoute],
    coverage: Coverage,
    *,
    bar: float = 99.9,
    alpha: float = 0.001,
) -> FunctionalReport:
    """Correctness, mismatches, per-route counts and the activation tests of a run."""
    mismatch: Counter[tuple[str, str, str]] = Counter()
    per_route: dict[str, dict[str, int]] = defaultdict(lambda: {"requests": 0, "correct": 0})
    observed: Counter[str] = Counter()
    expected: dict[str, float] = defaultdict(float)
    route_observed: dict[str, Counter[str]] = defaultdict(Counter)
    replicas: dict[str, Counter[str]] = defaultdict(Counter)
    by_ip = {r.name for r in routes if r.sticky == "client_ip" and len(r.pools) > 1}
    for o in observations:
        name = o.expected.route or "no route"
        per_route[name]["requests"] += 1
        if o.pool is not None:
            replicas[o.pool][o.replica or "?"] += 1
        if not o.correct:
            got = f"{o.pool or 'no pool'} (HTTP {o.status})" if o.status else "no answer"
            mismatch[(o.covers, _expected_text(o.expected), got)] += 1
            continue
        per_route[name]["correct"] += 1
        if o.expected.outcome is Outcome.pool and o.pool is not None and name not in by_ip:
            observed[o.pool] += 1
            route_observed[name][o.pool] += 1
            for p in o.expected.pools:
                expected[p.service] += p.share
    splits: dict[str, ChiSquare] = {}
    for route in routes:
        # a split sticky by client IP sends one client (verify) to one pool, by design
        if len(route.pools) < 2 or route.name not in route_observed or route.name in by_ip:
            continue
        counts = route_observed[route.name]
        n = sum(counts.values())
        exp = {p.service: p.share * n for p in route.pools}
        splits[route.name] = chi_square(counts, exp, alpha=alpha)
    reached = {o.expected.route for o in observations}
    return FunctionalReport(
        requests=len(observations),
        correct=sum(o.correct for o in observations),
        bar=bar,
        mismatches=[
            {"covers": c, "expected": e, "observed": g, "count": k}
            for (c, e, g), k in mismatch.most_common()
        ],
        routes=dict(per_route),
        activation=chi_square(observed, expected, alpha=alpha),
        per_route=splits,
        replicas={pool: dict(r) for pool, r in replicas.items()},
        uncovered=list(coverage.uncovered),
        unreached=[r.name for r in routes if r.name not in reached],
    )
