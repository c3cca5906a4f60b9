"""The gateway's one piece of state: which policy is live, and which edit was last refused.

Applying a policy is translate -> snapshot -> consistency check -> cache. Anything that fails
on the way leaves the cache holding the last good snapshot: a bad edit never replaces a good
policy, it is recorded as refused so ``inferway status`` can say why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from inferway.policies.errors import PolicyError, PolicyIssue
from inferway.policies.model import Policy
from inferway.policies.resolve import Resolved, RuntimeState, resolve_policy
from inferway.xds.cache import SnapshotCache
from inferway.xds.resources import Resources
from inferway.xds.snapshot import Snapshot, build_snapshot
from inferway.xds.translate import translate_resolved

__all__ = ["AppliedPolicy", "ControlPlane", "FileProblem", "PolicyRefusedError", "Refusal"]

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("inferway.gateway")


@dataclass(frozen=True)
class AppliedPolicy:
    policy: Policy
    snapshot: Snapshot
    source: str
    applied_at: float

    @property
    def version(self) -> str:
        return self.snapshot.version


@dataclass(frozen=True)
class Refusal:
    """An edit that was not applied: when, from which file, and every located issue."""

    at: float
    file: str
    issues: tuple[PolicyIssue, ...]

    def lines(self) -> list[str]:
        return [str(issue) for issue in self.issues]


@dataclass(frozen=True)
class FileProblem:
    """A watched file (the policy, the endpoints file) that cannot be read now: the live
    policy keeps serving, and ``status`` says so until the file is readable again."""

    file: str
    kind: str
    message: str
    since: float


class PolicyRefusedError(Exception):
    """A policy that loaded but could not become a snapshot (translation or consistency)."""

    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal
        super().__init__("\n".join(refusal.lines()))


class ControlPlane:
    """Turns policies into cache snapshots for one node group, remembering good and refused."""

    def __init__(
        self,
        cache: SnapshotCache,
        *,
        group: str = "default",
        clock: Callable[[], float] = time.time,
        translate: Callable[[Resolved], Resources] = translate_resolved,
        state: RuntimeState | None = None,
    ) -> None:
        self.cache = cache
        self.group = group
        self._clock = clock
        self._translate = translate
        self._state = state or RuntimeState()
        self._current: AppliedPolicy | None = None
        self._last_refused: Refusal | None = None
        self._refused_since_applied = False
        self._file_problems: dict[str, FileProblem] = {}
        self._observers: list[Any] = []
        self._state_sources: list[Callable[[Policy, RuntimeState], RuntimeState]] = []

    def add_observer(self, observer: Any) -> None:
        """Attach an object with ``on_applied(AppliedPolicy, changed)`` and/or
        ``on_refused(Refusal)`` (metrics attach here, not inside the apply logic)."""
        self._observers.append(observer)

    def add_state_source(self, source: Callable[[Policy, RuntimeState], RuntimeState]) -> None:
        """Attach a runtime source that must see each policy before it is applied (e.g. the
        certificate files it names): ``source(policy, state)`` returns the state to apply with,
        or raises PolicyError, which refuses the edit."""
        self._state_sources.append(source)

    def _notify(self, method: str, *args: Any) -> None:
        for observer in self._observers:
            handler = getattr(observer, method, None)
            if handler is None:
                continue
            try:
                handler(*args)
            except Exception:  # observing must never break applying
                log.exception("control plane observer %r.%s failed", observer, method)

    @property
    def state(self) -> RuntimeState:
        """The runtime sources (endpoints file, certificates) the live snapshot was built with."""
        return self._state

    @property
    def current(self) -> AppliedPolicy | None:
        return self._current

    @property
    def policy(self) -> Policy | None:
        return self._current.policy if self._current else None

    @property
    def version(self) -> str | None:
        return self._current.version if self._current else None

    @property
    def applied_at(self) -> float | None:
        return self._current.applied_at if self._current else None

    @property
    def source(self) -> str | None:
        return self._current.source if self._current else None

    @property
    def last_refused(self) -> Refusal | None:
        return self._last_refused

    @property
    def refusal_pending(self) -> bool:
        """True when the newest edit was refused (the live policy is older than it)."""
        return self._last_refused is not None and self._refused_since_applied

    @property
    def file_problems(self) -> list[FileProblem]:
        return [self._file_problems[file] for file in sorted(self._file_problems)]

    def set_file_problem(self, file: str, kind: str, message: str | None) -> None:
        """Record (``message``) or clear (None) why watched ``file`` cannot be read."""
        if message is None:
            self._file_problems.pop(file, None)
            return
        known = self._file_problems.get(file)
        if known is None or known.message != message:
            since = self._clock() if known is None else known.since
            self._file_problems[file] = FileProblem(file, kind, message, since)

    def apply_policy(self, policy: Policy, source: str) -> str:
        """Make ``policy`` live; returns the snapshot version. Raises PolicyRefusedError (and
        records the refusal) when it cannot become a consistent snapshot."""
        return self._apply(policy, self._state, source)

    def update_state(self, state: RuntimeState, source: str) -> str | None:
        """Swap in new runtime sources and re-push the live policy with them. Refused like a
        bad edit (PolicyRefusedError; the previous state and snapshot stay) when the result
        cannot become a consistent snapshot. Before any policy is live it is only stored."""
        if self._current is None:
            self._state = state
            return None
        return self._apply(self._current.policy, state, source)

    def _apply(self, policy: Policy, state: RuntimeState, source: str) -> str:
        """Traced: an "apply policy" span with "translate" and "push snapshot" children."""
        with _tracer.start_as_current_span(
            "apply policy", attributes={"inferway.policy.source": source}
        ) as span:
            version = self._apply_untraced(policy, state, source)
            span.set_attribute("inferway.snapshot.version", version)
            return version

    def _apply_untraced(self, policy: Policy, state: RuntimeState, source: str) -> str:
        try:
            with _tracer.start_as_current_span("translate"):
                for state_source in self._state_sources:
                    state = state_source(policy, state)
                snapshot = build_snapshot(self._translate(resolve_policy(policy, state)))
        except Exception as exc:
            refusal = self.refuse(exc, source)
            raise PolicyRefusedError(refusal) from exc
        problems = snapshot.consistent()
        if problems:
            refusal = self._record(
                source, [PolicyIssue(source, None, None, "", p) for p in problems]
            )
            raise PolicyRefusedError(refusal)
        with _tracer.start_as_current_span("push snapshot") as push:
            changed = self.cache.set_snapshot(snapshot, self.group)
            push.set_attribute("inferway.snapshot.changed", changed)
        self._state = state
        previous = self._current
        # Re-applying what is live (a refused edit reverted) keeps its age: nothing changed.
        unchanged = previous is not None and previous.version == snapshot.version
        applied_at = previous.applied_at if unchanged and previous else self._clock()
        self._current = AppliedPolicy(policy, snapshot, source, applied_at)
        self._refused_since_applied = False
        log.info(
            "policy from %s applied as snapshot %s%s",
            source,
            snapshot.version,
            "" if changed else " (unchanged)",
        )
        self._notify("on_applied", self._current, changed)
        return snapshot.version

    def refuse(self, error: BaseException, source: str | None = None) -> Refusal:
        """Record ``error`` as the last refused edit; the live policy stays as it is."""
        if isinstance(error, PolicyError) and error.issues:
            issues = list(error.issues)
            file = source or issues[0].file
        else:
            file = source or "<unknown>"
            issues = [PolicyIssue(file, None, None, "", f"{type(error).__name__}: {error}")]
        return self._record(file, issues)

    def _record(self, file: str, issues: list[PolicyIssue]) -> Refusal:
        refusal = Refusal(self._clock(), file, tuple(issues))
        self._last_refused = refusal
        self._refused_since_applied = True
        kept = f"; keeping snapshot {self.version}" if self._current else ""
        log.warning("policy edit in %s refused (%d issue(s))%s", file, len(issues), kept)
        for line in refusal.lines():
            log.warning("  %s", line)
        self._notify("on_refused", refusal)
        return refusal
