""":class:`ControlPlane`: policies in, cache snapshots out, the last good one kept when an edit
is refused or an Envoy rejects it (the package's docstring says how)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from opentelemetry import trace

from inferway.gateway.control_plane.outcomes import (
    AppliedPolicy,
    FileProblem,
    PolicyObserver,
    PolicyRefusedError,
    Refusal,
)
from inferway.policies.errors import PolicyError, PolicyIssue
from inferway.policies.model import Policy
from inferway.resolve import IR, resolve_policy
from inferway.state import State
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from inferway.xds.hooks import XdsObserver
from inferway.xds.node_groups import GRPC_GROUP, build_group_snapshot, parse_group
from inferway.xds.policy_snapshot import resolve_and_snapshot
from inferway.xds.records import Rejection
from inferway.xds.resources import Resources
from inferway.xds.snapshot import Snapshot
from inferway.xds.translate import translate as translate_ir

__all__ = ["DEGRADED_REJECTED", "REPLICA_LOAD_SOURCE", "ROUTINE_SOURCES", "ControlPlane"]

log = logging.getLogger("inferway.gateway.control_plane")
_tracer = trace.get_tracer("inferway.gateway")

DEGRADED_REJECTED = "degraded: last edit rejected by Envoy"
REPLICA_LOAD_SOURCE = "picker: replica load"
"""A ``process: envoy`` picker's replicas' load and saturation (gateway/picker/keeper.py)."""
ROUTINE_SOURCES = frozenset({REPLICA_LOAD_SOURCE})
"""Sources whose pushes come every few seconds in normal running (a ``pick: score`` picker's
replicas' load, at most once a scrape): logged at DEBUG, not INFO."""
_KEPT_APPLIED = 8  # applied policies remembered, so a rejected one can go back to a good one


class ControlPlane:
    """Turns policies into cache snapshots, remembering good and refused: ``group`` (Envoy's)
    gets ``translate``'s resources; every proxyless gRPC group (``inferway.xds.node_groups``)
    gets its own scoped snapshot of the same IR, rebuilt with each apply."""

    def __init__(
        self,
        cache: SnapshotCache,
        *,
        group: str = "default",
        clock: Callable[[], float] = time.time,
        translate: Callable[[IR], Resources] = translate_ir,
        state: State | None = None,
    ) -> None:
        self.cache = cache
        self.group = group
        self._clock = clock
        self._translate = translate
        self._state = state or State()
        self._current: AppliedPolicy | None = None
        self._last_refused: Refusal | None = None
        self._last_rejected: Refusal | None = None
        self._applied: OrderedDict[str, tuple[AppliedPolicy, State]] = OrderedDict()
        self._refused_since_applied = False
        self._rejected_since_applied = False
        self._file_problems: dict[str, FileProblem] = {}
        self._observers: list[PolicyObserver] = []
        self.policy_gate: Callable[[Policy, str], list[PolicyIssue]] | None = None
        """Problems this deployment has with a policy that is valid on its own (a fleet's:
        gateway/fleet/fleet_policy.py); any refuses the policy like a bad edit."""
        cache.add_hook(_RejectionHook(self))
        self._ir: IR | None = None
        cache.set_group_builder(self._build_group)

    def add_observer(self, observer: PolicyObserver) -> None:
        """Attach an observer of applied and refused policies (subclass ``PolicyFollower``;
        metrics attach here, not inside the apply logic)."""
        if not isinstance(observer, PolicyObserver):
            raise TypeError(f"{observer!r} is not a PolicyObserver: subclass PolicyFollower")
        self._observers.append(observer)

    def _tell(self, event: str, call: Callable[[PolicyObserver], None]) -> None:
        for observer in self._observers:
            try:
                call(observer)
            except Exception:  # observing must never break applying
                log.exception("control plane observer %r.%s failed", observer, event)

    @property
    def state(self) -> State:
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
    def degraded(self) -> str | None:
        """``DEGRADED_REJECTED`` plus Envoy's reason while the newest pushed edit is one an
        Envoy rejected (the last good policy serves); None once a later edit applies."""
        rejected = self._last_rejected
        if rejected is None or not self._rejected_since_applied:
            return None
        return f"{DEGRADED_REJECTED}: {'; '.join(rejected.lines())}"

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

    def apply_policy(self, policy: Policy, source: str, *, state: State | None = None) -> str:
        """Make ``policy`` live with ``state`` (default: the live state); returns the snapshot
        version. Raises PolicyRefusedError (and records the refusal) when it cannot become a
        consistent snapshot. ``state`` comes from the sources that read what ``policy`` names
        (see :mod:`inferway.gateway.sources`) before this is called."""
        return self._apply(policy, self._state if state is None else state, source)

    def update_state(self, state: State, source: str) -> str | None:
        """Swap in new runtime sources and re-push the live policy with them. Refused like a
        bad edit (PolicyRefusedError; the previous state and snapshot stay) when the result
        cannot become a consistent snapshot. Before any policy is live it is only stored."""
        if self._current is None:
            self._state = state
            return None
        return self._apply(self._current.policy, state, source)

    def _apply(self, policy: Policy, state: State, source: str) -> str:
        """Traced: an "apply policy" span with "translate" and "push snapshot" children."""
        with _tracer.start_as_current_span(
            "apply policy", attributes={"inferway.policy.source": source}
        ) as span:
            version = self._apply_untraced(policy, state, source)
            span.set_attribute("inferway.snapshot.version", version)
            return version

    def _apply_untraced(self, policy: Policy, state: State, source: str) -> str:
        gated = self.policy_gate(policy, source) if self.policy_gate is not None else []
        if gated:
            refusal = self.refuse(PolicyError(gated), source)
            raise PolicyRefusedError(refusal)
        try:
            with _tracer.start_as_current_span("translate"):
                ir, snapshot = resolve_and_snapshot(
                    policy, state, source, translate=self._translate
                )
                scoped = self._scoped_snapshots(ir, snapshot)
        except Exception as exc:
            refusal = self.refuse(exc, source)
            raise PolicyRefusedError(refusal) from exc
        problems = [
            f"snapshot for node group {group!r}: {problem}"
            for group, other in scoped.items()
            for problem in other.consistent()
        ]
        if problems:
            refusal = self._record(
                source, [PolicyIssue(source, None, None, "", p) for p in problems]
            )
            raise PolicyRefusedError(refusal)
        rejection = self.cache.rejection_of(snapshot.version)
        if rejection is not None:  # pushing it again would only be rejected again
            refusal = self._record(source, [_rejection_issue(source, rejection)], rejection)
            raise PolicyRefusedError(refusal)
        with _tracer.start_as_current_span("push snapshot") as push:
            changed = self.cache.set_snapshot(snapshot, self.group)
            for group, other in scoped.items():
                if not self.cache.is_rejected(other.version):  # never re-send a NACKed one
                    self.cache.set_snapshot(other, group, alongside=snapshot.version)
            push.set_attribute("inferway.snapshot.changed", changed)
        self._state = state
        self._ir = ir
        previous = self._current
        # Re-applying what is live (a refused edit reverted) keeps its age: nothing changed.
        unchanged = previous is not None and previous.version == snapshot.version
        applied_at = previous.applied_at if unchanged and previous else self._clock()
        current = self._current = AppliedPolicy(policy, snapshot, source, applied_at)
        self._refused_since_applied = False
        self._rejected_since_applied = False
        self._applied[snapshot.version] = (self._current, state)
        self._applied.move_to_end(snapshot.version)
        good = self.cache.good_snapshot(self.group)
        for version in list(self._applied)[: max(0, len(self._applied) - _KEPT_APPLIED)]:
            if good is None or version != good.version:  # the last good one is never dropped
                del self._applied[version]
        log.log(
            logging.DEBUG if source in ROUTINE_SOURCES else logging.INFO,
            "policy from %s pushed as snapshot %s%s",
            source,
            snapshot.version,
            "" if changed else " (unchanged)",
            extra={"source": source, "snapshot": snapshot.version},
        )
        self._tell("on_applied", lambda observer: observer.on_applied(current, changed))
        return snapshot.version

    def _scoped_snapshots(self, ir: IR, default: Snapshot) -> dict[str, Snapshot]:
        """A snapshot for every gRPC and zone group the cache knows, and the all-targets one
        when the policy has targets (a group whose targets are gone gets an empty snapshot).
        A zone group whose localized IR equals ``ir`` shares ``default`` itself."""
        groups = set(self.cache.groups()) | ({GRPC_GROUP} if ir.grpc_targets else set())
        groups.discard(self.group)
        built = {
            group: build_group_snapshot(ir, group, translate=self._translate, default=default)
            for group in sorted(groups)
        }
        return {group: snapshot for group, snapshot in built.items() if snapshot is not None}

    def _build_group(self, group: str) -> Snapshot | None:
        """The cache's builder for a group seen for the first time (a node just connected)."""
        if self._ir is None:
            return None
        default = self._current.snapshot if self._current is not None else None
        return build_group_snapshot(self._ir, group, translate=self._translate, default=default)

    def refuse(self, error: BaseException, source: str | None = None) -> Refusal:
        """Record ``error`` as the last refused edit; the live policy stays as it is."""
        if isinstance(error, PolicyError) and error.issues:
            issues = list(error.issues)
            file = source or issues[0].file
        else:
            file = source or "<unknown>"
            issues = [PolicyIssue(file, None, None, "", f"{type(error).__name__}: {error}")]
        return self._record(file, issues)

    def on_envoy_rejected(self, rejection: Rejection) -> None:
        """An Envoy NACKed a snapshot this control plane pushed: refuse that edit and go back
        to the policy and state of the snapshot the cache serves instead."""
        scope = parse_group(rejection.group)
        if rejection.group != self.group and (scope.locality or scope.sse_module):
            # a zone's own rendering (or that of the Envoys with the native SSE reader): that
            # group keeps its last good one (the cache restored it); the edit stays live
            # elsewhere, and status says the group refused it
            current = self._current
            if current is not None:
                self._record(
                    current.source, [_rejection_issue(current.source, rejection)], rejection
                )
            return
        rejected = self._applied.get(rejection.version)
        if rejection.group != self.group or rejected is None:
            return  # not a snapshot this control plane pushed (or long replaced)
        source = rejected[0].source
        if self._current is not None and self._current.version != rejection.version:
            # superseded before the NACK came: the live snapshot is another one (the rejection
            # stays in the cache's records and logs, the live policy is not degraded by it)
            log.warning(
                "snapshot %s from %s, already replaced by %s, was rejected by Envoy %s: %s",
                rejection.version,
                source,
                self._current.version,
                rejection.nack.node_id,
                rejection.message,
            )
            return
        restored = self._applied.get(rejection.restored or "")
        if restored is not None:
            self._current, self._state = restored
            # gRPC clients that connect from now on get the last good policy's targets too
            self._ir = resolve_policy(self._current.policy, self._state)
        elif self._current is not None and self._current.version == rejection.version:
            self._current = None  # nothing good to go back to: nothing is live
        self._record(source, [_rejection_issue(source, rejection)], rejection)

    def _record(
        self, file: str, issues: list[PolicyIssue], rejection: Rejection | None = None
    ) -> Refusal:
        refusal = Refusal(self._clock(), file, tuple(issues), rejection)
        self._last_refused = refusal
        if rejection is not None:
            self._last_rejected = refusal
            self._rejected_since_applied = True
        self._refused_since_applied = True
        kept = f"; keeping snapshot {self.version}" if self._current else ""
        log.warning(
            "policy edit in %s refused (%d issue(s))%s",
            file,
            len(issues),
            kept,
            extra={"source": file, "issues": len(issues)},
        )
        for line in refusal.lines():
            log.warning("  %s", line)
        self._tell("on_refused", lambda observer: observer.on_refused(refusal))
        return refusal


def _rejection_issue(file: str, rejection: Rejection) -> PolicyIssue:
    nack = rejection.nack
    kind = type_urls.SHORT_NAMES.get(nack.type_url, nack.type_url)
    names = f" {', '.join(nack.resource_names)}" if nack.resource_names else ""
    restored = (
        f"; serving the last good snapshot {rejection.restored}"
        if rejection.restored
        else "; no good snapshot to go back to"
    )
    message = (
        f"Envoy {nack.node_id} rejected {kind}{names} of snapshot {rejection.version}: "
        f"{nack.message}{restored}"
    )
    return PolicyIssue(file, None, None, "", message)


class _RejectionHook(XdsObserver):
    """The cache hook that tells the control plane about rejected snapshots (a separate object
    so the cache sees only ``on_reject``)."""

    def __init__(self, plane: ControlPlane) -> None:
        self._plane = plane

    def on_reject(self, rejection: Rejection) -> None:
        self._plane.on_envoy_rejected(rejection)
