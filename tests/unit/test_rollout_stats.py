"""The rollout statistics against hand computation and brute force."""

from __future__ import annotations

import math
import random

import pytest

from inferway.controllers.rollout.stats import (
    FIRST_LOOK,
    MIXTURE_FACTORS,
    look_alpha,
    look_index,
    mann_whitney,
    sprt_bernoulli,
    sprt_vs_stable,
    weighted_quantile,
)


def test_sprt_llr_matches_the_bernoulli_likelihood_ratio() -> None:
    t = sprt_bernoulli(3, 200, p0=0.001, p1=0.006, alpha=0.001, beta=0.05)
    expected = 3 * math.log(0.006 / 0.001) + 197 * math.log(0.994 / 0.999)
    assert t.llr == pytest.approx(expected)
    assert t.upper == pytest.approx(math.log(1000))
    assert t.lower == pytest.approx(math.log(0.05 / 0.999))
    assert t.verdict == "need_more"


def test_sprt_boundaries_give_fail_and_pass() -> None:
    assert sprt_bernoulli(8, 100, p0=0.001, p1=0.006, alpha=0.001, beta=0.05).verdict == "fail"
    assert sprt_bernoulli(0, 1000, p0=0.001, p1=0.006, alpha=0.001, beta=0.05).verdict == "pass"


def test_sprt_need_more_is_the_expected_remaining_sample_under_the_null() -> None:
    kw = {"p0": 0.001, "p1": 0.006, "alpha": 0.001, "beta": 0.05}
    t = sprt_bernoulli(0, 100, **kw)
    need = t.need_more()
    # Walk 300 seeded paths of a canary exactly as good as stable from this point: on average
    # they reach a decision after about `need` more requests (Wald: overshoot makes it a
    # little more).
    rng = random.Random(7)
    hit, miss = math.log(0.006 / 0.001), math.log(0.994 / 0.999)
    lengths = []
    for _ in range(300):
        llr, n = t.llr, 0
        while t.lower < llr < t.upper:
            llr += hit if rng.random() < 0.001 else miss
            n += 1
        lengths.append(n)
    mean = sum(lengths) / len(lengths)
    assert 0.75 * need <= mean <= 1.25 * need
    assert sprt_bernoulli(0, 100 + need, **kw).verdict == "pass"  # clean requests: enough


def test_sprt_refuses_impossible_inputs() -> None:
    with pytest.raises(ValueError, match="p0 < p1"):
        sprt_bernoulli(0, 1, p0=0.2, p1=0.1, alpha=0.01, beta=0.05)
    with pytest.raises(ValueError, match="events <= trials"):
        sprt_bernoulli(3, 2, p0=0.1, p1=0.2, alpha=0.01, beta=0.05)


def _brute_u(xs: list[float], ys: list[float]) -> float:
    return sum((x > y) + 0.5 * (x == y) for x in xs for y in ys)


def _counts(values: list[float]) -> dict[float, int]:
    out: dict[float, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


@pytest.mark.parametrize("seed", range(5))
def test_mann_whitney_u_equals_the_pairwise_count_with_ties(seed: int) -> None:
    rng = random.Random(seed)
    xs = [float(rng.randint(0, 12)) for _ in range(rng.randint(1, 40))]
    ys = [float(rng.randint(0, 12)) for _ in range(rng.randint(1, 40))]
    mw = mann_whitney(_counts(xs), _counts(ys))
    assert mw.u == pytest.approx(_brute_u(xs, ys))
    assert mw.auc == pytest.approx(mw.u / (len(xs) * len(ys)))


def test_mann_whitney_z_sign_follows_the_shift() -> None:
    base = {float(v): 1 for v in range(100)}
    shifted = {float(v) + 30: 1 for v in range(100)}
    assert mann_whitney(shifted, base).z > 3
    assert mann_whitney(base, shifted).z < -3
    assert mann_whitney(base, base).z == pytest.approx(0.0)


def test_look_schedule_spends_at_most_alpha() -> None:
    assert look_index(FIRST_LOOK - 1) == 0
    assert look_index(FIRST_LOOK) == 1
    assert look_index(int(FIRST_LOOK * 1.5)) == 2
    assert sum(look_alpha(0.01, k) for k in range(1, 10_000)) < 0.01


def test_weighted_quantile_reads_bucket_bounds() -> None:
    hist = {10.0: 90, 50.0: 9, 200.0: 1}
    assert weighted_quantile(hist, 0.5) == 10.0
    assert weighted_quantile(hist, 0.99) == 50.0
    assert weighted_quantile(hist, 0.999) == 200.0
    assert weighted_quantile({}, 0.99) is None


def test_sprt_against_a_well_measured_stable_matches_the_known_rate_test() -> None:
    known = sprt_bernoulli(3, 500, p0=0.001, p1=0.006, alpha=0.001, beta=0.05)
    measured = sprt_vs_stable(
        3, 500, 1000, 1_000_000, increase=0.005, floor=0.00025, alpha=0.001, beta=0.05
    )
    assert measured.llr == pytest.approx(known.llr, abs=0.05)
    assert measured.p0 == pytest.approx(0.001, rel=0.01)


def test_sprt_against_a_noisy_stable_weighs_the_same_canary_errors_less() -> None:
    # Stable measured on 300 requests with 0 errors: its rate could well be 0.3%, so four
    # canary errors in 300 are weaker evidence than against a stable known to be at 0.17%
    # (the posterior mean the noisy estimate gives).
    noisy = sprt_vs_stable(4, 300, 0, 300, increase=0.005, floor=0.00025, alpha=0.001, beta=0.05)
    known = sprt_bernoulli(4, 300, p0=noisy.p0, p1=noisy.p1, alpha=0.001, beta=0.05)
    assert noisy.llr < known.llr
    assert noisy.verdict == "need_more"


def test_one_5xx_against_a_spotless_stable_stays_under_the_fail_boundary() -> None:
    t = sprt_vs_stable(1, 10, 0, 1_000_000, increase=0.005, floor=0.00025, alpha=0.001, beta=0.05)
    assert t.verdict == "need_more"
    assert t.llr == pytest.approx(math.log(0.00525 / 0.00025) + 9 * math.log(0.99475 / 0.99975))


def test_a_canary_far_worse_than_the_limit_fails_before_the_plain_sprt_would() -> None:
    # 3 errors in 60 (5%) against a 0.1% stable and a 0.5-point limit: not yet enough
    # evidence against the limit alone, plenty against its multiples
    t = sprt_bernoulli(3, 60, p0=0.001, p1=0.006, alpha=0.001, beta=0.05)
    assert t.llr < t.upper <= t.llr_fail
    assert t.verdict == "fail"
    assert len(MIXTURE_FACTORS) > 1 and MIXTURE_FACTORS[0] == 1  # the limit is one of them
    # the mixture never gives up more than ln(K) against the limit alone
    for events, trials in ((0, 500), (2, 300), (6, 400), (20, 200)):
        s = sprt_bernoulli(events, trials, p0=0.001, p1=0.006, alpha=0.001, beta=0.05)
        assert s.llr_fail >= s.llr - math.log(len(MIXTURE_FACTORS)) - 1e-9


def test_the_mixtures_false_failures_stay_under_alpha_however_often_it_looks() -> None:
    # Ville's inequality for the average of martingales: identical rates, a look every 10
    # requests up to 3,000, alpha raised to 0.05 so a broken bound would show in 400 runs
    rng = random.Random(11)
    alpha, failed = 0.05, 0
    for _ in range(400):
        events = 0
        for n in range(1, 3001):
            events += rng.random() < 0.01
            if n % 10 == 0:
                t = sprt_bernoulli(events, n, p0=0.01, p1=0.02, alpha=alpha, beta=0.05)
                if t.verdict == "fail":
                    failed += 1
                    break
                if t.verdict == "pass":
                    break
    assert failed / 400 <= alpha, failed
