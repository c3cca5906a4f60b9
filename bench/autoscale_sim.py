"""Autoscaling, simulated: inferway's controllers against Kubernetes HPA, Knative KPA and the
issue's threshold rule, on the same traces, the same replicas and the same arrivals.

    .venv/bin/python bench/autoscale_sim.py            # 3-day diurnal, about 1 minute
    .venv/bin/python bench/autoscale_sim.py --quick    # 2-day diurnal

A discrete-event simulation at one-second resolution: the events are each second's Poisson
arrivals (a fluid within the second), replicas started, ready and drained, and each
controller's ticks. The service model (bench/autoscale_model.py) is the heavy model's
measured cost per replica with a stated start-up time; the baselines are in
bench/autoscale_baselines.py. Every controller aims at the same per-replica load (by default
60% of a replica's 776 req/s ceiling), starts with the replicas the first second's load needs
at that target, and is bounded to [2, 16] replicas. Scored per trace: seconds whose p99
exceeds the SLO (or that shed requests), replica-seconds (start-up and drain included),
scaling actions and direction reversals; on the ramps, how long before the load needed each
replica the controller had it ready. inferway's configs are one set for all traces.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import RESULTS_DIR, environment, print_table
from bench.autoscale_baselines import HPA, KPA, Controller, InferwayController
from bench.autoscale_model import Cluster, ReplicaModel
from bench.autoscale_traces import Trace, build_traces
from inferway.gateway.autoscale_policy import autoscale_config

MIN_REPLICAS, MAX_REPLICAS = 2, 16
TARGET_UTILIZATION = 0.6
LATENCY_GUARD_S = 0.09  # 90% of the SLO: scale out without the tolerance band from there
ISSUE_RULE = {
    "scaling_policy": {
        "metric_type": "queue_length",
        "threshold": 1000,
        "action": "add_instance",
        "cooldown": 300,
    },
    "instance_type": "gpu-8x",
    "min_size": MIN_REPLICAS,
    "max_size": MAX_REPLICAS,
}
BASELINES = ("k8s-hpa", "knative-kpa", "threshold-rule")
HEADLINE = "inferway-predictive"


def inferway_config(algorithm: str, target: float, startup_s: float) -> dict[str, Any]:
    """The one inferway configuration of each algorithm, used on every trace."""
    config: dict[str, Any] = {
        "algorithm": algorithm,
        "metric": "request_rate",
        "target": target,
        "sampling_interval": 1,
        "window": 5,
        "tolerance": 0.1,
        "latency_guard": LATENCY_GUARD_S,
        "min_replicas": MIN_REPLICAS,
        "max_replicas": MAX_REPLICAS,
        "cooldown": 0,
        "stabilization": {"up": 0, "down": 20},
        "panic": {"threshold": 2.0, "window": 3, "hold": 30},
    }
    if algorithm == "pid":
        del config["tolerance"], config["latency_guard"]
        config["pid"] = {"kp": 0.8, "ki": 0.01, "kd": 0.0, "smoothing": 0.6, "deadband": 0.1}
    if algorithm == "predictive":
        config["predictive"] = {
            "horizon": startup_s + 60,
            "bucket": 60,
            "season": 86400,
            "max_error": 0.2,
        }
    return config


def build_controllers(model: ReplicaModel, target: float) -> list[Controller]:
    controllers: list[Controller] = [
        HPA(target=target, min_replicas=MIN_REPLICAS, max_replicas=MAX_REPLICAS),
        KPA(target=target, min_replicas=MIN_REPLICAS, max_replicas=MAX_REPLICAS),
        InferwayController("threshold-rule", autoscale_config("svc", ISSUE_RULE)),
    ]
    for algorithm in ("proportional", "pid", "predictive"):
        config = autoscale_config("svc", inferway_config(algorithm, target, model.startup_s))
        controllers.append(InferwayController(f"inferway-{algorithm}", config))
    return controllers


def _lead_times(trace: Trace, ready: list[int], per_replica: float) -> list[float]:
    """Seconds between having k replicas ready and the load first needing k (more than k - 1
    replicas hold at ``per_replica`` req/s each), per level k the ramp climbs through."""
    leads: list[float] = []
    for start, end in trace.ramps:
        have = ready[start]
        peak_need = math.ceil(max(trace.shape[start:end]) / per_replica)
        for k in range(have + 1, peak_need + 1):
            need_at = next(t for t in range(start, end) if trace.shape[t] > (k - 1) * per_replica)
            ready_at = next((t for t in range(start, end) if ready[t] >= k), end)
            leads.append(float(need_at - ready_at))
    return leads


def run(trace: Trace, controller: Controller, model: ReplicaModel, target: float) -> dict[str, Any]:
    first = min(max(math.ceil(trace.shape[0] / target), MIN_REPLICAS), MAX_REPLICAS)
    cluster = Cluster(model, first)
    violated, shed, ready_series = 0, 0.0, []
    base_rs = base_actions = base_reversals = 0.0
    period = max(1, round(controller.period_s))
    for t, arrivals in enumerate(trace.arrivals):
        if t == trace.measure_from_s:
            base_rs, base_actions = cluster.replica_seconds, cluster.actions
            base_reversals = cluster.reversals
        stats = cluster.step(float(t), arrivals)
        ready_series.append(cluster.ready)
        if t >= trace.measure_from_s:
            violated += stats.violated
            shed += stats.shed
        controller.observe(cluster.sample(float(t), arrivals, stats.p99_s))
        if t > 0 and t % period == 0:
            desired = controller.decide(float(t), current=cluster.current, ready=cluster.ready)
            cluster.scale_to(float(t), desired)
    leads = _lead_times(trace, ready_series, target)
    slo_leads = _lead_times(trace, ready_series, model.sustained_rate())
    return {
        "slo_violation_s": violated,
        "replica_seconds": round(cluster.replica_seconds - base_rs),
        "actions": int(cluster.actions - base_actions),
        "reversals": int(cluster.reversals - base_reversals),
        "shed_requests": round(shed),
        "ramp_lead_s": round(sum(leads) / len(leads), 1) if leads else None,
        "ramp_levels": len(leads),
        "ramp_lead_at_slo_s": round(sum(slo_leads) / len(slo_leads), 1) if slo_leads else None,
    }


def goals(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    verdicts = []
    for trace, by_name in results.items():
        ours = by_name[HEADLINE]
        for base in BASELINES:
            theirs = by_name[base]
            both_zero = ours["slo_violation_s"] == theirs["slo_violation_s"] == 0
            fewer = ours["slo_violation_s"] < theirs["slo_violation_s"]
            cheaper = ours["replica_seconds"] <= theirs["replica_seconds"]
            verdicts.append(
                {
                    "trace": trace,
                    "versus": base,
                    "slo_s": [ours["slo_violation_s"], theirs["slo_violation_s"]],
                    "replica_s": [ours["replica_seconds"], theirs["replica_seconds"]],
                    "fewer_slo_seconds": "tie at 0" if both_zero else fewer,
                    "no_more_replica_seconds": cheaper,
                    "met": (fewer or both_zero) and cheaper,
                }
            )
    diurnal = results.get("diurnal")
    if diurnal:
        pred, react = diurnal[HEADLINE], diurnal["inferway-proportional"]
        earlier = (pred["ramp_lead_s"] or 0.0) - (react["ramp_lead_s"] or 0.0)
        ahead_of_slo = pred["ramp_lead_at_slo_s"]
        verdicts.append(
            {
                "trace": "diurnal",
                "versus": "inferway-proportional (reactive)",
                "capacity_earlier_s": round(earlier, 1),
                "lead_at_slo_s": [ahead_of_slo, react["ramp_lead_at_slo_s"]],
                "reversals": [pred["reversals"], react["reversals"]],
                "met": earlier > 0 and pred["reversals"] <= react["reversals"],
            }
        )
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2-day diurnal trace")
    parser.add_argument("--startup", type=float, default=60.0, help="replica start-up, seconds")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument(
        "--target-utilization",
        type=float,
        default=TARGET_UTILIZATION,
        help="every controller's per-replica target, as a share of a replica's max rate",
    )
    parser.add_argument("--tag", default="", help="suffix of the JSON file name")
    args = parser.parse_args(argv)
    model = ReplicaModel(startup_s=args.startup)
    target = args.target_utilization * model.max_rate
    traces = build_traces(quick=args.quick, seed=args.seed)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    began = time.perf_counter()
    for trace in traces:
        results[trace.name] = {}
        for controller in build_controllers(model, target):
            results[trace.name][controller.name] = run(trace, controller, model, target)
    elapsed = time.perf_counter() - began
    columns = [
        "trace",
        "controller",
        "SLO-violation s",
        "replica-s",
        "actions",
        "reversals",
        "shed",
        "lead @target s",
        "lead @SLO s",
    ]
    rows = [
        [
            trace,
            name,
            r["slo_violation_s"],
            f"{r['replica_seconds']:,}",
            r["actions"],
            r["reversals"],
            f"{r['shed_requests']:,}",
            r["ramp_lead_s"] if r["ramp_levels"] else "",
            r["ramp_lead_at_slo_s"] if r["ramp_levels"] else "",
        ]
        for trace, by_name in results.items()
        for name, r in by_name.items()
    ]
    print_table(
        f"Autoscaling simulation (heavy model, start-up {args.startup:g} s, SLO p99 "
        f"{model.slo_s * 1000:g} ms, target {target:.0f} req/s per replica, seed {args.seed})",
        columns,
        rows,
    )
    verdicts = goals(results)
    for v in verdicts:
        print(("MET   " if v["met"] else "MISSED"), {k: v[k] for k in v if k != "met"})
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"autoscale_sim{'-' + args.tag if args.tag else ''}.json"

    out.write_text(
        json.dumps(
            {
                "environment": environment(),
                "args": vars(args),
                "model": {
                    **model.__dict__,
                    "max_rate": model.max_rate,
                    "sustained_rate_at_slo": model.sustained_rate(),
                    "target_per_replica": target,
                },
                "traces": {t.name: t.description for t in traces},
                "inferway_configs": {
                    a: inferway_config(a, target, model.startup_s)
                    for a in ("proportional", "pid", "predictive")
                },
                "issue_rule": ISSUE_RULE,
                "results": results,
                "goals": verdicts,
                "elapsed_s": round(elapsed, 1),
            },
            indent=2,
        )
    )
    print(f"wrote {out} ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
