"""The rollout driver: the async shell that ticks each rollout's pure controller once per
analysis interval, writes the canary's weight into State, and persists what it decided.

It plugs into the gateway twice, as the architecture says controllers do: as a StateSource
(``resolve_state``: the weight overrides of the policy's rollouts, read before every apply,
so a policy edit keeps the rollout's weights and a removed rollout drops its own) and as a
control-plane observer (``on_applied``: the live policy's rollouts get controllers, resumed
from ``<workdir>/rollouts/<name>.json``). Weights reach Envoy through the sink's
``update_state``; the policy file is never written. The canary and stable always add up to
100% (1000 permille on the wire), so the total Envoy sees never changes while weights move.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from inferway.controllers.rollout.config import RolloutConfig
from inferway.controllers.rollout.controller import RolloutController
from inferway.controllers.rollout.evidence import WindowSample
from inferway.controllers.rollout.state import (
    STEPS_TAKEN,
    TERMINAL,
    Action,
    Decision,
    Phase,
    RolloutState,
    RolloutStateError,
)
from inferway.gateway.admin_documents import RolloutStatus
from inferway.gateway.control_plane import AppliedPolicy, PolicyFollower, PolicyRefusedError
from inferway.gateway.loop_configs import compile_loops
from inferway.gateway.rollouts.envoy_stats import ScrapeError
from inferway.gateway.rollouts.schedule import next_tick
from inferway.gateway.rollouts.status_document import rollout_status
from inferway.gateway.rollouts.store import RolloutStateStore
from inferway.gateway.rollouts.targets import (
    build_weights,
    rollout_target,
    same_target,
)
from inferway.gateway.rollouts.webhooks import call_webhook
from inferway.gateway.sources import StateSink
from inferway.policies.model import Policy
from inferway.policies.rollouts import Rollout
from inferway.state import State

__all__ = [
    "MetricSource",
    "RolloutDriver",
    "UnknownRolloutError",
    "build_weights",
]

log = logging.getLogger(__name__)


class MetricSource(Protocol):
    """Where a rollout's windows come from: the window since the last call (None: no window
    yet), or ScrapeError saying why there is none."""

    async def sample(self) -> WindowSample | None: ...


class UnknownRolloutError(KeyError):
    """A command or status for a rollout the live policy does not have."""


SourceFactory = Callable[[RolloutConfig], MetricSource]
DecisionHook = Callable[[str, Decision], None]


@dataclass
class _Entry:
    spec: Rollout
    controller: RolloutController
    source: MetricSource
    task: asyncio.Task[None] | None = None
    pending: WindowSample | None = None
    """A window held back while a pre-step gate refused: added to the next one."""
    gate: dict[str, Any] | None = None
    """The last refusal of a pre-step gate (cleared when the step happens)."""


class RolloutDriver(PolicyFollower):
    """All rollouts of the live policy. ``sink`` is the control plane (its ``state`` and
    ``update_state``); ``clock`` is wall time, since decisions are persisted and resumed."""

    def __init__(
        self,
        sink: StateSink,
        store: RolloutStateStore,
        make_source: SourceFactory,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sink = sink
        self.store = store
        self._make_source = make_source
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._owned: set[str] = set()  # routes whose override this driver wrote
        self._hooks: list[DecisionHook] = []
        self._running = False
        self._notifications: set[asyncio.Task[None]] = set()

    def add_hook(self, hook: DecisionHook) -> None:
        """``hook(rollout, decision)`` for every decision (metrics, webhooks)."""
        self._hooks.append(hook)

    # ---- StateSource and observer ------------------------------------------------------

    def _state_for(self, spec: Rollout, config: RolloutConfig) -> RolloutState | None:
        """The state ``spec`` resumes from (None: it starts over); reads, never changes."""
        entry = self._entries.get(spec.name)
        if entry is not None:  # a new route or pair is a new rollout: start over
            return entry.controller.state if same_target(entry.spec, spec) else None
        return self._state_for_stored(spec, config)

    def _state_for_stored(self, spec: Rollout, config: RolloutConfig) -> RolloutState | None:
        try:
            saved = self.store.load(spec.name)
        except RolloutStateError as exc:
            log.warning("rollout %s: saved state not used: %s", spec.name, exc)
            return None
        if saved is None:
            return None
        target, state = saved
        if target != rollout_target(spec):
            log.info("rollout %s: saved for %s, now %s: starting over", spec.name, target,
                     rollout_target(spec))  # fmt: skip
            return None
        try:  # e.g. fewer steps now than the saved step
            RolloutController(config, state)
        except RolloutStateError as exc:
            log.warning("rollout %s: saved state does not fit the policy, starting over: %s",
                        spec.name, exc)  # fmt: skip
            return None
        return state

    def resolve_state(self, policy: Policy, state: State) -> State:
        """``state`` with this driver's weight overrides for ``policy``'s rollouts (and none
        for routes whose rollout is gone). A pure read: ``policy`` may be an edit that is
        then refused, so what this driver owns changes only when a policy is applied."""
        weights = {k: v for k, v in state.weights.items() if k not in self._owned}
        routes = {r.name: r for r in policy.routes}
        configs = compile_loops(policy).rollouts
        for spec in policy.rollouts:
            saved = self._state_for(spec, configs[spec.name])
            route = routes.get(spec.route)
            override = None if saved is None or route is None else build_weights(spec, saved)
            if override is not None:
                weights[spec.route] = override
        if weights == dict(state.weights):
            return state
        return replace(state, weights=weights)

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        self._owned = {spec.route for spec in applied.policy.rollouts}
        self._reconcile(applied.policy)

    def _reconcile(self, policy: Policy) -> None:
        configs = compile_loops(policy).rollouts
        wanted = {spec.name: spec for spec in policy.rollouts}
        for name in list(self._entries):
            if name not in wanted:
                self._cancel(self._entries.pop(name))
                log.info("rollout %s: removed from the policy; its weights are dropped", name)
        for name, spec in wanted.items():
            entry = self._entries.get(name)
            if entry is not None and entry.spec == spec:
                continue
            config = configs[name]
            saved = self._state_for(spec, config)
            try:
                controller = RolloutController(config, saved)
            except RolloutStateError as exc:  # the live one, against an edited policy
                log.warning("rollout %s: its state does not fit the edit, starting over: %s",
                            name, exc)  # fmt: skip
                controller = RolloutController(config)
            if entry is not None:
                self._cancel(entry)
            self._entries[name] = _Entry(spec, controller, self._make_source(config))
            if self._running:
                self._launch(self._entries[name])

    def adopt(self, name: str) -> None:
        """The leader wrote ``name``'s state to the fleet's store: serve it. A replica that
        does not lead runs no loop, so what it serves is always what the leader decided."""
        entry = self._entries.get(name)
        if entry is None or self._running:
            return
        saved = self._state_for_stored(entry.spec, entry.controller.config)
        if saved is not None:
            entry.controller = RolloutController(entry.controller.config, saved)
            self._push(name)

    # ---- the loop ----------------------------------------------------------------------

    async def start(self) -> None:
        self._running = True
        for entry in self._entries.values():
            self._launch(entry)

    async def stop(self) -> None:
        self._running = False
        for entry in self._entries.values():
            self._cancel(entry)
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        for task in self._notifications:
            task.cancel()
        tasks += list(self._notifications)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _launch(self, entry: _Entry) -> None:
        entry.task = asyncio.get_running_loop().create_task(
            self._run(entry), name=f"rollout {entry.spec.name}"
        )

    @staticmethod
    def _cancel(entry: _Entry) -> None:
        if entry.task is not None:
            entry.task.cancel()

    async def _run(self, entry: _Entry) -> None:
        """Tick on a fixed schedule of the clock (every interval from the first tick), not
        an interval after each tick ends: a slow scrape or webhook does not make the windows
        drift; a tick that overran whole intervals skips them."""
        interval = entry.controller.config.analysis.interval_s
        due = self._clock()
        while True:
            try:
                await self.tick(entry.spec.name)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad tick must not end the rollout's loop
                log.exception("rollout %s: tick failed", entry.spec.name)
            due, delay = next_tick(due, self._clock(), interval)
            await asyncio.sleep(delay)

    async def tick(self, name: str) -> Decision | None:
        """One analysis interval of ``name`` now (the loop calls it; tests may too). Nothing
        happens once the rollout has ended (promoted, rolled back, failed)."""
        entry = self._entry(name)
        sample: WindowSample | None = None
        error: str | None = None
        try:
            sample = await entry.source.sample()
        except ScrapeError as exc:
            error = str(exc)
        if self._entries.get(name) is not entry:
            return None  # replaced by a policy edit while scraping
        phase = entry.controller.state.phase
        if phase in TERMINAL or phase == Phase.FAILED:
            return None
        if sample is not None and entry.pending is not None:
            sample = entry.pending.plus(sample)
        now = self._clock()
        if not await self._gates_open(entry, now, sample, error):
            return None
        entry.pending, entry.gate = None, None
        decision = entry.controller.tick(now, sample, source_error=error)
        self._after(entry, decision)
        return decision

    async def _gates_open(
        self, entry: _Entry, now: float, sample: WindowSample | None, error: str | None
    ) -> bool:
        """Ask the pre-step hooks when this tick would take a step (found by ticking a copy:
        the controller is pure, so the real tick decides the same)."""
        gates = [h for h in entry.spec.webhooks if h.type == "pre-step"]
        if not gates:
            return True
        probe = RolloutController(entry.controller.config, copy.deepcopy(entry.controller.state))
        would = probe.tick(now, sample, source_error=error)
        if would.action not in STEPS_TAKEN:
            return True
        payload = {"event": "pre-step", "rollout": entry.spec.name, "decision": would.to_json()}
        for hook in gates:
            refused = await call_webhook(hook, payload)
            if self._entries.get(entry.spec.name) is not entry:
                return False
            if refused is not None:
                if sample is not None:  # it already holds the earlier pending window
                    entry.pending = sample
                would_do = would.action.value
                entry.gate = {"at": now, "url": hook.url, "reason": refused, "would": would_do}
                log.info("rollout %s: step held by its pre-step gate: %s", entry.spec.name, refused)
                return False
        return True

    # ---- commands and status -----------------------------------------------------------

    def command(self, name: str, command: str) -> Decision:
        """A person's command; RolloutCommandError when the phase does not allow it."""
        entry = self._entry(name)
        decision = entry.controller.command(self._clock(), command)
        self._after(entry, decision)
        return decision

    def names(self) -> list[str]:
        return sorted(self._entries)

    def status(self, name: str, *, history: int = 20) -> RolloutStatus:
        """``GET /rollouts/{name}`` (``admin_documents.RolloutStatus``)."""
        entry = self._entry(name)
        return rollout_status(name, entry.spec.route, entry.controller, entry.gate, history)

    def _entry(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownRolloutError(name)
        return entry

    # ---- after every decision ----------------------------------------------------------

    def _after(self, entry: _Entry, decision: Decision) -> None:
        name = entry.spec.name
        self.store.save(rollout_target(entry.spec), entry.controller.state)
        self._push(name)
        level = logging.DEBUG if decision.action == Action.HOLD else logging.INFO
        event = {"event": "rollout_decision", "rollout": name, **decision.to_json()}
        # The line carries the numbers (counts, verdict per check); the record all of it.
        summary = {
            k: event[k]
            for k in ("rollout", "action", "phase", "step", "weight", "result", "window")
        }
        summary["verdicts"] = {v.check: v.result for v in decision.verdicts}
        log.log(level, "rollout %s: %s: %s %s", name, decision.action, decision.reason,
                json.dumps(summary, sort_keys=True),
                extra={"rollout_event": json.dumps(event, sort_keys=True)})  # fmt: skip
        for hook in self._hooks:
            try:
                hook(name, decision)
            except Exception:
                log.exception("rollout %s: decision hook %r failed", name, hook)
        kind = _NOTIFIES.get(decision.action)
        for webhook in entry.spec.webhooks:
            if webhook.type == kind:
                payload = {"event": kind, "rollout": name, "decision": decision.to_json()}
                self._notify(call_webhook(webhook, payload))

    def _notify(self, call: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(call)
        except RuntimeError:  # no loop (a command from sync code): nothing to run it on
            call.close()
            return
        self._notifications.add(task)
        task.add_done_callback(self._notifications.discard)

    def _push(self, name: str) -> None:
        policy, state = self._sink.policy, self._sink.state
        if policy is None:
            return
        new = self.resolve_state(policy, state)
        if new is state:
            return
        try:
            self._sink.update_state(new, f"rollout {name}")
        except PolicyRefusedError as exc:
            log.error("rollout %s: weight change refused: %s", name, exc)


_NOTIFIES = {Action.PROMOTE: "post-rollout", Action.ROLLBACK: "rollback", Action.ABORT: "rollback"}
"""The webhook type each ending decision calls."""
