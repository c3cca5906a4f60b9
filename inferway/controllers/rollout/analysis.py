"""Evidence in, verdicts out: one verdict per check, each carrying the numbers behind it.

A verdict is ``pass``, ``fail`` or ``need_more`` (with the canary requests still needed,
computed from the test, never guessed). Comparisons use the whole run's evidence, canary vs
stable over the same windows:

- error rate: SPRT against stable (``stats.sprt_vs_stable``), ``H0``: canary is as good as
  stable, ``H1``: it is worse by the tolerated limit (failing on a mixture of the limit and
  multiples of it, so a much worse canary is failed sooner); stable's rate is integrated
  over its own posterior, and rates under 1/20 of the limit count as 1/20 of it, so a single
  5xx against a spotless stable is not a rollback on its own. Output agreement: SPRT of the
  disagreement rate, ``H0``: half the tolerated rate, ``H1``: the tolerated rate (and its
  multiples on the fail side).
- latency: Mann-Whitney U of canary against stable scaled by ``1 + max_increase``; ``ttft``
  and ``itl`` are the same test on the time to first token and per output token of streamed
  LLM answers.

The ``backend-*`` checks run the same tests on the counts the backends report themselves.

False-rollback bound with identical versions: at most ``alpha`` per comparison for the whole
run, however often it is analysed (Ville's inequality for the SPRT, exact for a known stable
rate and measured with it estimated; alpha spending for U).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from inferway.controllers.rollout.config import (
    AbsoluteGuard,
    AgreementCheck,
    AnalysisConfig,
    ErrorRateCheck,
    LatencyCheck,
)
from inferway.controllers.rollout.evidence import Evidence
from inferway.controllers.rollout.stats import (
    FIRST_LOOK,
    MAX_NEED,
    Result,
    Sprt,
    look_alpha,
    look_index,
    mann_whitney,
    normal_quantile,
    sprt_bernoulli,
    sprt_vs_stable,
    weighted_quantile,
)

__all__ = ["Analysis", "Verdict", "analyze"]

Number = float | int | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """One check's outcome and everything needed to re-derive it."""

    check: str
    result: Result
    reason: str
    need_more: int  # canary requests (or mirrored comparisons) still needed; 0 when decided
    test: str
    statistic: float | None
    threshold: dict[str, float]
    inputs: dict[str, Number]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(**{**data, "threshold": dict(data["threshold"]), "inputs": dict(data["inputs"])})


@dataclass(frozen=True, slots=True)
class Analysis:
    """All verdicts of one analysis and their combination (any fail fails; all pass pass)."""

    result: Result
    need_more: int
    reason: str
    verdicts: tuple[Verdict, ...]
    looks: dict[str, int] = field(default_factory=dict)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _sprt_verdict(
    check: str, t: Sprt, events: int, trials: int, what: str, inputs: dict[str, Number]
) -> Verdict:
    result = t.verdict
    need = t.need_more()
    rate = events / trials if trials else None
    if result == "fail":
        reason = f"{check}: {events}/{trials} {what} is evidence of a rate >= {t.p1:.4%}"
    elif result == "pass":
        reason = f"{check}: {events}/{trials} {what} is evidence of a rate <= {t.p0:.4%}"
    else:
        reason = f"{check}: need ~{need} more canary requests ({events}/{trials} {what} so far)"
    return Verdict(
        check=check,
        result=result,
        reason=reason,
        need_more=need,
        test="sprt",
        statistic=t.llr,
        threshold={"fail_llr": t.upper, "pass_llr": t.lower, "p0": t.p0, "p1": t.p1},
        inputs={
            **inputs,
            "canary_events": events,
            "canary_trials": trials,
            "canary_rate": rate,
            "llr_mixture": t.llr_fail,  # the fail side: against the limit and beyond it
            "expected_to_pass": t.expected_to_pass(),
            "expected_to_fail": t.expected_to_fail(),
        },
    )


def _error_rate(c: ErrorRateCheck, ev: Evidence, a: AnalysisConfig) -> Verdict:
    s, k = ev.versions(backend=c.backend)
    t = sprt_vs_stable(
        k.errors,
        k.requests,
        s.errors,
        s.requests,
        increase=c.max_increase,
        floor=c.max_increase / 20,
        alpha=a.alpha,
        beta=a.beta,
    )
    inputs: dict[str, Number] = {
        "stable_requests": s.requests,
        "stable_errors": s.errors,
        "stable_rate": s.errors / s.requests if s.requests else None,
        "max_increase": c.max_increase,
    }
    return _sprt_verdict(c.name, t, k.errors, k.requests, "errors", inputs)


def _agreement(c: AgreementCheck, ev: Evidence, a: AnalysisConfig) -> Verdict:
    m = ev.mirror
    limit = 1 - c.min
    t = sprt_bernoulli(m.disagreed, m.compared, p0=limit / 2, p1=limit, alpha=a.alpha, beta=a.beta)
    return _sprt_verdict(c.name, t, m.disagreed, m.compared, "disagreed", {"min": c.min})


def _latency(c: LatencyCheck, ev: Evidence, a: AnalysisConfig, last_look: int) -> Verdict:
    stable_counts, canary_counts = ev.versions(backend=c.backend)
    canary = canary_counts.distribution(c.distribution)
    stable = stable_counts.distribution(c.distribution)
    factor = 1 + c.max_increase
    mw = mann_whitney(canary, {v * factor: n for v, n in stable.items()})
    k = look_index(mw.n_x)
    z_pass = normal_quantile(1 - a.beta)
    z_fail = normal_quantile(1 - look_alpha(a.alpha, max(k, 1)))
    inputs: dict[str, Number] = {
        "canary_samples": mw.n_x,
        "stable_samples": mw.n_y,
        "canary_p50_ms": weighted_quantile(canary, 0.5),
        "canary_p99_ms": weighted_quantile(canary, 0.99),
        "stable_p50_ms": weighted_quantile(stable, 0.5),
        "stable_p99_ms": weighted_quantile(stable, 0.99),
        "auc_vs_scaled_stable": mw.auc,
        "look": k,
        "max_increase": c.max_increase,
    }
    threshold = {"fail_z": z_fail, "pass_z": -z_pass, "scale": factor}
    if mw.n_x < FIRST_LOOK or mw.n_y < FIRST_LOOK:
        need = max(FIRST_LOOK - mw.n_x, 1)
        reason = f"{c.name}: need ~{need} more canary samples (have {mw.n_x}, stable {mw.n_y})"
        return Verdict(c.name, "need_more", reason, need, "mann-whitney", None, threshold, inputs)
    # The fail test runs once per planned look, so alpha spending bounds it.
    if k > last_look and mw.z >= z_fail:
        reason = f"{c.name}: canary slower than stable x{factor:g} (z={mw.z:.2f} >= {z_fail:.2f})"
        return Verdict(c.name, "fail", reason, 0, "mann-whitney", _finite(mw.z), threshold, inputs)
    if mw.z <= -z_pass:
        reason = f"{c.name}: canary faster than stable x{factor:g} (z={mw.z:.2f})"
        return Verdict(c.name, "pass", reason, 0, "mann-whitney", _finite(mw.z), threshold, inputs)
    target = z_pass if mw.z < 0 else normal_quantile(1 - look_alpha(a.alpha, k + 1))
    if abs(mw.z) < 1e-9:
        need = MAX_NEED
    else:
        need = min(MAX_NEED, max(1, math.ceil(mw.n_x * (target / abs(mw.z)) ** 2) - mw.n_x))
    reason = f"{c.name}: need ~{need} more canary samples (z={mw.z:.2f})"
    z = _finite(mw.z)
    return Verdict(c.name, "need_more", reason, need, "mann-whitney", z, threshold, inputs)


def _guard(g: AbsoluteGuard, ev: Evidence, a: AnalysisConfig) -> Verdict:
    name = f"guard:{g.metric}"
    k = ev.canary
    if g.metric == "error-rate":
        t = sprt_bernoulli(k.errors, k.requests, p0=g.max / 2, p1=g.max, alpha=a.alpha, beta=a.beta)
        return _sprt_verdict(name, t, k.errors, k.requests, "errors", {"max": g.max})
    n = sum(k.latency_ms.values())
    needed = math.ceil(10 / (1 - g.quantile))  # ten samples in the tail before judging it
    value = weighted_quantile(k.latency_ms, g.quantile)
    inputs: dict[str, Number] = {"canary_samples": n, "quantile": g.quantile, "value_ms": value}
    threshold = {"max_ms": g.max, "min_samples": float(needed)}
    if n < needed or value is None:
        reason = f"{name}: need ~{needed - n} more canary samples"
        return Verdict(name, "need_more", reason, needed - n, "absolute", value, threshold, inputs)
    ok = value <= g.max
    q = f"p{g.quantile * 100:g}"
    reason = f"{name}: canary {q} {value:g} ms {'<=' if ok else '>'} {g.max:g} ms"
    return Verdict(name, "pass" if ok else "fail", reason, 0, "absolute", value, threshold, inputs)


def analyze(config: AnalysisConfig, ev: Evidence, looks: Mapping[str, int]) -> Analysis:
    """Judge the evidence. ``looks`` records the last planned look each latency check spent
    alpha on; the returned ``Analysis.looks`` is the updated record to keep."""
    verdicts: list[Verdict] = []
    new_looks = dict(looks)
    for check in config.checks:
        if isinstance(check, ErrorRateCheck):
            verdicts.append(_error_rate(check, ev, config))
        elif isinstance(check, AgreementCheck):
            verdicts.append(_agreement(check, ev, config))
        else:
            last = int(looks.get(check.name, 0))
            verdicts.append(_latency(check, ev, config, last))
            look = int(verdicts[-1].inputs["look"] or 0)
            if look > last and (verdicts[-1].inputs["canary_samples"] or 0) >= FIRST_LOOK:
                new_looks[check.name] = look
    verdicts.extend(_guard(g, ev, config) for g in config.guards)
    if config.min_requests != "auto" and ev.step_canary_requests < config.min_requests:
        need = config.min_requests - ev.step_canary_requests
        verdicts.append(
            Verdict(
                "min_requests",
                "need_more",
                f"min_requests: need {need} more canary requests at this step",
                need,
                "count",
                float(ev.step_canary_requests),
                {"min_requests": float(config.min_requests)},
                {"step_canary_requests": ev.step_canary_requests},
            )
        )
    failed = [v for v in verdicts if v.result == "fail"]
    waiting = [v for v in verdicts if v.result == "need_more"]
    if failed:
        return Analysis("fail", 0, "; ".join(v.reason for v in failed), tuple(verdicts), new_looks)
    if waiting:
        need = max(v.need_more for v in waiting)
        reason = "; ".join(v.reason for v in waiting)
        return Analysis("need_more", need, reason, tuple(verdicts), new_looks)
    return Analysis("pass", 0, "all checks pass", tuple(verdicts), new_looks)
