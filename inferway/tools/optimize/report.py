"""What ``inferway optimize`` found, as one JSON-able document (written beside the new
version as ``optimize-report.json`` and printed by ``-o json``), the accuracy gate's verdict,
and the ``rollouts:`` stanza that would ship the version as a canary.

The stanza is checked against the policy schema (``policies.rollouts.Rollout``) before it is
printed, so what a user pastes is what ``inferway validate`` accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferway.policies.rollouts import Rollout
from inferway.tools.optimize.compare import Comparison, Speed

__all__ = ["REPORT_FILE", "GateVerdict", "build_report", "build_rollout_stanza", "judge"]

REPORT_FILE = "optimize-report.json"


@dataclass(frozen=True)
class GateVerdict:
    accepted: bool
    reasons: tuple[str, ...]
    """Why it was rejected (empty when accepted)."""

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def judge(comparison: Comparison, tolerance_percent: float, min_rows: int) -> GateVerdict:
    """Accepted when every output's deviation (normalized error) is within the tolerance,
    nothing non-finite moved, the new version answered every case the old one did, and
    enough rows were compared. Top-1 agreement is reported, not gated: on generated inputs
    a classifier's scores are often near ties, where any rounding flips the arg-max."""
    tol = tolerance_percent / 100
    reasons: list[str] = []
    if comparison.failures:
        reasons.append(
            f"the new version failed {len(comparison.failures)} case(s) the old one answered "
            f"(first: {comparison.failures[0]})"
        )
    if comparison.rows < min_rows:
        reasons.append(f"only {comparison.rows} rows compared (at least {min_rows} needed)")
    for dev in comparison.outputs:
        if dev.normalized > tol:
            by_category = dev.deviation_by_category()
            worst = max(by_category, key=lambda k: by_category[k]) if by_category else "-"
            reasons.append(
                f"output {dev.name!r}: deviation {dev.normalized * 100:.3g}% of its range "
                f"exceeds the tolerance {tolerance_percent:g}% (max abs error "
                f"{dev.max_abs:.4g}, worst on {worst} inputs)"
            )
        if dev.nonfinite_mismatches:
            reasons.append(
                f"output {dev.name!r}: {dev.nonfinite_mismatches} value(s) non-finite in one "
                "version only"
            )
    return GateVerdict(not reasons, tuple(reasons))


def build_rollout_stanza(
    model: str, stable_version: str, canary_version: str, route: str
) -> dict[str, Any]:
    """One ``rollouts:`` entry moving ``route`` from the stable version's service to the
    canary's, judged on errors and latency (services ``<model>-v<version>``)."""
    entry = {
        "name": f"{model}-v{canary_version}",
        "route": route,
        "stable": f"{model}-v{stable_version}",
        "canary": f"{model}-v{canary_version}",
        "steps": [1, 5, 25, 50, 100],
        "analysis": {
            "interval": "30s",
            "min_requests": "auto",
            "metrics": [
                {"name": "error-rate", "max_increase": "0.5%"},
                {"name": "latency-p99", "max_increase": "20%"},
            ],
        },
        "on_failure": "rollback",
    }
    Rollout.model_validate(entry)
    return {"rollouts": [entry]}


def _speed(speed: Speed) -> dict[str, float]:
    return {
        "latency_ms_p50": round(speed.latency_ms_p50, 4),
        "throughput_rows_s": round(speed.throughput_rows_s, 1),
        "batch": speed.batch,
    }


def build_report(
    *,
    model: str,
    source_version: str,
    version: str,
    path: str,
    steps: list[str],
    tolerance_percent: float,
    comparison: Comparison,
    verdict: GateVerdict,
    before: Speed,
    after: Speed,
    size_before: int,
    size_after: int,
    stanza: dict[str, Any],
    int8_weights: dict[str, object] | None = None,
) -> dict[str, Any]:
    """The report document; docs/optimize.md lists its fields."""
    return {
        "model": model,
        "source_version": source_version,
        "version": version,
        "path": path,
        "steps": steps,
        "status": "accepted" if verdict.accepted else "rejected",
        "accepted": verdict.accepted,
        "reasons": list(verdict.reasons),
        "tolerance_percent": tolerance_percent,
        "int8_weights": int8_weights,
        "validation": {
            "cases": comparison.cases,
            "rows": comparison.rows,
            "rows_by_category": dict(sorted(comparison.categories.items())),
            "failures": comparison.failures[:20],
            "skipped_cases": comparison.skipped,
            "outputs": [
                {
                    "name": d.name,
                    "max_abs_error": d.max_abs,
                    "max_rel_error": d.max_rel,
                    "deviation_percent": d.normalized * 100,
                    "deviation_percent_by_category": {
                        k: v * 100 for k, v in d.deviation_by_category().items()
                    },
                    "reference_scale": d.scale,
                    "top1_agreement": d.top1_agreement,
                    "nonfinite_mismatches": d.nonfinite_mismatches,
                }
                for d in comparison.outputs
            ],
        },
        "performance": {
            "before": _speed(before),
            "after": _speed(after),
            "latency_ratio": round(after.latency_ms_p50 / before.latency_ms_p50, 3)
            if before.latency_ms_p50
            else None,
            "throughput_ratio": round(after.throughput_rows_s / before.throughput_rows_s, 3)
            if before.throughput_rows_s
            else None,
        },
        "size_bytes": {
            "before": size_before,
            "after": size_after,
            "ratio": round(size_after / size_before, 3) if size_before else None,
        },
        "rollout": stanza,
    }
