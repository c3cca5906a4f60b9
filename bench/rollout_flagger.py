"""A Flagger-style canary analysis, implemented from Flagger's documentation and scheduler.

What Flagger does (docs.flagger.app "How it works", the Istio progressive-delivery tutorial,
and pkg/controller/scheduler.go), with the tutorial's settings as defaults:

- every ``interval`` (1m) it first checks ``failedChecks >= threshold`` (5): if so it routes
  all traffic back to the primary ("Rolling back ... failed checks threshold reached 5");
- otherwise it runs each metric check over the last interval, against an absolute range on
  the canary alone: ``request-success-rate`` min 99 (%), ``request-duration`` max 500 (ms,
  the P99). A query that finds no canary requests is a failed check ("Halt advancement no
  values found for metric"). Any failed check: ``failedChecks += 1``, the weight is held;
  failed checks are not reset by later passes;
- all checks pass: the weight grows by ``stepWeight`` (10) up to ``maxWeight`` (50); a pass
  at ``maxWeight`` promotes the canary.

The first iteration (weight 0) runs no analysis and moves the weight to ``stepWeight``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FlaggerBaseline", "FlaggerSettings"]


@dataclass(frozen=True, slots=True)
class FlaggerSettings:
    interval_s: float = 60.0
    threshold: int = 5
    step_weight: int = 10
    max_weight: int = 50
    min_success_rate: float = 99.0
    max_p99_ms: float = 500.0


class FlaggerBaseline:
    """The baseline's state machine: ``tick`` once per interval with that interval's window."""

    def __init__(self, settings: FlaggerSettings | None = None) -> None:
        self.settings = settings or FlaggerSettings()
        self.weight = self.settings.step_weight  # percent
        self.failed_checks = 0
        self.phase = "progressing"
        self.reason = ""

    @property
    def canary_share(self) -> float:
        return {"progressing": self.weight / 100, "promoted": 1.0}.get(self.phase, 0.0)

    def tick(self, canary_requests: int, canary_errors: int, canary_latency_ms: np.ndarray) -> str:
        s = self.settings
        if self.phase != "progressing":
            return self.phase
        if self.failed_checks >= s.threshold:
            self.phase = "rolled_back"
            self.reason = f"failed checks threshold reached {self.failed_checks}"
            return self.phase
        if canary_requests == 0:
            self.failed_checks += 1
            self.reason = "Halt advancement no values found for metric request-success-rate"
            return self.phase
        success = 100.0 * (1 - canary_errors / canary_requests)
        p99 = float(np.percentile(canary_latency_ms, 99)) if canary_latency_ms.size else 0.0
        if success < s.min_success_rate or p99 > s.max_p99_ms:
            self.failed_checks += 1
            self.reason = f"Halt advancement success rate {success:.2f}% p99 {p99:.0f} ms"
            return self.phase
        if self.weight >= s.max_weight:
            self.phase = "promoted"
            self.reason = "Promotion completed"
            return self.phase
        self.weight = min(self.weight + s.step_weight, s.max_weight)
        return self.phase
