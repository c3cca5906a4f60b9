"""The incremental (delta) xDS protocol for one ADS stream, as pure code.

``DeltaState`` is ``SotwState``'s sibling: it turns (request, current snapshot) and (snapshot
changed) into the responses to send and the ACKs/NACKs seen, and holds no sockets, clock or
cache. Where SotW re-sends every subscribed resource of a type whenever any of them changes,
delta sends only what the client does not have yet. Rules (xDS protocol, "Incremental xDS"):

- each resource is versioned on its own (content hash of that resource); the stream remembers
  which version of each resource it sent (or the client said it had, in
  ``initial_resource_versions`` on reconnect) and sends a resource only when that differs;
- resources the client has that are gone (deleted, or no longer wildcard-matched) go out in
  ``removed_resources``; an unsubscribed name is simply forgotten;
- LDS and CDS are wildcard when the first request subscribes to nothing, or names ``*``;
  EDS, RDS and SDS carry only subscribed names;
- a request carrying the nonce of an outstanding response ACKs it (or NACKs it with
  ``error_detail``); a rejected version is never re-sent: the stream already counts it as sent,
  so only a later change of that resource goes out; a stale nonce is not an ACK, but the
  subscription changes in that request still apply;
- naming a resource in ``resource_names_subscribe`` always (re-)sends it (Envoy re-subscribes
  when it rebuilds a cluster and waits for the endpoints), except a version it rejected;
- the first request for a type is always answered, even with nothing, so Envoy's
  initialisation (which waits for the first CDS and LDS answers) completes;
- on a snapshot change, types go out make-before-break ("Eventual consistency
  considerations"): CDS and EDS first; LDS and RDS changes wait until the CDS response is
  answered (Envoy answers once new clusters are warm); removed clusters, endpoints and secrets
  go out only once the listener and route changes are sent and answered. ``waiting`` and
  ``release`` let the stream stop waiting on a client that does not answer;
- a NACK names the snapshot the rejected response was built from, so the cache can refuse it.

The type-level version the cache tracks for ``wait_for_acks`` is the snapshot's per-type
version: an ACK of the newest response for a type means the client holds that snapshot's
resources of that type. A change that sends this client nothing (it is not subscribed to what
changed) leaves it in sync, so the state reports that as an ACK without a round trip.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import Message

from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2
from inferway.xds import type_urls
from inferway.xds.resources import content_hash
from inferway.xds.snapshot import Snapshot
from inferway.xds.sotw import EMPTY_VERSION, WILDCARD_TYPES, Ack, Nack, counter_nonces

__all__ = ["DeltaState", "DeltaStep", "build_delta_response", "resource_versions"]

_WILDCARD = "*"
_CLUSTER_USERS = (type_urls.LISTENER, type_urls.ROUTE)


@dataclass(frozen=True)
class DeltaStep:
    """What one event produced: responses to send (in order) and the ACKs/NACKs it carried."""

    responses: list[discovery_pb2.DeltaDiscoveryResponse] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    nacks: list[Nack] = field(default_factory=list)
    stale: bool = False


@dataclass(frozen=True)
class _Sent:
    """One outstanding response: the type version and snapshot it came from, names sent."""

    version: str
    snapshot: str
    names: tuple[str, ...]


@dataclass
class _TypeState:
    wildcard: bool = False
    names: set[str] = field(default_factory=set)
    sent: dict[str, str] = field(default_factory=dict)  # what the client has (or was sent)
    rejected: dict[str, str] = field(default_factory=dict)  # name -> version it NACKed
    pending: dict[str, _Sent] = field(default_factory=dict)
    """Outstanding responses, oldest first, by nonce."""
    last_nonce: str | None = None
    version: str | None = None  # the snapshot type version this stream last evaluated
    nacked: bool = False  # the newest answered response was rejected
    answer_next: bool = True
    resend: set[str] = field(default_factory=set)  # names to send even if already sent

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names


_VERSIONS_CACHE: OrderedDict[tuple[str, str], Mapping[str, str]] = OrderedDict()
_VERSIONS_CACHE_SIZE = 32


def resource_versions(snapshot: Snapshot, type_url: str) -> Mapping[str, str]:
    """name -> content hash of that one resource. Memoised by the snapshot's (content-derived)
    version, so N streams on the same snapshot hash each resource once."""
    key = (snapshot.version, type_url)
    cached = _VERSIONS_CACHE.get(key)
    if cached is not None:
        _VERSIONS_CACHE.move_to_end(key)
        return cached
    versions = {name: content_hash([m]) for name, m in snapshot.resources_of(type_url).items()}
    _VERSIONS_CACHE[key] = versions
    while len(_VERSIONS_CACHE) > _VERSIONS_CACHE_SIZE:
        _VERSIONS_CACHE.popitem(last=False)
    return versions


class DeltaState:
    """Per-stream, per-type delta protocol state; ``nonces()`` yields each response's nonce."""

    def __init__(self, nonces: Callable[[], str] | None = None) -> None:
        self._nonces = nonces or counter_nonces()
        self._types: dict[str, _TypeState] = {}
        self._snapshot: Snapshot | None = None  # the newest snapshot seen
        self._force = False
        self._holding = False  # the last push held a stage back

    def subscribed(self) -> dict[str, frozenset[str] | None]:
        """type_url -> subscribed names (None = wildcard), for status pages and tests."""
        return {t: None if s.wildcard else frozenset(s.names) for t, s in self._types.items()}

    def client_versions(self, type_url: str) -> dict[str, str]:
        """name -> version this stream counts the client as holding (sent or declared)."""
        state = self._types.get(type_url)
        return dict(state.sent) if state else {}

    def on_request(
        self, request: discovery_pb2.DeltaDiscoveryRequest, snapshot: Snapshot | None
    ) -> DeltaStep:
        type_url = request.type_url
        state = self._types.get(type_url)
        acks: list[Ack] = []
        nacks: list[Nack] = []
        stale = False
        if state is None:
            state = self._types[type_url] = _TypeState()
            subscribe = set(request.resource_names_subscribe)
            state.wildcard = _WILDCARD in subscribe or (
                not subscribe and type_url in WILDCARD_TYPES
            )
            # Reconnecting: the client already holds these; only differences go out.
            state.sent.update(request.initial_resource_versions)
        nonce = request.response_nonce
        if nonce:
            if nonce in state.pending:
                settled = self._settle(state, nonce)
                version, names = settled.version, settled.names
                if request.HasField("error_detail"):
                    state.nacked = True
                    for name in names:
                        if name in state.sent:
                            state.rejected[name] = state.sent[name]
                    message = request.error_detail.message
                    nacks.append(Nack(type_url, version, nonce, message, settled.snapshot, names))
                else:
                    state.nacked = False
                    for name in names:  # accepted now: a newer version replaced a rejected one
                        state.rejected.pop(name, None)
                    if state.last_nonce == nonce and state.version is not None:
                        version = state.version  # in sync with the newest evaluated snapshot
                    if not state.rejected:  # holding a rejected resource: in sync with nothing
                        acks.append(Ack(type_url, version))
            else:
                stale = True
        self._subscribe(state, request)
        state.resend.difference_update(request.initial_resource_versions)
        responses: list[discovery_pb2.DeltaDiscoveryResponse] = []
        if snapshot is not None:
            self._snapshot = snapshot
        if not self._gated(type_url, state):
            removals = type_url not in type_urls.REMOVE_LAST or self._removals_allowed(snapshot)
            response = self._respond(type_url, state, snapshot, removals=removals)
            if response is not None:
                responses.append(response)
        if snapshot is not None and acks and not nacks:  # an ACK may let a held stage go
            # (after a NACK the held stage waits: the cache may go back to the last good one)
            responses += self._push(snapshot)
        return DeltaStep(responses, acks, nacks, stale)

    def on_snapshot(self, snapshot: Snapshot | None) -> DeltaStep:
        """Responses for every subscribed type with differences, CDS/EDS before LDS/RDS and
        removed clusters/endpoints/secrets last; an ACK for each type that changed without
        concerning this client."""
        if snapshot is None:
            return DeltaStep()
        self._snapshot = snapshot
        order = snapshot.type_urls() + sorted(t for t in self._types if t not in snapshot.versions)
        acks = []
        before = {t: s.version for t, s in self._types.items()}
        responses = self._push(snapshot)
        answered = {r.type_url for r in responses}
        for type_url in order:
            state = self._types.get(type_url)
            if state is None or type_url in answered:
                continue
            if (
                not self._differs(type_url, state, snapshot)
                and state.version != before.get(type_url)
                and state.version is not None
                and not state.pending
                and not state.nacked
                and not state.rejected
                and before.get(type_url) is not None
            ):
                acks.append(Ack(type_url, state.version))
        return DeltaStep(responses, acks)

    @property
    def waiting(self) -> bool:
        """Some change is held until the client answers an earlier stage."""
        return self._holding

    def release(self) -> DeltaStep:
        """Send what is held without waiting any longer (the client did not answer in time)."""
        if self._snapshot is None:
            return DeltaStep()
        self._force = True
        try:
            return DeltaStep(self._push(self._snapshot))
        finally:
            self._force = False

    # -- make-before-break staging -----------------------------------------------------------

    def _push(self, snapshot: Snapshot) -> list[discovery_pb2.DeltaDiscoveryResponse]:
        order = snapshot.type_urls() + sorted(t for t in self._types if t not in snapshot.versions)
        responses = []
        holding = False
        for type_url in order:
            state = self._types.get(type_url)
            if state is None:
                continue
            if self._gated(type_url, state):
                holding = holding or self._differs(type_url, state, snapshot)
                continue
            removals = type_url not in type_urls.REMOVE_LAST or self._removals_allowed(snapshot)
            response = self._respond(type_url, state, snapshot, removals=removals)
            if response is not None:
                responses.append(response)
            if not removals:
                holding = holding or bool(self._diff(type_url, state, snapshot)[1])
        self._holding = holding
        return responses

    def _gated(self, type_url: str, state: _TypeState) -> bool:
        """Listener and route changes wait while a cluster update is unanswered (Envoy answers
        once new clusters are warm), unless the client asked for something new."""
        if type_url not in _CLUSTER_USERS or self._force:
            return False
        if state.answer_next or state.resend:
            return False
        cds = self._types.get(type_urls.CLUSTER)
        return cds is not None and bool(cds.pending)

    def _removals_allowed(self, snapshot: Snapshot | None) -> bool:
        """Clusters, endpoints and secrets go only once listeners and routes stopped using them:
        every listener and route change sent and answered."""
        if snapshot is None or self._force:
            return True
        for type_url in _CLUSTER_USERS:
            state = self._types.get(type_url)
            if state is not None and (state.pending or self._differs(type_url, state, snapshot)):
                return False
        return True

    @staticmethod
    def _diff(type_url: str, state: _TypeState, snapshot: Snapshot) -> tuple[list[str], list[str]]:
        """(names to send, names to remove) for this client, rejected versions excluded."""
        current = resource_versions(snapshot, type_url)
        candidates = current if state.wildcard else (n for n in state.names if n in current)
        changed: list[str] = []
        for name in sorted(candidates):
            version = current[name]
            if state.rejected.get(name) == version:
                continue  # rejected: never again, until it changes
            if state.sent.get(name) != version or name in state.resend:
                changed.append(name)
        removed = sorted(n for n in state.sent if n not in current or not state.wants(n))
        return changed, removed

    def _differs(self, type_url: str, state: _TypeState, snapshot: Snapshot) -> bool:
        changed, removed = self._diff(type_url, state, snapshot)
        return bool(changed or removed)

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _settle(state: _TypeState, nonce: str) -> _Sent:
        """Drop ``nonce`` and every older outstanding nonce (the client answers in order);
        what was sent with ``nonce``."""
        sent = _Sent("", "", ())
        for pending in list(state.pending):
            sent = state.pending.pop(pending)
            if pending == nonce:
                break
        return sent

    @staticmethod
    def _subscribe(state: _TypeState, request: discovery_pb2.DeltaDiscoveryRequest) -> None:
        for name in request.resource_names_subscribe:
            if name == _WILDCARD:
                state.wildcard = True
                continue
            state.names.add(name)
            state.resend.add(name)
        for name in request.resource_names_unsubscribe:
            if name == _WILDCARD:
                state.wildcard = False
                continue
            state.names.discard(name)
            state.resend.discard(name)
        if not state.wildcard:
            for name in [n for n in state.sent if n not in state.names]:
                del state.sent[name]  # unsubscribed: forget it, the client dropped it
                state.rejected.pop(name, None)

    def _respond(
        self,
        type_url: str,
        state: _TypeState,
        snapshot: Snapshot | None,
        *,
        removals: bool = True,
    ) -> discovery_pb2.DeltaDiscoveryResponse | None:
        """``removals=False``: send changes only, leaving removed resources for later."""
        if snapshot is None:
            return None  # answered once a snapshot arrives (answer_next / resend stay set)
        state.version = snapshot.versions.get(type_url, EMPTY_VERSION)
        current = resource_versions(snapshot, type_url)
        messages = snapshot.resources_of(type_url)
        changed, removed = self._diff(type_url, state, snapshot)
        if not removals:
            removed = []
        state.resend.clear()
        if not changed and not removed and not state.answer_next:
            return None
        if not changed and not removed and not (state.wildcard or state.names):
            state.answer_next = False
            return None  # nothing subscribed: nothing to say
        response = build_delta_response(
            type_url, state.version, [(n, current[n], messages[n]) for n in changed], removed
        )
        response.nonce = self._nonces()
        for name in changed:
            state.sent[name] = current[name]
            if state.rejected.get(name) not in (None, current[name]):
                del state.rejected[name]
        for name in removed:
            state.sent.pop(name, None)
            state.rejected.pop(name, None)
        state.pending[response.nonce] = _Sent(state.version, snapshot.version, tuple(changed))
        state.last_nonce = response.nonce
        state.answer_next = False
        return response


def build_delta_response(
    type_url: str,
    system_version: str,
    resources: list[tuple[str, str, Message]],
    removed: list[str],
) -> discovery_pb2.DeltaDiscoveryResponse:
    """``resources`` as (name, version, message); ``removed`` as names."""
    response = discovery_pb2.DeltaDiscoveryResponse(
        system_version_info=system_version, type_url=type_url, removed_resources=removed
    )
    for name, version, message in resources:
        item = response.resources.add(name=name, version=version)
        item.resource.Pack(message)
    return response
