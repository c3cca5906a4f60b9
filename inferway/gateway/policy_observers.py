"""Observers of the control plane, and what they are told (:class:`AppliedPolicy`,
:class:`Refusal`) when a policy is applied or refused, so
metrics, the rollouts, the replica manager and the followers of a policy's files attach from
outside and the apply logic stays free of them.

An observer implements :class:`PolicyObserver`; subclass :class:`PolicyFollower` (both
methods no-ops) and override what you watch. :class:`ObserverList` calls them in order, and
an exception raised by one is logged and swallowed: observing must never break applying.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from inferway.policies.errors import PolicyIssue
from inferway.policies.model import Policy
from inferway.xds.records import Rejection
from inferway.xds.snapshot import Snapshot

__all__ = [
    "AppliedPolicy",
    "ObservedPlane",
    "ObserverList",
    "PolicyFollower",
    "PolicyObserver",
    "Refusal",
]

log = logging.getLogger(__name__)


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
    rejected_by_envoy: Rejection | None = None
    """Set when the edit was pushed and an Envoy NACKed it (Envoy's error, resource names)."""

    def lines(self) -> list[str]:
        return [str(issue) for issue in self.issues]


@runtime_checkable
class PolicyObserver(Protocol):
    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        """A policy is live; ``changed``: its snapshot differs from the one before."""

    def on_refused(self, refusal: Refusal) -> None:
        """A policy edit (or an Envoy's rejection of it) was refused; the last good stays."""


class ObservedPlane(Protocol):
    """Where observers attach (the control plane)."""

    def add_observer(self, observer: PolicyObserver) -> None: ...


class PolicyFollower:
    """A :class:`PolicyObserver` that ignores both events: subclass it, override what you
    watch."""

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        return None

    def on_refused(self, refusal: Refusal) -> None:
        return None


class ObserverList:
    """The attached observers, told in the order they were added."""

    def __init__(self) -> None:
        self._observers: list[PolicyObserver] = []

    def add(self, observer: PolicyObserver) -> None:
        if not isinstance(observer, PolicyObserver):
            raise TypeError(
                f"{observer!r} is not a control-plane observer: subclass "
                "inferway.gateway.policy_observers.PolicyFollower"
            )
        self._observers.append(observer)

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        self._each("on_applied", lambda observer: observer.on_applied(applied, changed))

    def on_refused(self, refusal: Refusal) -> None:
        self._each("on_refused", lambda observer: observer.on_refused(refusal))

    def _each(self, event: str, call: Callable[[PolicyObserver], None]) -> None:
        for observer in self._observers:
            try:
                call(observer)
            except Exception:  # observing must never break applying
                log.exception("control plane observer %r.%s failed", observer, event)
