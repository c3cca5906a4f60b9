"""The state-of-the-world xDS protocol for one ADS stream, as pure code.

``SotwState`` turns (request, current snapshot) and (snapshot changed) into the responses to send
and the ACKs/NACKs seen; it holds no sockets, clock or cache, so it is tested with plain values.
Rules (xDS protocol, "ACK/NACK and resource type instance version"; "When to send an update"):

- a request whose ``response_nonce`` is not the last nonce sent for its type is stale: ignored;
- a request with the last nonce and no ``error_detail`` ACKs the version sent with that nonce;
  with ``error_detail`` it NACKs it, and that version is not sent again on this stream until the
  snapshot for the type changes or the subscription does (re-sending it would loop forever);
- a request without a nonce opens (or re-opens) a subscription: it is always answered; so is
  a second request with an already ACKed nonce (Envoy re-subscribing, e.g. a cluster rebuilt by
  a CDS update asks for its endpoints again and stays warming until it gets them);
- LDS and CDS are wildcard when no names (or ``*``) are given; EDS, RDS and SDS send only the
  requested names;
- on a snapshot change, types go out make-before-break ("Eventual consistency
  considerations"): CDS and EDS first; LDS and RDS changes wait until the CDS response is
  answered (Envoy answers once new clusters are warm, so no route names a cluster Envoy lacks);
  clusters the snapshot drops stay in CDS responses (a "kept" set, versioned by content) until
  LDS and RDS are sent and answered, and only then goes a CDS response without them (LDS and
  CDS are the only types where SotW removes by omission). ``waiting``/``release`` let the
  stream stop waiting on a client that does not answer;
- a NACK names the snapshot the rejected response was built from, so the cache can refuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from google.protobuf import any_pb2
from google.protobuf.message import Message

from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2
from inferway.xds import type_urls
from inferway.xds.resources import content_hash
from inferway.xds.snapshot import Snapshot

__all__ = ["Ack", "Nack", "SotwState", "Step", "counter_nonces"]

WILDCARD_TYPES = frozenset({type_urls.LISTENER, type_urls.CLUSTER})
_CLUSTER_USERS = (type_urls.LISTENER, type_urls.ROUTE)
EMPTY_VERSION = content_hash([])


@dataclass(frozen=True)
class Ack:
    type_url: str
    version: str


@dataclass(frozen=True)
class Nack:
    """``snapshot``: the snapshot version the rejected response was built from;
    ``resource_names``: the resources it carried."""

    type_url: str
    version: str
    nonce: str
    message: str
    snapshot: str = ""
    resource_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """What one event produced: responses to send (in order) and the ACKs/NACKs it carried."""

    responses: list[discovery_pb2.DiscoveryResponse] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    nacks: list[Nack] = field(default_factory=list)
    stale: bool = False


_NEVER_SENT = frozenset({"\0never-sent"})


@dataclass
class _TypeState:
    names: frozenset[str] | None = None  # None: wildcard
    last_nonce: str | None = None
    answered_nonce: str | None = None  # the last nonce an ACK/NACK already consumed
    sent_version: str | None = None
    sent_names: frozenset[str] | None = _NEVER_SENT
    rejected_version: str | None = None
    answer_next: bool = False  # a fresh subscription is always answered
    sent_snapshot: str = ""  # the snapshot version the last response was built from
    sent: dict[str, Message] = field(default_factory=dict)  # the last response's resources
    acked: dict[str, Message] = field(default_factory=dict)  # the last ACKed response's
    nacked: bool = False  # the last response was rejected: the client holds ``acked``

    def holding(self) -> dict[str, Message]:
        """What the client may hold now: the last ACKed resources, and the last sent ones
        unless it rejected them."""
        return self.acked if self.nacked else {**self.acked, **self.sent}


def counter_nonces(prefix: str = "") -> Callable[[], str]:
    """Nonces unique within a stream: ``prefix`` + a counter."""
    count = 0

    def next_nonce() -> str:
        nonlocal count
        count += 1
        return f"{prefix}{count}"

    return next_nonce


class SotwState:
    """Per-stream, per-type protocol state; ``nonces()`` yields each response's nonce."""

    def __init__(self, nonces: Callable[[], str] | None = None) -> None:
        self._nonces = nonces or counter_nonces()
        self._types: dict[str, _TypeState] = {}
        self._snapshot: Snapshot | None = None  # the newest snapshot seen
        self._force = False

    def subscribed(self) -> dict[str, frozenset[str] | None]:
        """type_url -> requested names (None = wildcard), for status pages and tests."""
        return {t: s.names for t, s in self._types.items()}

    def on_request(
        self, request: discovery_pb2.DiscoveryRequest, snapshot: Snapshot | None
    ) -> Step:
        type_url = request.type_url
        state = self._types.setdefault(type_url, _TypeState())
        acks: list[Ack] = []
        nacks: list[Nack] = []
        nonce = request.response_nonce
        if nonce:
            if nonce != state.last_nonce:
                return Step(stale=True)
            sent = state.sent_version or ""
            if nonce == state.answered_nonce:
                # Asked again with an already answered nonce: Envoy re-created the subscription
                # (e.g. a cluster rebuilt by a CDS update waits, warming, for its EDS).
                state.answer_next = not request.HasField("error_detail")
            elif request.HasField("error_detail"):
                state.rejected_version = sent
                state.nacked = True
                nacks.append(
                    Nack(
                        type_url,
                        sent,
                        nonce,
                        request.error_detail.message,
                        state.sent_snapshot,
                        tuple(sorted(state.sent)),
                    )
                )
            else:
                state.acked, state.nacked = state.sent, False
                acks.append(Ack(type_url, sent))
            state.answered_nonce = nonce
        else:
            state.answer_next = True
        state.names = _requested_names(type_url, request.resource_names)
        responses: list[discovery_pb2.DiscoveryResponse] = []
        if snapshot is not None:
            self._snapshot = snapshot
        if not self._gated(type_url, state):
            keep = self._cds_keep(snapshot) if type_url == type_urls.CLUSTER else None
            response = self._respond(type_url, state, snapshot, keep)
            if response is not None:
                responses.append(response)
        if snapshot is not None and acks and not nacks:  # an ACK may let a held stage go
            # (after a NACK the held stage waits: the cache may go back to the last good one)
            responses += self._push(snapshot)
        return Step(responses, acks, nacks)

    def on_snapshot(self, snapshot: Snapshot | None) -> Step:
        """Responses for every subscribed type whose content changed, CDS/EDS before LDS/RDS;
        the rest follows as the client answers (make-before-break, see the module doc)."""
        if snapshot is None:
            return Step()
        self._snapshot = snapshot
        return Step(self._push(snapshot))

    @property
    def waiting(self) -> bool:
        """Some change is held until the client answers an earlier stage."""
        snapshot = self._snapshot
        if snapshot is None:
            return False
        cds = self._types.get(type_urls.CLUSTER)
        if cds is not None and self._held(type_urls.CLUSTER, cds, snapshot):
            return True
        return any(self._held(t, s, snapshot) for t, s in self._users())

    def release(self) -> Step:
        """Send what is held without waiting any longer (the client did not answer in time)."""
        if self._snapshot is None:
            return Step()
        self._force = True
        try:
            return Step(self._push(self._snapshot))
        finally:
            self._force = False

    # -- make-before-break staging -----------------------------------------------------------

    def _push(self, snapshot: Snapshot) -> list[discovery_pb2.DiscoveryResponse]:
        order = snapshot.type_urls() + sorted(t for t in self._types if t not in snapshot.versions)
        responses = []
        for type_url in order:
            state = self._types.get(type_url)
            if state is None or self._gated(type_url, state):
                continue
            keep = self._cds_keep(snapshot) if type_url == type_urls.CLUSTER else None
            response = self._respond(type_url, state, snapshot, keep)
            if response is not None:
                responses.append(response)
        return responses

    def _users(self) -> list[tuple[str, _TypeState]]:
        return [(t, self._types[t]) for t in _CLUSTER_USERS if t in self._types]

    def _gated(self, type_url: str, state: _TypeState) -> bool:
        """Listeners and routes wait while a cluster update is unanswered (Envoy answers CDS
        once new clusters are warm), unless the client asked for something new."""
        if type_url not in _CLUSTER_USERS or self._force:
            return False
        if state.answer_next or state.names != state.sent_names:
            return False
        cds = self._types.get(type_urls.CLUSTER)
        return cds is not None and _outstanding(cds)

    def _cds_keep(self, snapshot: Snapshot | None) -> dict[str, Message]:
        """Clusters the client holds that ``snapshot`` drops, while listeners or routes may
        still use them: kept in CDS responses until those are sent and answered."""
        cds = self._types.get(type_urls.CLUSTER)
        if snapshot is None or cds is None or cds.names is not None or self._force:
            return {}
        current = snapshot.resources_of(type_urls.CLUSTER)
        held = cds.holding()
        kept = {name: held[name] for name in held if name not in current}
        if not kept:
            return {}
        if any(_outstanding(s) or self._held(t, s, snapshot) for t, s in self._users()):
            return kept
        return {}

    @staticmethod
    def _held(type_url: str, state: _TypeState, snapshot: Snapshot) -> bool:
        if state.names is not None and not state.names:
            return False
        version = snapshot.versions.get(type_url, EMPTY_VERSION)
        return version not in (state.sent_version, state.rejected_version)

    def _respond(
        self,
        type_url: str,
        state: _TypeState,
        snapshot: Snapshot | None,
        keep: dict[str, Message] | None = None,
    ) -> discovery_pb2.DiscoveryResponse | None:
        """``keep``: resources the snapshot dropped that this response still carries."""
        if snapshot is None:
            return None  # answered once a snapshot arrives (answer_next stays set)
        names = state.names
        if names is not None and not names:
            state.answer_next = False  # nothing subscribed: nothing to say
            state.sent_names = names
            return None
        selected = _select(snapshot, type_url, names)
        if keep:
            selected = dict(sorted({**keep, **selected}.items()))
            version = content_hash(selected.values())
        else:
            version = snapshot.versions.get(type_url, EMPTY_VERSION)
        content_changed = version not in (state.sent_version, state.rejected_version)
        if not (state.answer_next or names != state.sent_names or content_changed):
            return None
        response = build_response(type_url, version, selected.values())
        response.nonce = self._nonces()
        state.last_nonce = response.nonce
        state.sent_version = version
        state.sent_names = names
        state.sent_snapshot = snapshot.version
        state.sent, state.nacked = selected, False
        state.answer_next = False
        if version != state.rejected_version:
            state.rejected_version = None
        return response


def build_response(
    type_url: str, version: str, resources: Iterable[Message]
) -> discovery_pb2.DiscoveryResponse:
    packed = []
    for message in resources:
        holder = any_pb2.Any()
        holder.Pack(message)
        packed.append(holder)
    return discovery_pb2.DiscoveryResponse(
        version_info=version, type_url=type_url, resources=packed
    )


def _outstanding(state: _TypeState) -> bool:
    """A response of this type is not answered yet."""
    return state.last_nonce is not None and state.answered_nonce != state.last_nonce


def _select(snapshot: Snapshot, type_url: str, names: frozenset[str] | None) -> dict[str, Message]:
    named = snapshot.resources_of(type_url)
    if names is None:
        return {n: named[n] for n in sorted(named)}
    return {n: named[n] for n in sorted(names) if n in named}


def _requested_names(type_url: str, names: Iterable[str]) -> frozenset[str] | None:
    requested = frozenset(names)
    if "*" in requested or (not requested and type_url in WILDCARD_TYPES):
        return None
    return requested
