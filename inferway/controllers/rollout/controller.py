"""The rollout state machine: verdicts and commands in, the canary's weight and a Decision out.

Pure: no I/O, no clock of its own (every call takes ``now``), no asyncio. The caller ticks it
once per analysis interval with the window's counts, writes ``weight`` into State as an
override, and persists ``state.to_json()``.

Rules that hold by construction (and are property-tested):

- steps are taken one at a time, in order; a step is held at least one interval (and its
  pause) and left only on a ``pass`` of the whole run's evidence;
- a ``fail`` ends the run's automatic progress for good (rollback, or hold with
  ``on_failure: pause``); only a person's ``promote`` or ``restart`` moves on;
- ``abort`` always ends at 100% stable; paused still rolls back on a failure (pausing stops
  progress, not protection); an unreachable metric source pauses (never promotes blind) and
  the next window with data resumes.
"""

from __future__ import annotations

from typing import Literal

from inferway.controllers.rollout.analysis import Analysis, analyze
from inferway.controllers.rollout.config import TOTAL_WEIGHT, RolloutConfig
from inferway.controllers.rollout.evidence import Evidence, WindowSample
from inferway.controllers.rollout.state import (
    TERMINAL,
    Action,
    Decision,
    Phase,
    RolloutState,
    RolloutStateError,
)

__all__ = ["Command", "RolloutCommandError", "RolloutController"]

Command = Literal["promote", "abort", "pause", "resume", "restart"]
COMMANDS: tuple[str, ...] = ("promote", "abort", "pause", "resume", "restart")


class RolloutCommandError(ValueError):
    """A command the rollout's phase does not allow; says which and why."""


class RolloutController:
    """One rollout's decisions. ``state`` is the only thing to persist."""

    def __init__(self, config: RolloutConfig, state: RolloutState | None = None) -> None:
        self.config = config
        self._parts = config.step_parts
        self.state = state if state is not None else RolloutState(name=config.name)
        self._check_state()

    def _check_state(self) -> None:
        s = self.state
        where = f"rollout state {s.name!r}"
        if s.name != self.config.name:
            raise RolloutStateError(
                f"{where}: belongs to another rollout than {self.config.name!r}"
            )
        if not 0 <= s.step < len(self._parts):
            raise RolloutStateError(f"{where}: step {s.step} outside the {len(self._parts)} steps")
        if not 0 <= s.weight <= TOTAL_WEIGHT:
            raise RolloutStateError(f"{where}: weight {s.weight} outside 0..{TOTAL_WEIGHT}")

    @property
    def weight(self) -> int:
        """The canary's desired weight in parts of ``TOTAL_WEIGHT`` (stable gets the rest)."""
        return self.state.weight

    # ---- ticks -------------------------------------------------------------------------

    def tick(
        self, now: float, sample: WindowSample | None = None, *, source_error: str | None = None
    ) -> Decision:
        """One analysis interval: ``sample`` is the window's counts, ``source_error`` why
        there are none (an unreachable metric source). The first tick starts the rollout;
        its window, if any, predates the canary's first weight and is not counted."""
        s = self.state
        window = _window(sample)
        if s.phase == Phase.WAITING:
            return self._start(now, "started")
        if s.phase in TERMINAL or s.phase == Phase.FAILED:
            return self._record(now, Action.HOLD, f"{s.phase.value}: {s.reason}", window=window)
        if source_error is not None:
            if not (s.phase == Phase.PAUSED and s.paused_by == "user"):
                s.phase, s.paused_by = Phase.PAUSED, "source"
            s.reason = f"metric source unavailable: {source_error}"
            return self._record(now, Action.PAUSE, s.reason, window=window)
        if sample is None:
            return self._record(now, Action.HOLD, "no window to analyse", window=window)
        if s.phase == Phase.PAUSED and s.paused_by == "source":
            s.phase, s.paused_by = Phase.PROGRESSING, None
        s.evidence.add(sample)
        analysis = analyze(self.config.analysis, s.evidence, s.looks)
        s.looks = dict(analysis.looks)
        if analysis.result == "fail":
            return self._fail(now, analysis, window)
        if s.phase == Phase.PAUSED:
            return self._record(now, Action.HOLD, f"paused: {s.reason}", analysis, window)
        if analysis.result == "need_more":
            return self._record(now, Action.HOLD, analysis.reason, analysis, window)
        hold_until = self._hold_until()
        if now < hold_until:
            reason = f"checks pass; step {s.step} held until t={hold_until:g}"
            return self._record(now, Action.HOLD, reason, analysis, window)
        return self._advance(now, analysis, window)

    def _hold_until(self) -> float:
        s = self.state
        step = self.config.steps[s.step]
        started = s.step_started_at if s.step_started_at is not None else 0.0
        return started + max(self.config.analysis.interval_s, step.pause_s)

    def _start(self, now: float, reason: str) -> Decision:
        s = self.state
        s.phase, s.step, s.paused_by = Phase.PROGRESSING, 0, None
        s.run_started_at = s.step_started_at = now
        s.evidence, s.looks, s.failed_in_run = Evidence(), {}, False
        s.weight = self._parts[0]
        s.reason = reason
        if s.weight == TOTAL_WEIGHT:
            return self._promote(now, "the only step is 100%")
        return self._record(now, Action.START, f"{reason}: step 0 at {_pct(s.weight)}")

    def _advance(self, now: float, analysis: Analysis, window: dict[str, int]) -> Decision:
        s = self.state
        assert not s.failed_in_run  # a failed run never reaches here: _fail left PROGRESSING
        nxt = s.step + 1
        if nxt >= len(self._parts) or self._parts[nxt] == TOTAL_WEIGHT:
            if nxt < len(self._parts):
                s.step = nxt
            return self._promote(now, f"step passed: {analysis.reason}", analysis, window)
        s.step, s.weight, s.step_started_at = nxt, self._parts[nxt], now
        s.evidence.step_canary_requests = 0
        s.reason = f"step {nxt - 1} passed"
        return self._record(
            now, Action.ADVANCE, f"advanced to step {nxt} at {_pct(s.weight)}", analysis, window
        )

    def _promote(
        self,
        now: float,
        reason: str,
        analysis: Analysis | None = None,
        window: dict[str, int] | None = None,
    ) -> Decision:
        s = self.state
        s.phase, s.weight, s.paused_by, s.reason = Phase.PROMOTED, TOTAL_WEIGHT, None, reason
        return self._record(now, Action.PROMOTE, reason, analysis, window or {})

    def _fail(self, now: float, analysis: Analysis, window: dict[str, int]) -> Decision:
        s = self.state
        s.failed_in_run = True
        s.paused_by = None
        if self.config.on_failure == "rollback":
            s.phase, s.weight = Phase.ROLLED_BACK, 0
            s.reason = f"check failed: {analysis.reason}"
            return self._record(now, Action.ROLLBACK, s.reason, analysis, window)
        s.phase = Phase.FAILED
        s.reason = f"check failed (on_failure: pause, weight held): {analysis.reason}"
        return self._record(now, Action.FAIL, s.reason, analysis, window)

    # ---- commands ----------------------------------------------------------------------

    def command(self, now: float, command: str) -> Decision:
        """A person's command; refused with a reason where the phase does not allow it."""
        s = self.state
        if command not in COMMANDS:
            raise RolloutCommandError(
                f"rollout {s.name!r}: unknown command {command!r}; expected one of "
                f"{', '.join(COMMANDS)}"
            )
        refused = f"rollout {s.name!r}: cannot {command} while {s.phase.value}"
        if command == "abort":
            s.phase, s.weight, s.paused_by = Phase.ROLLED_BACK, 0, None
            s.reason = "aborted by command"
            return self._record(now, Action.ABORT, s.reason)
        if command == "restart":
            s.run += 1
            return self._start(now, f"restarted by command (run {s.run})")
        if command == "promote":
            if s.phase in TERMINAL:
                raise RolloutCommandError(f"{refused}; restart it first")
            return self._promote(now, "promoted by command")
        if command == "pause":
            if s.phase not in (Phase.PROGRESSING, Phase.PAUSED):
                raise RolloutCommandError(refused)
            s.phase, s.paused_by, s.reason = Phase.PAUSED, "user", "paused by command"
            return self._record(now, Action.PAUSE, s.reason)
        if s.phase != Phase.PAUSED:  # resume
            hint = (
                "; a failed check needs promote, abort or restart"
                if s.phase == Phase.FAILED
                else ""
            )
            raise RolloutCommandError(refused + hint)
        s.phase, s.paused_by, s.reason = Phase.PROGRESSING, None, "resumed by command"
        return self._record(now, Action.RESUME, s.reason)

    # ---- records -----------------------------------------------------------------------

    def _record(
        self,
        now: float,
        action: Action,
        reason: str,
        analysis: Analysis | None = None,
        window: dict[str, int] | None = None,
    ) -> Decision:
        s = self.state
        decision = Decision(
            at=now,
            run=s.run,
            action=action,
            phase=s.phase.value,
            step=s.step,
            weight=s.weight,
            reason=reason,
            result=analysis.result if analysis else None,
            need_more=analysis.need_more if analysis else 0,
            window=window or {},
            verdicts=analysis.verdicts if analysis else (),
        )
        s.history.append(decision)
        del s.history[: max(0, len(s.history) - self.config.history_size)]
        return decision


def _window(sample: WindowSample | None) -> dict[str, int]:
    if sample is None:
        return {}
    return {
        "canary_requests": sample.canary.requests,
        "canary_errors": sample.canary.errors,
        "stable_requests": sample.stable.requests,
        "stable_errors": sample.stable.errors,
    }


def _pct(parts: int) -> str:
    return f"{parts * 100 / TOTAL_WEIGHT:g}%"
