"""The clamps between an algorithm's recommendation and the replica count it is allowed.

Order, each recorded as a ``Clamp`` when it changes the count: panic (a floor, and no scale-in
while it holds), stabilization (HPA's: scale in only to the highest recommendation of the last
``stabilization_down_s`` unless the algorithm vouches for its recommendation, scale out only
to the lowest of ``stabilization_up_s``), max step,
cooldown per direction, then min/max. With the current count inside [min, max] the result is
always inside it, moves at most one step, and never moves in a direction still cooling down.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from inferway.controllers.autoscale.decision import Clamp
from inferway.controllers.autoscale.params import Limits, PanicConfig

__all__ = ["Governor"]


class Governor:
    """State of the clamps for one service: recent recommendations, cooldowns, panic."""

    def __init__(self, limits: Limits, panic: PanicConfig) -> None:
        self._limits = limits
        self._panic = panic
        self._history: deque[tuple[float, int]] = deque()
        self._last_up = -float("inf")
        self._last_change = -float("inf")
        self._panic_until = -float("inf")

    def export_state(self) -> dict[str, Any]:
        """The clamps' memory as JSON (``None`` for "never"): a new leader continues the
        same stabilization windows, cooldowns and panic."""
        return {
            "history": [[t, v] for t, v in self._history],
            "last_up": _finite(self._last_up),
            "last_change": _finite(self._last_change),
            "panic_until": _finite(self._panic_until),
        }

    def restore_state(self, data: Mapping[str, Any]) -> None:
        self._history = deque((float(t), int(v)) for t, v in data["history"])
        self._last_up = _time(data["last_up"])
        self._last_change = _time(data["last_change"])
        self._panic_until = _time(data["panic_until"])

    def in_panic(self, now: float) -> bool:
        return now < self._panic_until

    def apply(
        self,
        now: float,
        recommended: int,
        *,
        current: int,
        ready: int,
        panic_needed: int | None,
        settled: bool = False,
    ) -> tuple[int, tuple[Clamp, ...], bool]:
        """``(desired, clamps, panic)``; records the action as taken when desired != current."""
        lim = self._limits
        clamps: list[Clamp] = []
        value = recommended

        def clamp(name: str, new: int, detail: str) -> None:
            nonlocal value
            if new != value:
                clamps.append(Clamp(name, value, new, detail))
                value = new

        p = self._panic
        if p.enabled and panic_needed is not None and panic_needed >= p.threshold * max(ready, 1):
            self._panic_until = now + p.hold_s
        panic = self.in_panic(now)
        if panic and panic_needed is not None and panic_needed > value:
            clamp("panic", panic_needed, f"{p.window_s:g} s window asks for {panic_needed}")

        self._history.append((now, value))
        span = max(lim.stabilization_up_s, lim.stabilization_down_s)
        while self._history and self._history[0][0] < now - span:
            self._history.popleft()
        if value > current and not panic and lim.stabilization_up_s > 0:
            low = min(v for t, v in self._history if t >= now - lim.stabilization_up_s)
            clamp(
                "stabilization_up",
                max(current, min(value, low)),
                f"lowest recommendation of the last {lim.stabilization_up_s:g} s is {low}",
            )
        elif value < current:
            if panic:
                clamp("panic_hold", current, "no scale-in during panic")
            elif lim.stabilization_down_s > 0 and not settled:
                high = max(v for t, v in self._history if t >= now - lim.stabilization_down_s)
                clamp(
                    "stabilization_down",
                    min(current, max(value, high)),
                    f"highest recommendation of the last {lim.stabilization_down_s:g} s is {high}",
                )

        if lim.max_step_up is not None and value > current + lim.max_step_up:
            clamp("max_step_up", current + lim.max_step_up, f"at most +{lim.max_step_up}")
        if lim.max_step_down is not None and value < current - lim.max_step_down:
            clamp("max_step_down", current - lim.max_step_down, f"at most -{lim.max_step_down}")

        if value > current and now - self._last_up < lim.cooldown_up_s:
            wait = self._last_up + lim.cooldown_up_s - now
            clamp(
                "cooldown_up",
                current,
                f"last scale-out {now - self._last_up:g} s ago, "
                f"{wait:g} s of {lim.cooldown_up_s:g} s cooldown left",
            )
        if value < current and now - self._last_change < lim.cooldown_down_s:
            wait = self._last_change + lim.cooldown_down_s - now
            clamp(
                "cooldown_down",
                current,
                f"last scaling {now - self._last_change:g} s ago, "
                f"{wait:g} s of {lim.cooldown_down_s:g} s cooldown left",
            )

        if value < lim.min_replicas:
            clamp("min_replicas", lim.min_replicas, f"min_replicas is {lim.min_replicas}")
        if value > lim.max_replicas:
            clamp("max_replicas", lim.max_replicas, f"max_replicas is {lim.max_replicas}")

        if value > current:
            self._last_up = self._last_change = now
        elif value < current:
            self._last_change = now
        return value, tuple(clamps), panic


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _time(value: float | None) -> float:
    return -math.inf if value is None else float(value)
