"""Simulated Envoys for the fleet benchmarks, in child processes (so the control-plane
replicas' CPU is theirs alone): each opens an ADS stream to its replica and behaves like
Envoy's state-of-the-world client (xds_fanout's client), timestamping every route update it
ACKs; with an OTLP template each also pushes its stats every ``push_s`` as Envoy's
``open_telemetry`` stat sink does (a unary ``Export`` with ``x-inferway-node`` metadata).

The OTLP body is a real Envoy's export (captured by the benchmark) with this node's running
totals of the stable and canary clusters appended as one more resource: protobuf repeated
fields concatenate, so the control plane parses a full-size export every time, and the
counters move as the simulation says. Times are ``time.monotonic()`` (CLOCK_MONOTONIC, the
same clock in every process of the machine).

Parent <-> child messages (pipes): child sends ``("acks", [(node, version, t), ...])``,
``("burst", node, t, unix_t)``, ``("counts", counts)`` every second and finally ``("done",
counts)``; parent sends ``("burst", node, errors)``, ``("exporting", bool)`` and
``("stop",)``.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from xds_fanout import _eds_names, _rds_names, _TypeState

from inferway.xds import type_urls

__all__ = ["STREAMS_PER_CHANNEL", "SimSpec", "run_sim_process"]

STREAMS_PER_CHANNEL = 50
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
STABLE, CANARY = "v1", "v2"


@dataclass(frozen=True)
class SimSpec:
    """``nodes``: (node id, replica xDS port) of each simulated Envoy of this process."""

    nodes: tuple[tuple[str, int], ...]
    otlp_static: bytes | None = None
    push_s: float = 2.0
    requests_per_push: int = 10
    canary_share: float = 0.2


def run_sim_process(spec: SimSpec, conn: Connection) -> None:
    """Entry point of one child process."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_Sim(spec, conn).run())


def _counters(node: str, stable: tuple[int, int], canary: tuple[int, int]) -> bytes:
    """One extra ResourceMetrics with this node's totals (requests, 5xx) per cluster."""
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as otlp
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    def attrs(**labels: str) -> list[KeyValue]:
        return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in labels.items()]

    completed = metrics_pb2.Metric(name="cluster.upstream_rq_completed")
    by_class = metrics_pb2.Metric(name="cluster.upstream_rq_xx")
    now = time.time_ns()
    for metric in (completed, by_class):
        metric.sum.is_monotonic = True
        metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    for cluster, (requests, errors) in ((STABLE, stable), (CANARY, canary)):
        completed.sum.data_points.add(
            attributes=attrs(**{"envoy.cluster_name": cluster}), as_int=requests, time_unix_nano=now
        )
        for code, value in (("2", requests - errors), ("5", errors)):
            by_class.sum.data_points.add(
                attributes=attrs(
                    **{"envoy.cluster_name": cluster, "envoy.response_code_class": code}
                ),
                as_int=value,
                time_unix_nano=now,
            )
    request = otlp.ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    resource.resource.attributes.extend(attrs(**{"service.name": node}))
    resource.scope_metrics.add().metrics.extend([completed, by_class])
    return request.SerializeToString()


class _Sim:
    def __init__(self, spec: SimSpec, conn: Connection) -> None:
        self.spec = spec
        self.conn = conn
        self.acks: list[tuple[str, str, float]] = []
        self.bursts: dict[str, int] = {}
        self.counts = {"responses": 0, "acks": 0, "errors": 0, "exports": 0, "export_errors": 0}
        self.stop = asyncio.Event()
        self.exporting = True

    def _on_message(self) -> None:
        while self.conn.poll():
            message = self.conn.recv()
            if message[0] == "stop":
                self.stop.set()
            elif message[0] == "burst":
                self.bursts[message[1]] = int(message[2])
            elif message[0] == "exporting":
                self.exporting = bool(message[1])

    async def run(self) -> None:
        import grpc

        from inferway._xds_protos.envoy.service.discovery.v3 import ads_pb2_grpc

        loop = asyncio.get_running_loop()
        loop.add_reader(self.conn.fileno(), self._on_message)
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        channels: list[Any] = []
        tasks: list[asyncio.Task[None]] = []
        by_port: dict[int, list[str]] = {}
        for node, port in self.spec.nodes:
            by_port.setdefault(port, []).append(node)
        for port, nodes in by_port.items():
            for start in range(0, len(nodes), STREAMS_PER_CHANNEL):
                channel = grpc.aio.insecure_channel(
                    f"127.0.0.1:{port}", options=[*options, ("bench.channel", start)]
                )
                channels.append(channel)
                stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
                export = channel.unary_unary(
                    EXPORT, request_serializer=None, response_deserializer=None
                )
                for node in nodes[start : start + STREAMS_PER_CHANNEL]:
                    tasks.append(asyncio.create_task(self._ads(stub, node)))
                    if self.spec.otlp_static is not None:
                        tasks.append(asyncio.create_task(self._push_stats(export, node)))
        flusher = asyncio.create_task(self._flush())
        await self.stop.wait()
        for task in [*tasks, flusher]:
            task.cancel()
        await asyncio.gather(*tasks, flusher, return_exceptions=True)
        self._send_acks()
        for channel in channels:
            await channel.close(grace=None)
        loop.remove_reader(self.conn.fileno())
        self.conn.send(("done", self.counts))

    def _send_acks(self) -> None:
        if self.acks:
            self.conn.send(("acks", self.acks))
            self.acks = []

    async def _flush(self) -> None:
        ticks = 0
        while True:
            self._send_acks()
            ticks += 1
            if ticks % 200 == 0:
                self.conn.send(("counts", dict(self.counts)))
            await asyncio.sleep(0.005)

    async def _ads(self, stub: Any, node_id: str) -> None:
        from inferway._xds_protos.envoy.config.core.v3 import base_pb2
        from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2

        node = base_pb2.Node(id=node_id, cluster="bench")
        state = {t: _TypeState() for t in type_urls.PUSH_ORDER if t != type_urls.SECRET}
        call = stub.StreamAggregatedResources()

        async def send(type_url: str) -> None:
            s = state[type_url]
            await call.write(
                discovery_pb2.DiscoveryRequest(
                    node=node,
                    type_url=type_url,
                    resource_names=s.names,
                    version_info=s.version,
                    response_nonce=s.nonce,
                )
            )

        try:
            await send(type_urls.CLUSTER)
            await send(type_urls.LISTENER)
            while True:
                response = await call.read()
                if response is None or not hasattr(response, "type_url"):
                    return
                self.counts["responses"] += 1
                s = state.get(response.type_url)
                if s is None:
                    continue
                s.version, s.nonce = response.version_info, response.nonce
                await send(response.type_url)  # the ACK
                self.counts["acks"] += 1
                if response.type_url == type_urls.ROUTE:
                    self.acks.append((node_id, response.version_info, time.monotonic()))
                    continue
                if response.type_url == type_urls.CLUSTER:
                    wanted, follow = _eds_names(response), type_urls.ENDPOINT
                elif response.type_url == type_urls.LISTENER:
                    wanted, follow = _rds_names(response), type_urls.ROUTE
                else:
                    continue
                if wanted != state[follow].names:
                    state[follow].names = wanted
                    await send(follow)
        except asyncio.CancelledError:
            call.cancel()
            raise
        except Exception:
            self.counts["errors"] += 1

    async def _push_stats(self, export: Any, node: str) -> None:
        """Envoy's stat sink: an export every ``push_s`` (first one at a random phase, as
        Envoys started at different times), counters cumulative since the start."""
        spec = self.spec
        assert spec.otlp_static is not None
        metadata = (("x-inferway-node", node), ("x-inferway-zone", "bench"))
        canary_per_push = max(1, round(spec.requests_per_push * spec.canary_share))
        stable_per_push = spec.requests_per_push - canary_per_push
        stable = canary = canary_errors = 0
        await asyncio.sleep(random.uniform(0, spec.push_s))
        due = time.monotonic()
        while True:
            if not self.exporting:  # the parent measures the replicas without reports
                due += spec.push_s
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                continue
            stable += stable_per_push
            canary += canary_per_push
            burst = self.bursts.pop(node, 0)
            canary += burst
            canary_errors += burst
            body = spec.otlp_static + _counters(node, (stable, 0), (canary, canary_errors))
            sent, sent_unix = time.monotonic(), time.time()
            try:
                await export(body, metadata=metadata, timeout=5.0)
                self.counts["exports"] += 1
            except Exception:
                self.counts["export_errors"] += 1
            if burst:
                self.conn.send(("burst", node, sent, sent_unix))
            due += spec.push_s
            await asyncio.sleep(max(0.0, due - time.monotonic()))


# -- the parent's side ---------------------------------------------------------------------------


class SimFleet:
    """Child processes running ``nodes`` (node id, replica port), spread evenly; the route
    versions each node ACKed, with when, as their ACK events arrive."""

    def __init__(
        self,
        nodes: list[tuple[str, int]],
        *,
        processes: int = 2,
        otlp_static: bytes | None = None,
        push_s: float = 2.0,
    ) -> None:
        import multiprocessing as mp

        self.nodes = nodes
        self.latest: dict[str, tuple[str, float]] = {}
        self.burst_sent: dict[str, tuple[float, float]] = {}
        self.counts: list[dict[str, int]] = []
        self.running_counts: dict[int, dict[str, int]] = {}
        ctx = mp.get_context("spawn")
        self._children: list[tuple[Any, Connection]] = []
        for p in range(min(processes, len(nodes))):
            parent, child = ctx.Pipe(duplex=True)
            spec = SimSpec(tuple(nodes[p::processes]), otlp_static, push_s)
            process = ctx.Process(target=run_sim_process, args=(spec, child), daemon=True)
            self._children.append((process, parent))

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for process, conn in self._children:
            process.start()
            loop.add_reader(conn.fileno(), self._receive, conn)

    def _receive(self, conn: Connection) -> None:
        while conn.poll():
            try:
                message = conn.recv()
            except EOFError:
                asyncio.get_running_loop().remove_reader(conn.fileno())
                return
            if message[0] == "acks":
                for node, version, at in message[1]:
                    self.latest[node] = (version, at)
            elif message[0] == "burst":
                self.burst_sent[message[1]] = (message[2], message[3])
            elif message[0] == "counts":
                self.running_counts[conn.fileno()] = message[1]
            elif message[0] == "done":
                self.counts.append(message[1])

    def versions(self) -> set[str]:
        return {version for version, _ in self.latest.values()}

    async def wait_synced(self, timeout: float) -> str:
        """Every node ACKed the same route version; returns it."""
        deadline = time.monotonic() + timeout
        while len(self.latest) < len(self.nodes) or len(self.versions()) != 1:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(self.latest)}/{len(self.nodes)} simulated Envoys have routes, "
                    f"versions {sorted(self.versions())[:3]}"
                )
            await asyncio.sleep(0.02)
        return next(iter(self.versions()))

    async def wait_moved(self, old: str, since: float, timeout: float) -> list[float]:
        """Until every node ACKed a route version other than ``old`` after ``since``; each
        node's time from ``since``, sorted."""
        deadline = time.monotonic() + timeout
        while True:
            moved = [
                at - since for version, at in self.latest.values() if version != old and at >= since
            ]
            if len(moved) == len(self.nodes):
                return sorted(moved)
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(moved)}/{len(self.nodes)} nodes left {old}")
            await asyncio.sleep(0.002)

    def exports(self) -> int:
        """Exports acknowledged so far (as of each child's last report, within a second)."""
        return sum(c.get("exports", 0) for c in self.running_counts.values())

    def exporting(self, on: bool) -> None:
        """Pause or resume every node's stats pushes."""
        for _, conn in self._children:
            conn.send(("exporting", on))

    async def wait_at(self, version: str, timeout: float) -> None:
        """Until every node's latest route version is ``version``."""
        deadline = time.monotonic() + timeout
        while any(v != version for v, _ in self.latest.values()):
            if time.monotonic() > deadline:
                behind = sum(v != version for v, _ in self.latest.values())
                raise TimeoutError(f"{behind}/{len(self.nodes)} nodes not at {version}")
            await asyncio.sleep(0.01)

    def burst(self, node: str, errors: int) -> None:
        """``node``'s next export carries ``errors`` more canary requests, all 5xx."""
        for _, conn in self._children:
            conn.send(("burst", node, errors))

    def stop(self) -> dict[str, int]:
        for _, conn in self._children:
            conn.send(("stop",))
        for process, conn in self._children:
            deadline = time.monotonic() + 15
            while process.is_alive() and time.monotonic() < deadline:
                self._receive(conn)
                time.sleep(0.02)
            self._receive(conn)
            if process.is_alive():
                process.terminate()
            process.join(5)
        totals: dict[str, int] = {}
        for counts in self.counts:
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
        return totals
