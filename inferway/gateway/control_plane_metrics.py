"""Prometheus metrics of the control plane, fed from the outside: the xDS cache's hooks
(``on_push``/``on_ack``/``on_nack``/``on_connect``/``on_disconnect``) and the ControlPlane's
observers (``on_applied``/``on_refused``), so neither the protocol code nor the apply logic
knows metrics exist.

Counters and histograms move on events; what describes the present (the live policy version,
how many Envoys are connected and in sync) is read from the cache at scrape time, so a scrape
never reports a stale gauge. One registry per instance: two gateways in one process (as in
tests) never share or clash.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferway.gateway.control_plane import PolicyFollower
from inferway.gateway.cost_metrics import CostCollector
from inferway.xds import type_urls
from inferway.xds.cache import node_in_sync
from inferway.xds.hooks import XdsObserver

if TYPE_CHECKING:
    from inferway.gateway.control_plane import AppliedPolicy, ControlPlane, Refusal
    from inferway.xds.records import NackRecord, NodeStatus

__all__ = ["CONTENT_TYPE", "ControlPlaneMetrics", "type_label"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PUSH_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
_TYPES = tuple(type_urls.SHORT_NAMES.values())


def type_label(type_url: str) -> str:
    """The bounded ``type`` label value of an xDS type URL (``clusters``, ``routes``, ...)."""
    return type_urls.SHORT_NAMES.get(type_url, "other")


class _StateGauges(Collector):
    """Gauges read from the control plane and its cache when Prometheus scrapes."""

    def __init__(self, plane: ControlPlane) -> None:
        self._plane = plane

    def collect(self) -> Iterator[Metric]:
        plane = self._plane
        info = GaugeMetricFamily(
            "inferway_policy_info",
            "The live policy: always 1, labelled with its snapshot version.",
            labels=["version"],
        )
        applied = GaugeMetricFamily(
            "inferway_policy_applied_timestamp_seconds",
            "Unix time the live policy was applied.",
        )
        pending = GaugeMetricFamily(
            "inferway_policy_refusal_pending",
            "1 while the newest policy edit was refused (the live policy is older than it).",
        )
        current = plane.current
        if current is not None:
            info.add_metric([current.version], 1.0)
            applied.add_metric([], current.applied_at)
        pending.add_metric([], 1.0 if plane.refusal_pending else 0.0)
        nodes = plane.cache.node_status()
        connected = [n for n in nodes if n.connected]
        in_sync = sum(1 for n in connected if node_in_sync(n, plane.cache.get_snapshot(n.group)))
        yield info
        yield applied
        yield pending
        yield GaugeMetricFamily(
            "inferway_xds_connected_envoys",
            "Envoys with an open xDS stream to this control plane.",
            value=float(len(connected)),
        )
        yield GaugeMetricFamily(
            "inferway_xds_envoys_in_sync",
            "Connected Envoys that acked every type of their group's current snapshot.",
            value=float(in_sync),
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected lazily; nothing to check at registration


class ControlPlaneMetrics(XdsObserver, PolicyFollower):
    """All of one control plane's metrics; ``attach`` wires it to a ControlPlane and its cache.

    ``clock`` is monotonic seconds, used only for durations (push -> ACK, apply -> in sync).
    """

    def __init__(self, plane: ControlPlane, *, clock: Callable[[], float] = time.monotonic):
        self._plane = plane
        self._clock = clock
        self._pending_pushes: dict[tuple[str, str], tuple[str, float]] = {}
        self._pending_policy: tuple[str, float] | None = None
        self._unsynced: set[str] = set()
        """The connected nodes that have not ACKed all of the pending policy yet: each ACK
        checks its own node only (checking every node on every ACK is O(nodes²) a push)."""
        self.registry = CollectorRegistry()
        reg = self.registry
        reg.register(CostCollector(lambda: plane.policy))  # services[].cost, live
        self.pushes = Counter(
            "inferway_xds_pushes",
            "xDS responses sent to Envoys, by resource type.",
            ["type"],
            registry=reg,
        )
        self.acks = Counter(
            "inferway_xds_acks", "xDS responses Envoys accepted, by resource type.", ["type"],
            registry=reg,
        )  # fmt: skip
        self.nacks = Counter(
            "inferway_xds_nacks", "xDS responses Envoys rejected, by resource type.", ["type"],
            registry=reg,
        )  # fmt: skip
        self.push_duration = Histogram(
            "inferway_xds_push_duration_seconds",
            "Time from sending an xDS response to the Envoy's ACK of it, by resource type.",
            ["type"],
            buckets=_PUSH_BUCKETS,
            registry=reg,
        )
        self.connections = Counter(
            "inferway_xds_connections",
            "xDS streams opened by Envoys (reconnects included).",
            registry=reg,
        )
        self.applied = Counter(
            "inferway_policy_applied",
            "Policies applied (a policy file edit or new runtime state that became a snapshot).",
            registry=reg,
        )
        self.refused = Counter(
            "inferway_policy_refused_edits",
            "Policy edits refused (invalid, untranslatable or inconsistent); the live one stayed.",
            registry=reg,
        )
        self.propagation = Histogram(
            "inferway_policy_propagation_seconds",
            "Time from applying a changed policy to every connected Envoy acking all of it.",
            buckets=_PUSH_BUCKETS,
            registry=reg,
        )
        for name in _TYPES:
            for family in (self.pushes, self.acks, self.nacks):
                family.labels(name)
        reg.register(_StateGauges(plane))

    @classmethod
    def attach(
        cls, plane: ControlPlane, *, clock: Callable[[], float] = time.monotonic
    ) -> ControlPlaneMetrics:
        """Build the metrics and register them as hooks on ``plane`` and ``plane.cache``."""
        metrics = cls(plane, clock=clock)
        plane.cache.add_hook(metrics)
        plane.add_observer(metrics)
        return metrics

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)

    # -- xDS cache hooks ---------------------------------------------------------------------

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None:
        self.pushes.labels(type_label(type_url)).inc()
        self._pending_pushes[(node_id, type_url)] = (version, self._clock())

    def on_ack(self, node_id: str, type_url: str, version: str) -> None:
        kind = type_label(type_url)
        self.acks.labels(kind).inc()
        pending = self._pending_pushes.get((node_id, type_url))
        if pending is not None and pending[0] == version:
            del self._pending_pushes[(node_id, type_url)]
            self.push_duration.labels(kind).observe(max(0.0, self._clock() - pending[1]))
        self._check_propagated(node_id)

    def on_nack(self, record: NackRecord) -> None:
        self.nacks.labels(type_label(record.type_url)).inc()
        self._pending_pushes.pop((record.node_id, record.type_url), None)

    def on_connect(self, status: NodeStatus) -> None:
        self.connections.inc()
        if self._pending_policy is not None:  # it must get the pending policy too
            self._unsynced.add(status.node_id)

    def on_disconnect(self, status: NodeStatus) -> None:
        for key in [k for k in self._pending_pushes if k[0] == status.node_id]:
            del self._pending_pushes[key]
        self._unsynced.discard(status.node_id)

    # -- ControlPlane observers --------------------------------------------------------------

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        self.applied.inc()
        if not changed:
            return
        cache = self._plane.cache
        connected = [n for n in cache.node_status() if n.connected]
        # With no Envoy connected there is nothing to propagate to (yet); a startup's wait for
        # Envoy to boot is not propagation latency.
        self._pending_policy = (applied.version, self._clock()) if connected else None
        self._unsynced = {
            n.node_id for n in connected if not node_in_sync(n, cache.get_snapshot(n.group))
        }

    def on_refused(self, refusal: Refusal) -> None:
        self.refused.inc()

    def _check_propagated(self, node_id: str) -> None:
        if self._pending_policy is None:
            return
        version, started = self._pending_policy
        cache = self._plane.cache
        snapshot = cache.get_snapshot(self._plane.group)
        if snapshot is None or snapshot.version != version:
            self._pending_policy = None  # superseded before it propagated
            self._unsynced.clear()
            return
        if node_id in self._unsynced:
            node = cache.node(node_id)
            if (
                node is None
                or not node.connected
                or node_in_sync(node, cache.get_snapshot(node.group))
            ):
                self._unsynced.discard(node_id)
        if not self._unsynced:
            self._pending_policy = None
            self.propagation.observe(max(0.0, self._clock() - started))
