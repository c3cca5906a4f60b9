"""Rollout verdicts: sound at any traffic, explained by their inputs, and a stated
false-rollback bound that holds for identical versions however often the analysis looks."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from inferway.controllers.rollout.analysis import analyze
from inferway.controllers.rollout.config import (
    AbsoluteGuard,
    AgreementCheck,
    AnalysisConfig,
    ErrorRateCheck,
    LatencyCheck,
)
from inferway.controllers.rollout.evidence import (
    Evidence,
    MirrorCounts,
    VersionCounts,
    WindowSample,
)
from tests.rollout_samples import window

ERRORS_ONLY = AnalysisConfig(checks=(ErrorRateCheck(0.005),))


def _evidence(*samples: WindowSample) -> Evidence:
    ev = Evidence()
    for s in samples:
        ev.add(s)
    return ev


def test_identical_versions_with_enough_traffic_pass_and_record_their_inputs() -> None:
    rng = np.random.default_rng(1)
    ev = _evidence(*(window(rng, 3000, 1000) for _ in range(8)))
    result = analyze(AnalysisConfig(), ev, {})
    assert result.result == "pass", result.reason
    err, lat = result.verdicts
    assert err.inputs["canary_trials"] == 2400 and err.inputs["stable_requests"] == 21600
    assert err.statistic is not None and err.statistic <= err.threshold["pass_llr"]
    assert lat.inputs["stable_p99_ms"] is not None and lat.inputs["canary_p50_ms"] is not None
    assert lat.statistic is not None and lat.statistic <= lat.threshold["pass_z"]
    json.dumps([v.to_json() for v in result.verdicts], allow_nan=False)


def test_a_bad_canary_fails_on_its_error_rate_with_a_reason() -> None:
    rng = np.random.default_rng(2)
    ev = _evidence(window(rng, 3000, 1000, canary_errors=0.03))
    result = analyze(ERRORS_ONLY, ev, {})
    assert result.result == "fail"
    assert "error-rate" in result.reason and "evidence of a rate >=" in result.reason


def test_a_slower_canary_fails_on_latency_even_below_any_absolute_limit() -> None:
    rng = np.random.default_rng(3)
    config = AnalysisConfig(checks=(LatencyCheck(0.2),))
    ev = _evidence(*(window(rng, 2000, 2000, canary_latency=1.5) for _ in range(3)))
    result = analyze(config, ev, {})
    assert result.result == "fail", result.reason
    assert result.verdicts[0].inputs["canary_p99_ms"] < 500  # an absolute 500 ms check passes
    assert result.looks["latency-p99"] >= 1


def test_low_traffic_says_how_many_more_canary_requests_it_needs_and_that_is_enough() -> None:
    # 0.1% of 1 req/s for 30 s: no canary request yet.
    ev = _evidence(WindowSample(VersionCounts(30, 0), VersionCounts(0, 0)))
    result = analyze(ERRORS_ONLY, ev, {})
    assert result.result == "need_more"
    need = result.need_more
    assert 200 < need < 5000
    assert f"need ~{need} more canary requests" in result.reason
    # Feed what it asked for, at the null's own error rate (stable's, same windows).
    later = _evidence(
        WindowSample(VersionCounts(30_000, 30), VersionCounts(need, round(need * 0.001)))
    )
    assert analyze(ERRORS_ONLY, later, {}).result == "pass"


def test_one_5xx_against_a_spotless_stable_is_not_a_rollback() -> None:
    ev = _evidence(WindowSample(VersionCounts(1_000_000, 0), VersionCounts(10, 1)))
    assert analyze(ERRORS_ONLY, ev, {}).result == "need_more"


def test_output_agreement_passes_fails_and_waits() -> None:
    config = AnalysisConfig(checks=(AgreementCheck(0.99),))

    def judge(compared: int, disagreed: int) -> str:
        sample = WindowSample(VersionCounts(), VersionCounts(), MirrorCounts(compared, disagreed))
        return analyze(config, _evidence(sample), {}).result

    assert judge(2000, 2) == "pass"
    assert judge(200, 14) == "fail"
    assert judge(20, 0) == "need_more"


def test_absolute_guards_judge_the_canary_alone() -> None:
    config = AnalysisConfig(checks=(), guards=(AbsoluteGuard("latency-quantile", 150.0, 0.99),))
    slow = {300.0: 20, 100.0: 980}
    fast = {120.0: 20, 100.0: 980}
    few = {300.0: 5}

    def judge(latency: dict[float, int]) -> str:
        n = sum(latency.values())
        sample = WindowSample(VersionCounts(), VersionCounts(n, 0, latency))
        return analyze(config, _evidence(sample), {}).result

    assert judge(slow) == "fail"
    assert judge(fast) == "pass"
    assert judge(few) == "need_more"


def test_min_requests_floor_holds_a_step_that_the_tests_would_pass() -> None:
    rng = np.random.default_rng(4)
    ev = _evidence(*(window(rng, 3000, 1000) for _ in range(4)))
    config = AnalysisConfig(checks=(ErrorRateCheck(0.005),), min_requests=5000)
    result = analyze(config, ev, {})
    assert result.result == "need_more"
    assert result.need_more == 5000 - ev.step_canary_requests


# ---- the false-rollback bound ------------------------------------------------------------
#
# Stated bound: with identical versions, each comparison fails a run with probability at most
# alpha, for the whole run, at any number of looks. Checked over seeded runs that keep looking
# long after a pass (a rollout keeps analysing through its later steps).

RUNS = 300
LATENCY_RUNS = 150
LATENCY_ALPHA = 0.05
ALPHA = 0.01  # larger than the default 0.001 so that a broken bound would show in 300 runs


def _binomial_ceiling(runs: int, p: float) -> int:
    """Failures above mean + 3 sd would be a broken bound, not bad luck."""
    mean = runs * p
    return math.ceil(mean + 3 * math.sqrt(mean))


# 300 runs of 40 looks: 24,000 analyses at ~2 ms of Monte Carlo each (stats.sprt_vs_stable), about
# 40 s of CPU, so `make test-fast` leaves it to `make test`.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("rate", "weight"),
    [(100, 1000), (1, 5000)],  # busy at a 10% step; 1 req/s at 50% (stable as noisy as canary)
    ids=["100rps", "1rps"],
)
def test_error_rate_false_rollbacks_stay_under_alpha(rate: int, weight: int) -> None:
    config = AnalysisConfig(checks=(ErrorRateCheck(0.005),), alpha=ALPHA)
    rng = np.random.default_rng(11)
    per_window = rate * 30
    failed = 0
    for _ in range(RUNS):
        ev = Evidence()
        for _ in range(40):
            n = int(rng.poisson(per_window))
            nc = int(rng.binomial(n, weight / 10_000))
            ec, es = int(rng.binomial(nc, 0.001)), int(rng.binomial(n - nc, 0.001))
            ev.add(WindowSample(VersionCounts(n - nc, es), VersionCounts(nc, ec)))
            if analyze(config, ev, {}).result == "fail":
                failed += 1
                break
    assert failed <= _binomial_ceiling(RUNS, ALPHA)


def _latency_hist(rng: np.random.Generator, n: int) -> dict[float, int]:
    values = np.round(rng.lognormal(math.log(80.0), 0.4, n), 0)
    u, c = np.unique(values, return_counts=True)
    return {float(v): int(k) for v, k in zip(u, c, strict=True)}


def test_latency_false_rollbacks_stay_under_alpha_even_with_a_zero_margin() -> None:
    # max_increase close to 0 is the hardest case for the bound: canary and stable are then
    # compared as they are. 30 looks each: without alpha spending about 16% of these runs
    # fail (measured), over the ceiling; with it, under 5%.
    config = AnalysisConfig(checks=(LatencyCheck(1e-9),), alpha=LATENCY_ALPHA)
    rng = np.random.default_rng(12)
    failed = 0
    for _ in range(LATENCY_RUNS):
        ev, looks = Evidence(), {}
        for _ in range(30):
            ev.add(
                WindowSample(
                    VersionCounts(100, 0, _latency_hist(rng, 100)),
                    VersionCounts(20, 0, _latency_hist(rng, 20)),
                )
            )
            result = analyze(config, ev, looks)
            looks = result.looks
            if result.result == "fail":
                failed += 1
                break
    assert failed <= _binomial_ceiling(LATENCY_RUNS, LATENCY_ALPHA)
