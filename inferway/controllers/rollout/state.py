"""The rollout's persistent record: phase, step, weight, evidence and decision history.

Plain data with a JSON form, so the gateway can write it atomically to the workdir and a
restarted control plane resumes at the same step with the same evidence (issue 13, item 5).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from inferway.controllers.rollout.analysis import Verdict
from inferway.controllers.rollout.evidence import Evidence

__all__ = [
    "STATE_VERSION",
    "STEPS_TAKEN",
    "Action",
    "Decision",
    "Phase",
    "RolloutState",
    "RolloutStateError",
]

STATE_VERSION = 1


class RolloutStateError(ValueError):
    """A persisted rollout state that cannot be read back; names the field."""


class Phase(StrEnum):
    WAITING = "waiting"  # defined, not started: canary at 0
    PROGRESSING = "progressing"  # holding a step while the analysis decides
    PAUSED = "paused"  # held by a person or by an unreachable metric source
    PROMOTED = "promoted"  # canary at 100%
    ROLLED_BACK = "rolled_back"  # stable at 100%
    FAILED = "failed"  # a check failed with on_failure: pause; weight held for a person


TERMINAL = frozenset({Phase.PROMOTED, Phase.ROLLED_BACK})


class Action(StrEnum):
    """What a decision did (a ``str``: logs, metrics labels and saved state read the same)."""

    START = "start"  # step 0, from waiting or by a restart
    HOLD = "hold"  # stay at this step (the analysis needs more, or a gate is closed)
    ADVANCE = "advance"  # to the next step
    PROMOTE = "promote"  # canary at 100%
    ROLLBACK = "rollback"  # a check failed: stable at 100%
    FAIL = "fail"  # a check failed with on_failure: pause
    PAUSE = "pause"  # by a person or an unreachable metric source
    RESUME = "resume"  # by a person
    ABORT = "abort"  # by a person: stable at 100%


STEPS_TAKEN = frozenset({Action.START, Action.ADVANCE, Action.PROMOTE})
"""Decisions that move the canary's weight up (what a pre-step gate must allow)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What the controller did at one tick or command, and why, with the verdicts behind it."""

    at: float
    run: int
    action: Action
    phase: str
    step: int
    weight: int  # canary parts of TOTAL_WEIGHT
    reason: str
    result: str | None = None  # combined analysis result, when an analysis ran
    need_more: int = 0
    window: dict[str, int] = field(default_factory=dict)
    verdicts: tuple[Verdict, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "run": self.run,
            "action": self.action.value,
            "phase": self.phase,
            "step": self.step,
            "weight": self.weight,
            "reason": self.reason,
            "result": self.result,
            "need_more": self.need_more,
            "window": dict(self.window),
            "verdicts": [v.to_json() for v in self.verdicts],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        return cls(
            at=float(data["at"]),
            run=int(data["run"]),
            action=Action(data["action"]),
            phase=str(data["phase"]),
            step=int(data["step"]),
            weight=int(data["weight"]),
            reason=str(data["reason"]),
            result=data["result"],
            need_more=int(data["need_more"]),
            window={str(k): int(v) for k, v in data["window"].items()},
            verdicts=tuple(Verdict.from_json(v) for v in data["verdicts"]),
        )


@dataclass(slots=True)
class RolloutState:
    """Everything the controller needs to resume. ``run`` counts restarts; ``failed_in_run``
    makes "never promote after a failed check" a fact of the data, not of the code path."""

    name: str
    phase: Phase = Phase.WAITING
    step: int = 0
    weight: int = 0
    run: int = 0
    run_started_at: float | None = None
    step_started_at: float | None = None
    paused_by: str | None = None  # "user" | "source"
    reason: str = ""
    failed_in_run: bool = False
    evidence: Evidence = field(default_factory=Evidence)
    looks: dict[str, int] = field(default_factory=dict)
    history: list[Decision] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": STATE_VERSION,
                "name": self.name,
                "phase": self.phase.value,
                "step": self.step,
                "weight": self.weight,
                "run": self.run,
                "run_started_at": self.run_started_at,
                "step_started_at": self.step_started_at,
                "paused_by": self.paused_by,
                "reason": self.reason,
                "failed_in_run": self.failed_in_run,
                "evidence": self.evidence.to_json(),
                "looks": dict(self.looks),
                "history": [d.to_json() for d in self.history],
            },
            sort_keys=True,
            allow_nan=False,
        )

    @classmethod
    def from_json(cls, text: str) -> RolloutState:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RolloutStateError(f"rollout state: not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise RolloutStateError("rollout state: expected a JSON object")
        name = data.get("name", "?")
        if data.get("version") != STATE_VERSION:
            raise RolloutStateError(
                f"rollout state {name!r}: version {data.get('version')!r}, "
                f"this build reads {STATE_VERSION}"
            )
        key = "?"
        try:
            key = "phase"
            phase = Phase(data["phase"])
            key = "evidence"
            evidence = Evidence.from_json(data["evidence"])
            key = "history"
            history = [Decision.from_json(d) for d in data["history"]]
            key = "fields"
            return cls(
                name=str(data["name"]),
                phase=phase,
                step=int(data["step"]),
                weight=int(data["weight"]),
                run=int(data["run"]),
                run_started_at=_opt_float(data["run_started_at"]),
                step_started_at=_opt_float(data["step_started_at"]),
                paused_by=data["paused_by"],
                reason=str(data["reason"]),
                failed_in_run=bool(data["failed_in_run"]),
                evidence=evidence,
                looks={str(k): int(v) for k, v in data["looks"].items()},
                history=history,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RolloutStateError(f"rollout state {name!r}: {key}: {exc!r}") from exc


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)
