"""What applying a policy comes to, as the control plane tells it: the policy now live
(:class:`AppliedPolicy`), an edit refused (:class:`Refusal`, raised as
:class:`PolicyRefusedError` when a start cannot apply it), a watched file that cannot be read
(:class:`FileProblem`), and who listens for them (:class:`PolicyObserver`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from inferway.policies.errors import PolicyIssue
from inferway.policies.model import Policy
from inferway.xds.records import Rejection
from inferway.xds.snapshot import Snapshot

__all__ = [
    "AppliedPolicy",
    "FileProblem",
    "PolicyFollower",
    "PolicyObserver",
    "PolicyRefusedError",
    "Refusal",
]


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


@runtime_checkable
class PolicyObserver(Protocol):
    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        """A policy is live; ``changed``: its snapshot differs from the one before."""

    def on_refused(self, refusal: Refusal) -> None:
        """A policy edit (or an Envoy's rejection of it) was refused; the last good stays."""


class PolicyFollower:
    """A :class:`PolicyObserver` that ignores both events: subclass it, override what you
    watch."""

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        return None

    def on_refused(self, refusal: Refusal) -> None:
        return None
