"""Canary analysis in simulation: inferway's rollout controller against a Flagger-style baseline.

Every controller replays the same seeded request traces (``rollout_traces``), one trace per
(scenario, seed), and is ticked at its own analysis interval: inferway's pure
``RolloutController`` with its defaults (30 s, SPRT on errors and Mann-Whitney U on latency,
alpha 0.001 per comparison), and the baseline (``rollout_flagger``, Flagger's documented
algorithm with its tutorial's settings: 1m, 5 failed checks, stepWeight 10, maxWeight 50,
success rate >= 99%, P99 <= 500 ms). inferway runs twice: on the baseline's weights (10..50%,
so only the analysis differs) and on its own finer steps (1, 5, 25, 50%).

Scenarios (issue 13): a bad canary (error rate 0.1% -> 2% and every latency quantile +30%),
an identical canary, and low traffic (1 req/s in total), identical and bad. Reported per
scenario and controller: outcome shares (rolled back / promoted / undecided within the
horizon), canary requests served before the decision (for a bad canary: what it cost), time
to decision, and the false-rollback rate of identical versions with a 95% upper bound.

    .venv/bin/python bench/rollout_sim.py            # 200 seeded runs per scenario
    .venv/bin/python bench/rollout_sim.py --quick    # 40 runs
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # inferway from this checkout

from _common import environment, percentile, print_table, write_results
from rollout_flagger import FlaggerBaseline, FlaggerSettings
from rollout_traces import Scenario, Trace, Window

from inferway.controllers.rollout.config import RolloutConfig, Step
from inferway.controllers.rollout.controller import RolloutController
from inferway.controllers.rollout.evidence import VersionCounts, WindowSample
from inferway.controllers.rollout.state import Phase

HOUR = 3600.0
SCENARIOS = (
    Scenario("bad canary, 100 req/s", 100.0, 0.001, 0.02, 1.3, 2 * HOUR),
    Scenario("identical, 100 req/s", 100.0, 0.001, 0.001, 1.0, 2 * HOUR),
    Scenario("bad canary, 20 req/s", 20.0, 0.001, 0.02, 1.3, 4 * HOUR),
    Scenario("low traffic identical, 1 req/s", 1.0, 0.001, 0.001, 1.0, 12 * HOUR),
    Scenario("low traffic bad, 1 req/s", 1.0, 0.001, 0.02, 1.3, 12 * HOUR),
)
CONTROLLERS = ("flagger", "inferway (10..50% steps)", "inferway (1,5,25,50% steps)")
INFERWAY_STEPS = {
    "inferway (10..50% steps)": (10, 20, 30, 40, 50, 100),
    "inferway (1,5,25,50% steps)": (1, 5, 25, 50, 100),
}


@dataclass(frozen=True, slots=True)
class Outcome:
    outcome: str  # rolled_back | promoted | undecided
    decided_at_s: float | None
    canary_requests: int  # served by the canary before the decision (or the horizon)
    note: str


def run_flagger(trace: Trace) -> Outcome:
    f = FlaggerBaseline(FlaggerSettings())
    horizon, step = trace.scenario.horizon_s, f.settings.interval_s
    t, served = 0.0, 0
    while f.phase == "progressing" and t < horizon:
        w = trace.window(t, t + step, f.canary_share)
        served += w.canary_requests
        t += step
        f.tick(w.canary_requests, w.canary_errors, w.canary_latency_ms)
    if f.phase == "progressing":
        return Outcome("undecided", None, served, f.reason)
    return Outcome(f.phase, t, served, f.reason)


def _sample(w: Window) -> WindowSample:
    return WindowSample(
        stable=VersionCounts(w.stable_requests, w.stable_errors, w.histogram(w.stable_latency_ms)),
        canary=VersionCounts(w.canary_requests, w.canary_errors, w.histogram(w.canary_latency_ms)),
    )


def run_inferway(trace: Trace, steps: tuple[float, ...]) -> Outcome:
    config = RolloutConfig("sim", "v1", "v2", tuple(Step(p) for p in steps), history_size=1)
    c = RolloutController(config)
    c.tick(0.0)
    horizon, step = trace.scenario.horizon_s, config.analysis.interval_s
    t, served = 0.0, 0
    decision = c.state.history[-1]
    while c.state.phase == Phase.PROGRESSING and t < horizon:
        w = trace.window(t, t + step, c.weight / 10_000)
        served += w.canary_requests
        t += step
        decision = c.tick(t, _sample(w))
    if c.state.phase == Phase.PROGRESSING:
        return Outcome("undecided", None, served, decision.reason)
    return Outcome(c.state.phase.value, t, served, decision.reason)


def run(scenario: Scenario, controller: str, seeds: range) -> list[Outcome]:
    out = []
    for seed in seeds:
        trace = Trace(scenario, seed)
        if controller == "flagger":
            out.append(run_flagger(trace))
        else:
            out.append(run_inferway(trace, INFERWAY_STEPS[controller]))
    return out


def _upper95(k: int, n: int) -> float:
    """Wilson 95% upper bound of a proportion (k of n)."""
    z = 1.96
    p = k / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + margin) / (1 + z * z / n)


def summarize(scenario: Scenario, outcomes: list[Outcome]) -> dict[str, Any]:
    n = len(outcomes)
    share = {k: sum(o.outcome == k for o in outcomes) for k in ("rolled_back", "promoted")}
    undecided = n - sum(share.values())
    served = [float(o.canary_requests) for o in outcomes]
    times = [o.decided_at_s / 60 for o in outcomes if o.decided_at_s is not None]
    row: dict[str, Any] = {
        "runs": n,
        "rolled_back": share["rolled_back"],
        "promoted": share["promoted"],
        "undecided": undecided,
        "canary_requests_mean": sum(served) / n,
        "canary_requests_p50": percentile(served, 50),
        "canary_requests_p95": percentile(served, 95),
        "decision_min_p50": percentile(times, 50) if times else None,
        "decision_min_p95": percentile(times, 95) if times else None,
        "example_note": next((o.note for o in outcomes if o.outcome == "undecided"), None)
        or outcomes[0].note,
    }
    if not scenario.bad:
        row["false_rollback_rate"] = share["rolled_back"] / n
        row["false_rollback_upper95"] = _upper95(share["rolled_back"], n)
    return row


def _fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="seeded runs per scenario")
    parser.add_argument("--quick", action="store_true", help="40 runs per scenario")
    args = parser.parse_args()
    runs = 40 if args.quick else args.runs
    seeds = range(1, runs + 1)
    results: dict[str, Any] = {"runs": runs, "environment": environment(), "scenarios": {}}
    rows = []
    began = time.perf_counter()
    for scenario in SCENARIOS:
        per = {}
        for controller in CONTROLLERS:
            summary = summarize(scenario, run(scenario, controller, seeds))
            per[controller] = summary
            rows.append(
                (
                    scenario.name,
                    controller,
                    f"{summary['rolled_back']}/{summary['promoted']}/{summary['undecided']}",
                    _fmt(summary["canary_requests_mean"]),
                    _fmt(summary["canary_requests_p95"]),
                    _fmt(summary["decision_min_p50"], 1),
                    _fmt(summary["decision_min_p95"], 1),
                    "-"
                    if scenario.bad
                    else f"{summary['false_rollback_rate']:.1%} "
                    f"(<= {summary['false_rollback_upper95']:.1%})",
                )
            )
            print(f"  {scenario.name} / {controller}: done", file=sys.stderr, flush=True)
        settings = {
            "rate": scenario.rate,
            "stable_error": scenario.stable_error,
            "canary_error": scenario.canary_error,
            "canary_latency": scenario.canary_latency,
            "horizon_s": scenario.horizon_s,
        }
        results["scenarios"][scenario.name] = {"scenario": settings, "controllers": per}
    results["goals"] = goals(results["scenarios"])
    results["elapsed_s"] = round(time.perf_counter() - began, 1)
    print_table(
        f"Rollout simulation, {runs} seeded runs per scenario",
        (
            "scenario",
            "controller",
            "rolled back/promoted/undecided",
            "canary req. mean",
            "p95",
            "decision p50 (min)",
            "p95 (min)",
            "false rollbacks (95% bound)",
        ),
        rows,
    )
    for goal in results["goals"]:
        print(f"{'MET   ' if goal['met'] else 'MISSED'} {goal['goal']}: {goal['detail']}")
    print(f"results: {write_results('rollout_sim', results)}")


def goals(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 13's goals, judged for each inferway variant against the baseline."""
    out = []
    flagger = "flagger"
    for variant in CONTROLLERS[1:]:
        fr_b = s["identical, 100 req/s"]["controllers"][flagger]["false_rollback_rate"]
        fr_i = s["identical, 100 req/s"]["controllers"][variant]["false_rollback_rate"]
        lo_b = s["low traffic identical, 1 req/s"]["controllers"][flagger]["false_rollback_rate"]
        lo_i = s["low traffic identical, 1 req/s"]["controllers"][variant]["false_rollback_rate"]
        out.append(
            {
                "goal": f"{variant}: false-rollback rate <= baseline's",
                "met": fr_i <= fr_b and lo_i <= lo_b,
                "detail": f"100 req/s {fr_i:.1%} vs {fr_b:.1%}; 1 req/s {lo_i:.1%} vs {lo_b:.1%}",
            }
        )
        for name in ("bad canary, 100 req/s", "bad canary, 20 req/s"):
            b = s[name]["controllers"][flagger]["canary_requests_mean"]
            i = s[name]["controllers"][variant]["canary_requests_mean"]
            out.append(
                {
                    "goal": f"{variant}: bad-canary requests <= 1/5 of baseline's ({name})",
                    "met": i <= b / 5,
                    "detail": f"{i:,.0f} vs {b:,.0f} (ratio {i / b:.2f})",
                }
            )
        for name in ("low traffic identical, 1 req/s", "low traffic bad, 1 req/s"):
            row = s[name]["controllers"][variant]
            out.append(
                {
                    "goal": f"{variant}: a decision, not a halt, at 1 req/s ({name})",
                    "met": row["undecided"] == 0,
                    "detail": f"{row['undecided']}/{row['runs']} undecided within the horizon",
                }
            )
    return out


if __name__ == "__main__":
    main()
