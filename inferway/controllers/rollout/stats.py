"""The statistics behind rollout verdicts, in plain Python (stdlib ``NormalDist``, no scipy).

Two tests, chosen because their error bounds survive looking at the data again and again, at
any traffic level:

- Wald's sequential probability ratio test (SPRT) for rates (errors, disagreements). Under the
  null the likelihood ratio is a non-negative martingale, so by Ville's inequality
  ``P(LR ever >= 1/alpha) <= alpha``: the false-failure bound holds however often a rollout
  looks, and a step waits exactly as long as the evidence needs. Against stable, whose rate
  is itself estimated, the likelihoods are averaged over stable's Beta posterior (a
  Beta-Binomial likelihood ratio), so a noisy stable estimate damps the evidence instead of
  inflating it. The fail side is a mixture SPRT (Robbins' mixture martingale, the "always
  valid" test of Johari et al., 2017): the alternative is the tolerated increase times each of
  ``MIXTURE_FACTORS``, equally weighted. An average of martingales is one, so the same bound
  holds, and a canary far worse than the limit is caught in proportion to how bad it is
  instead of at the pace of one just at the limit; the pass side stays the plain SPRT against
  the limit, so passing a canary at the limit keeps probability at most ``beta``.
- The Mann-Whitney U test for latency distributions, on raw samples or on histogram buckets
  (each bucket's count placed at its upper bound; ties get mid-ranks). Repeated looks are
  corrected by spending ``alpha`` over a geometric look schedule (``alpha_k = alpha 6/(pi^2
  k^2)``, which sums to ``alpha``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

__all__ = [
    "MIXTURE_FACTORS",
    "MannWhitney",
    "Result",
    "Sprt",
    "look_alpha",
    "look_index",
    "mann_whitney",
    "normal_quantile",
    "sprt_bernoulli",
    "sprt_vs_stable",
    "weighted_quantile",
]

_NORMAL = NormalDist()
# Geometric look schedule for tests that are not martingales: look k happens once the canary
# has FIRST_LOOK * GROWTH**(k-1) samples. Planned by sample size, never by the data.
FIRST_LOOK = 20
GROWTH = 1.5
# The fail side's alternatives: the tolerated increase times these, equally weighted (up to 64x:
# a 0.5-point limit reaches a 32-point increase). Fixed in advance, never chosen from the data.
MIXTURE_FACTORS = (1, 2, 4, 8, 16, 32, 64)
# Cap for "need ~N more": beyond this the evidence is pointing nowhere; say so instead of
# printing an absurd number.
MAX_NEED = 10**9


def normal_quantile(p: float) -> float:
    """The standard normal quantile (inverse CDF)."""
    return _NORMAL.inv_cdf(p)


Result = Literal["pass", "fail", "need_more"]
"""A verdict: decided either way, or more evidence needed."""


@dataclass(frozen=True, slots=True)
class Sprt:
    """One SPRT evaluation: the log likelihood ratio against its two boundaries."""

    llr: float  # against the limit (p1): the pass side
    upper: float  # fail at or above: ln(1/alpha)
    lower: float  # pass at or below: ln(beta / (1 - alpha))
    p0: float
    p1: float
    drift_h0: float  # expected LLR change per observation if H0 holds (negative)
    drift_h1: float  # ... if H1 holds (positive)
    llr_fail: float  # against the mixture of alternatives at and beyond p1: the fail side

    @property
    def verdict(self) -> Result:
        if self.llr_fail >= self.upper:
            return "fail"
        if self.llr <= self.lower:
            return "pass"
        return "need_more"

    def need_more(self) -> int:
        """Observations still needed to reach the boundary the evidence leans to, at that
        hypothesis' expected drift (pass under H0 while LLR <= 0, fail under H1 otherwise);
        0 once decided."""
        if self.verdict != "need_more":
            return 0
        if self.llr <= 0:
            return min(MAX_NEED, math.ceil((self.llr - self.lower) / -self.drift_h0))
        return min(MAX_NEED, max(1, math.ceil((self.upper - self.llr_fail) / self.drift_h1)))

    def expected_to_pass(self) -> int:
        """Wald's expected sample size from zero to the pass boundary under H0."""
        return min(MAX_NEED, math.ceil(-self.lower / -self.drift_h0))

    def expected_to_fail(self) -> int:
        """Expected sample size from zero to the fail boundary for a canary just at the limit
        (at most: the mixture is never below the limit's LLR less ln of its size)."""
        return min(MAX_NEED, math.ceil((self.upper + _LN_MIXTURE) / self.drift_h1))


_LN_MIXTURE = math.log(len(MIXTURE_FACTORS))
_TOP = 1.0 - 1e-9


def _bernoulli_llr_terms(p0: float, p1: float) -> tuple[float, float]:
    return math.log(p1 / p0), math.log((1.0 - p1) / (1.0 - p0))


def _alternatives(p: float, increase: float) -> list[float]:
    """The mixture's alternative rates for a base rate ``p`` (capped below 1)."""
    return [min(p + increase * f, _TOP) for f in MIXTURE_FACTORS]


def _loglik(events: int, misses: int, rate: float) -> float:
    return events * math.log(rate) + misses * math.log1p(-rate)


def sprt_bernoulli(
    events: int, trials: int, *, p0: float, p1: float, alpha: float, beta: float
) -> Sprt:
    """SPRT of ``H0: rate = p0`` against ``H1: rate = p1`` (``p1 > p0``) on ``events`` out of
    ``trials``. The LLR depends only on the totals, so evidence can be accumulated as counts."""
    if not 0.0 < p0 < p1 < 1.0:
        raise ValueError(f"SPRT needs 0 < p0 < p1 < 1, got p0={p0!r}, p1={p1!r}")
    if not 0 <= events <= trials:
        raise ValueError(f"SPRT needs 0 <= events <= trials, got {events} of {trials}")
    hit, miss = _bernoulli_llr_terms(p0, p1)
    misses = trials - events
    llr = events * hit + misses * miss
    null = _loglik(events, misses, p0)
    mixture = [_loglik(events, misses, q) - null for q in _alternatives(p0, p1 - p0)]
    return Sprt(
        llr=llr,
        upper=math.log(1.0 / alpha),
        lower=math.log(beta / (1.0 - alpha)),
        p0=p0,
        p1=p1,
        drift_h0=p0 * hit + (1.0 - p0) * miss,
        drift_h1=p1 * hit + (1.0 - p1) * miss,
        llr_fail=_logsumexp(mixture) - _LN_MIXTURE,
    )


# Stable's posterior is integrated by Monte Carlo over this many draws, from a fixed seed so a
# verdict is a pure function of its counts.
POSTERIOR_DRAWS = 512
MIXTURE_STRIDE = 4
_POSTERIOR_SEED = 20261201


def _logsumexp(x: list[float]) -> float:
    top = max(x)
    return top + math.log(math.fsum(math.exp(v - top) for v in x))


def sprt_vs_stable(
    events: int,
    trials: int,
    stable_events: int,
    stable_trials: int,
    *,
    increase: float,
    floor: float,
    alpha: float,
    beta: float,
) -> Sprt:
    """SPRT of ``H0: canary rate = p`` against ``H1: canary rate = p + increase``, where ``p``
    is stable's rate, unknown: both likelihoods are averaged over stable's posterior
    (Jeffreys prior, ``Beta(e + 1/2, n - e + 1/2)``), each draw raised to at least ``floor``
    (rates below it count as ``floor``: the indifference zone that keeps one 5xx against a
    spotless stable from being a rollback by itself)."""
    if not 0 <= events <= trials or not 0 <= stable_events <= stable_trials:
        raise ValueError(
            f"SPRT needs 0 <= events <= trials, got {events} of {trials} "
            f"and {stable_events} of {stable_trials}"
        )
    if not 0 < increase < 1 or not 0 < floor < 1:
        raise ValueError(f"SPRT needs 0 < increase, floor < 1, got {increase!r}, {floor!r}")
    a, b = stable_events + 0.5, stable_trials - stable_events + 0.5
    # the standard library's generator, not numpy's: the gateway installs without numerics
    rng = random.Random(_POSTERIOR_SEED)
    top = 1 - increase - 1e-12
    p = [min(max(rng.betavariate(a, b), floor), top) for _ in range(POSTERIOR_DRAWS)]
    misses = trials - events
    ll0 = [_loglik(events, misses, x) for x in p]
    ll1 = [_loglik(events, misses, x + increase) for x in p]
    null = _logsumexp(ll0)
    llr = _logsumexp(ll1) - null
    # The mixture: each alternative under every MIXTURE_STRIDE-th draw, equally weighted,
    # against the null over the same draws (a quarter of the draws keeps the analysis' cost
    # near the plain test's; still a pure function of the counts).
    log, log1p, top = math.log, math.log1p, _TOP
    steps = [increase * f for f in MIXTURE_FACTORS]
    sub = p[::MIXTURE_STRIDE]
    mix = [
        events * log(q) + misses * log1p(-q) for x in sub for q in [min(x + d, top) for d in steps]
    ]
    llr_fail = _logsumexp(mix) - _LN_MIXTURE - _logsumexp(ll0[::MIXTURE_STRIDE])
    p0 = min(max(a / (a + b), floor), 1 - increase - 1e-12)
    p1 = p0 + increase
    hit, miss = _bernoulli_llr_terms(p0, p1)
    return Sprt(
        llr=llr,
        upper=math.log(1.0 / alpha),
        lower=math.log(beta / (1.0 - alpha)),
        p0=p0,
        p1=p1,
        drift_h0=p0 * hit + (1.0 - p0) * miss,
        drift_h1=p1 * hit + (1.0 - p1) * miss,
        llr_fail=llr_fail,
    )


@dataclass(frozen=True, slots=True)
class MannWhitney:
    """One-sided Mann-Whitney U: is ``x`` stochastically larger than ``y``?"""

    n_x: int
    n_y: int
    u: float
    auc: float  # P(X > Y) + P(X = Y)/2
    z: float  # normal approximation with tie correction; +inf/-inf when degenerate


def _sorted_items(values: Mapping[float, int]) -> list[tuple[float, int]]:
    return sorted((float(v), int(c)) for v, c in values.items() if c > 0)


def mann_whitney(x: Mapping[float, int], y: Mapping[float, int]) -> MannWhitney:
    """U statistic of ``x`` against ``y``, both given as value -> count (samples have count 1,
    histogram buckets their bucket count), in O(distinct values log distinct values)."""
    xs, ys = _sorted_items(x), _sorted_items(y)
    n_x = sum(c for _, c in xs)
    n_y = sum(c for _, c in ys)
    if n_x == 0 or n_y == 0:
        return MannWhitney(n_x, n_y, 0.0, 0.5, 0.0)
    merged: dict[float, list[int]] = {}
    for v, c in xs:
        merged.setdefault(v, [0, 0])[0] += c
    for v, c in ys:
        merged.setdefault(v, [0, 0])[1] += c
    u = 0.0
    y_below = 0
    tie_term = 0.0
    for v in sorted(merged):
        cx, cy = merged[v]
        u += cx * (y_below + 0.5 * cy)
        y_below += cy
        t = cx + cy
        tie_term += t**3 - t
    n = n_x + n_y
    mean = n_x * n_y / 2.0
    var = n_x * n_y / 12.0 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0.0:
        z = 0.0 if u == mean else math.copysign(math.inf, u - mean)
    else:
        z = (u - mean) / math.sqrt(var)
    return MannWhitney(n_x, n_y, u, u / (n_x * n_y), z)


def look_index(n: int) -> int:
    """Which planned look a sample size ``n`` has reached (0: not yet the first)."""
    if n < FIRST_LOOK:
        return 0
    return 1 + math.floor(math.log(n / FIRST_LOOK) / math.log(GROWTH) + 1e-12)


def look_alpha(alpha: float, k: int) -> float:
    """The share of ``alpha`` spent at look ``k >= 1``; the shares sum to ``alpha``."""
    return alpha * 6.0 / (math.pi**2 * k * k)


def weighted_quantile(values: Mapping[float, int], q: float) -> float | None:
    """The ``q`` quantile of value -> count (the smallest value with cumulative share >= q);
    None without data. For buckets this is the bucket's upper bound, as Prometheus reads it."""
    items = _sorted_items(values)
    total = sum(c for _, c in items)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for v, c in items:
        seen += c
        if seen >= rank:
            return v
    return items[-1][0]
