"""The admin API's contract: its default port, the admin token's variable, and its JSON
documents as typed records, shared by the server that builds them (``admin.py``, the rollout
driver, the autoscale driver) and the CLI's ``AdminClient`` that reads them, so both sides
name the same fields.

``TypedDict`` on purpose: a record is the very ``dict`` that ``json.dumps`` writes, so the
documents stay byte-for-byte what docs/cli.md documents and ``-o json`` prints. This module
imports nothing but ``typing``: the CLI's fast path (``inferway status``) reads it without
loading the gateway.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

__all__ = [
    "ADMIN_TOKEN_ENV",
    "DEFAULT_ADMIN_PORT",
    "AutoscaleDocument",
    "AutoscaleService",
    "EnvoyRecord",
    "FileProblemRecord",
    "HealthRecord",
    "IssueRecord",
    "KeeperRecord",
    "NackRecord",
    "NodeRecord",
    "PickerStatusRecord",
    "PolicyRecord",
    "RefusalRecord",
    "RejectionRecord",
    "ReplicasDocument",
    "RolloutCommandAnswer",
    "RolloutCounts",
    "RolloutList",
    "RolloutStatus",
    "StatusDocument",
]


DEFAULT_ADMIN_PORT = 15000
"""Where ``inferway run`` serves the admin API and where the CLI asks it by default."""

ADMIN_TOKEN_ENV = "INFERWAY_ADMIN_TOKEN"
"""The environment variable holding the admin token (``POST`` endpoints need it)."""


# ---- GET /status -----------------------------------------------------------------------------


class HealthRecord(TypedDict):
    """``ok``; else ``status`` (degraded) and the ``reason``."""

    ok: bool
    status: str
    reason: str | None


class PolicyRecord(TypedDict):
    """The live policy: its version, when and from where it was applied, and the version of
    each xDS resource type (short names: ``clusters``, ``listeners``, ...)."""

    version: str
    applied_at: float
    source: str
    versions: dict[str, str]


class IssueRecord(TypedDict):
    """One located problem of a refused edit (``text`` is the ``file:line:column`` line)."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str
    text: str


class RejectionRecord(TypedDict):
    """The Envoy NACK that rejected an edit the control plane had accepted."""

    node_id: str
    type: str
    snapshot: str
    resource_names: list[str]
    message: str
    restored: str | None
    """The snapshot served instead (the last one an Envoy ACKed; None when there was none)."""


class RefusalRecord(TypedDict):
    """The last refused edit; ``pending`` while the file on disk is still that edit."""

    at: float
    file: str
    pending: bool
    rejected_by_envoy: RejectionRecord | None
    issues: list[IssueRecord]


class FileProblemRecord(TypedDict):
    """A watched file that cannot be read (the live policy keeps serving)."""

    kind: str
    file: str
    message: str
    since: float


class NackRecord(TypedDict):
    node_id: str
    type: str
    version: str
    nonce: str
    message: str
    at: float


class NodeRecord(TypedDict):
    """One Envoy that connected: what it ACKed per type and whether that is the snapshot."""

    node_id: str
    cluster: str
    group: str
    connected: bool
    connected_since: float | None
    last_seen: float | None
    acked: dict[str, str]
    in_sync: bool
    snapshot_version: str | None
    last_nack: NackRecord | None
    address: NotRequired[str]
    """The host its listeners are reached at ("" unknown; ``xds/node_address.py``)."""
    address_source: NotRequired[str]
    """``advertised`` (its bootstrap's node metadata) or ``ads-peer`` (its stream's source)."""


class EnvoyRecord(TypedDict):
    pid: int | None
    running: bool
    restarts: int
    last_exit_code: int | None
    admin_port: int | None


class KeeperRecord(TypedDict):
    """Under ``inferway run``'s keeper: its pid and the control-plane child's record."""

    pid: int | None
    control_plane: dict[str, Any] | None


class PickerStatusRecord(TypedDict):
    """One picked service: per endpoint ``depth``, ``in_flight``, ``kv_cache`` (0-1 or None),
    ``picks`` and ``prefix_hit_rate`` (0-1 or None); ``last_pick``: its explanation
    (``picker.winner``, ``picker.reason``, ``picker.scores``, ...) or None. ``asked``: how Envoy
    asks the picker (``transport``: http or ext_proc, and the ``address``). ``in_envoy``: set
    for ``process: envoy``: ``prefix_bytes`` and ``load_bound`` (``pick: hash``), or ``pick``:
    "score" and the ``scorers``' weights (Envoy's Lua picker scores each request: its winner and
    reason go to the access log and trace, ``inferway.picker``); Envoy picks (its access log and
    trace name each request's upstream), and ``endpoints`` holds each replica's last scrape
    (``depth``, ``kv_cache``, the server's own ``prefix_hit_rate`` where it says it) with
    ``saturated`` and ``left_out`` (sent to Envoy as DEGRADED); ``changes``: the recent left-out
    / taken-back decisions (``at``, ``endpoint``, ``left_out``, ``reason``, ``depth``,
    ``kv_cache``); ``kept_in_saturated``: saturated replicas kept in (the pool had no room, or
    at most half the pool is left out); ``no_room``: why the pool had no room for a saturated
    replica's traffic (None: it had)."""

    endpoints: dict[str, dict[str, float | bool | None]]
    last_pick: dict[str, Any] | None
    asked: NotRequired[dict[str, str]]
    in_envoy: NotRequired[dict[str, Any]]
    changes: NotRequired[list[dict[str, Any]]]
    kept_in_saturated: NotRequired[int]
    no_room: NotRequired[str | None]


class StatusDocument(TypedDict):
    """``GET /status`` (``inferway status -o json``)."""

    health: HealthRecord
    policy: PolicyRecord | None
    last_refused: RefusalRecord | None
    file_problems: list[FileProblemRecord]
    nodes: list[NodeRecord]
    nacks: list[NackRecord]
    envoy: EnvoyRecord | None
    keeper: KeeperRecord | None
    xds_refused: NotRequired[list[dict[str, Any]]]
    """xDS clients the server refused (mTLS identities), when the server checks them."""
    watchers: NotRequired[list[dict[str, Any]]]
    """Each file watcher's health: policy, endpoints file, certificates (watch_health.py)."""
    fleet: NotRequired[dict[str, Any]]
    """A fleet replica's view: the store, the leader, every replica and reporting Envoy."""
    warnings: NotRequired[list[str]]
    """What works but may not do what is meant: a per-Envoy rate limit several connected
    Envoys serve (the fleet admits it once per Envoy)."""
    served_weights: NotRequired[dict[str, dict[str, Any]]]
    """Per group of connected nodes: ``version`` and ``routes`` (route configuration -> route
    -> cluster -> percent), the split that group's snapshot serves (xds/served_weights.py)."""
    pickers: NotRequired[dict[str, PickerStatusRecord]]
    """Per service with an endpoint picker served here (gateway/picker/keeper.py)."""


# ---- GET /rollouts, GET /rollouts/{name}, POST /rollouts/{name}/{command} ----------------------


class RolloutCounts(TypedDict):
    requests: int
    errors: int


class RolloutStatus(TypedDict):
    """One rollout (``GET /rollouts/{name}``): where it is, its evidence, its last analysis
    (``Decision.to_json()``) and, unless listed, its recent decisions."""

    name: str
    route: str
    stable: str
    canary: str
    phase: str
    paused_by: str | None
    step: int
    steps: list[float]
    weight_percent: float
    reason: str
    run: int
    interval_s: float
    evidence: dict[str, Any]
    """``canary`` and ``stable`` :class:`RolloutCounts`, ``step_canary_requests``, and the
    backends' own counts when a check reads them."""
    last_analysis: dict[str, Any] | None
    gate: dict[str, Any] | None
    history: list[dict[str, Any]]


class RolloutList(TypedDict):
    """``GET /rollouts``: every rollout of the live policy, without history."""

    rollouts: list[RolloutStatus]


class RolloutCommandAnswer(TypedDict):
    """``POST /rollouts/{name}/{command}``: the decision the command made, and the rollout."""

    decision: dict[str, Any]
    status: RolloutStatus


# ---- GET /autoscale ----------------------------------------------------------------------------


class AutoscaleService(TypedDict):
    """One autoscaled service: its rule, where it scales, and its last decision."""

    service: str
    algorithm: str
    metric: str
    sampling_interval_s: float
    scale_target: dict[str, Any]
    last_decision: dict[str, Any] | None
    error: str | None
    tokens_per_s: NotRequired[float | None]
    """LLM tokens per second the gateway counted for the service over the last interval."""
    tokens_per_s_per_replica: NotRequired[float | None]


class ReplicasDocument(TypedDict):
    """The replica manager: per service and replica, plus recent events."""

    services: list[dict[str, Any]]
    events: list[dict[str, Any]]


class AutoscaleDocument(TypedDict):
    """``GET /autoscale`` (``inferway scale status -o json``)."""

    services: list[AutoscaleService]
    decisions: list[dict[str, Any]]
    replicas: ReplicasDocument
