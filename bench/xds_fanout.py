"""xDS fan-out: how long until N Envoys have all accepted a policy change?

One control plane (SnapshotCache + ADS server) runs in this process; N simulated Envoys run in
separate client processes, so the control plane's own CPU time and memory are measurable. Each
simulated Envoy opens one ADS stream, subscribes to CDS and LDS (wildcard), then to EDS and RDS
for the names those return, and ACKs every response, as Envoy does. After every client has
ACKed the initial snapshot, the policy changes (a canary weight moves) and the clock runs from
``set_snapshot`` until every client has ACKed every type of the new version.

    .venv/bin/python bench/xds_fanout.py --clients 100,1000 --changes 5
    .venv/bin/python bench/xds_fanout.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import psutil
from _common import (
    build_bench_policy,
    environment,
    print_table,
    summarize,
    write_results,
)

from inferway.resolve import resolve_policy
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from inferway.xds.hooks import XdsObserver
from inferway.xds.server import start_xds_server
from inferway.xds.snapshot import Snapshot, build_snapshot
from inferway.xds.translate import translate

__all__ = ["main", "run_fanout"]

TARGET_S = 2.0
"""The fan-out target this benchmark checks: 1,000 clients all ACKed within 2 s."""

STREAMS_PER_CHANNEL = 50
CLIENT_PROCESSES = 2


def build_change_snapshot(canary_weight: float) -> Snapshot:
    return build_snapshot(
        translate(resolve_policy(build_bench_policy(canary_weight=canary_weight)))
    )


# -- the simulated Envoys (run in client processes) ---------------------------------------------


def _client_process(port: int, node_ids: list[str], stop: MpEvent, report: Connection) -> None:
    """Entry point of one client process: one grpc.aio channel per STREAMS_PER_CHANNEL streams."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    counts = asyncio.run(_run_clients(port, node_ids, stop))
    report.send(counts)
    report.close()


async def _run_clients(port: int, node_ids: list[str], stop: MpEvent) -> dict[str, int]:
    import grpc

    from inferway._xds_protos.envoy.service.discovery.v3 import ads_pb2_grpc

    counts = {"responses": 0, "acks": 0, "errors": 0}
    options = [
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    channels = []
    tasks = []
    for start in range(0, len(node_ids), STREAMS_PER_CHANNEL):
        # A distinct channel arg keeps grpc from sharing one TCP connection across channels.
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[*options, ("bench.channel", start)]
        )
        channels.append(channel)
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        for node_id in node_ids[start : start + STREAMS_PER_CHANNEL]:
            tasks.append(asyncio.create_task(_simulated_envoy(stub, node_id, counts)))
    while not stop.is_set():
        await asyncio.sleep(0.05)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close(grace=None)
    return counts


@dataclass
class _TypeState:
    names: list[str] = field(default_factory=list)
    version: str = ""
    nonce: str = ""


async def _simulated_envoy(stub: Any, node_id: str, counts: dict[str, int]) -> None:
    """One ADS stream behaving like Envoy's state-of-the-world client."""
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
            counts["responses"] += 1
            s = state.get(response.type_url)
            if s is None:
                continue
            s.version, s.nonce = response.version_info, response.nonce
            await send(response.type_url)  # the ACK
            counts["acks"] += 1
            if response.type_url == type_urls.CLUSTER:
                wanted = _eds_names(response)
                follow = type_urls.ENDPOINT
            elif response.type_url == type_urls.LISTENER:
                wanted = _rds_names(response)
                follow = type_urls.ROUTE
            else:
                continue
            if wanted != state[follow].names:
                state[follow].names = wanted
                await send(follow)
    except asyncio.CancelledError:
        call.cancel()
        raise
    except Exception:
        counts["errors"] += 1


def _eds_names(response: Any) -> list[str]:
    from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2

    names = []
    for any_msg in response.resources:
        cluster = cluster_pb2.Cluster.FromString(any_msg.value)
        if cluster.type == cluster_pb2.Cluster.EDS:
            names.append(cluster.eds_cluster_config.service_name or cluster.name)
    return sorted(names)


def _rds_names(response: Any) -> list[str]:
    from inferway._xds_protos.envoy.config.listener.v3 import listener_pb2
    from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    names = set()
    for any_msg in response.resources:
        listener = listener_pb2.Listener.FromString(any_msg.value)
        for chain in listener.filter_chains:
            for network_filter in chain.filters:
                hcm = hcm_pb2.HttpConnectionManager()
                if network_filter.typed_config.Unpack(hcm) and hcm.HasField("rds"):
                    names.add(hcm.rds.route_config_name)
    return sorted(names)


# -- the control plane side (this process) ------------------------------------------------------


class _AckClock(XdsObserver):
    """Cache hook: the moment the last of ``expected`` nodes ACKed every required type of a
    version. O(1) per ACK, so it adds nothing measurable to the control plane."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}
        self.expected = 0
        self.done_nodes: set[str] = set()
        self.node_types: dict[str, set[str]] = {}
        self.finished_at: float | None = None
        self.pushes = 0

    def arm(self, snapshot: Snapshot, previous: Snapshot, expected: int) -> None:
        """Only the types whose version changed are pushed again, so only they are ACKed."""
        self.pending = {
            t: v
            for t, v in snapshot.versions.items()
            if previous.versions.get(t) != v
            and (t in (type_urls.CLUSTER, type_urls.LISTENER) or snapshot.resources_of(t))
        }
        self.expected = expected
        self.done_nodes = set()
        self.node_types = {}
        self.finished_at = None

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None:
        self.pushes += 1

    def on_ack(self, node_id: str, type_url: str, version: str) -> None:
        if self.pending.get(type_url) != version or node_id in self.done_nodes:
            return
        types = self.node_types.setdefault(node_id, set())
        types.add(type_url)
        if len(types) == len(self.pending):
            self.done_nodes.add(node_id)
            if len(self.done_nodes) == self.expected:
                self.finished_at = time.perf_counter()


async def _all_connected(cache: SnapshotCache, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum(1 for s in cache.node_status() if s.connected) < count:
        if time.monotonic() > deadline:
            connected = sum(1 for s in cache.node_status() if s.connected)
            raise TimeoutError(f"only {connected} of {count} simulated Envoys connected")
        await asyncio.sleep(0.05)


async def run_fanout(clients: int, changes: int) -> dict[str, Any]:
    """One scenario: ``clients`` simulated Envoys, ``changes`` canary-weight changes."""
    me = psutil.Process()
    cache = SnapshotCache()
    clock = _AckClock()
    cache.add_hook(clock)
    initial = build_change_snapshot(10.0)
    assert not initial.consistent(), initial.consistent()
    cache.set_snapshot(initial)
    server = await start_xds_server(cache, port=0)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    node_ids = [f"sim-{i:05d}" for i in range(clients)]
    procs: list[tuple[Any, Connection]] = []
    nprocs = min(CLIENT_PROCESSES, clients)
    for p in range(nprocs):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_client_process,
            args=(server.port, node_ids[p::nprocs], stop, send),
            daemon=True,
        )
        proc.start()
        procs.append((proc, receive))
    rows: list[dict[str, Any]] = []
    try:
        started = time.perf_counter()
        await _all_connected(cache, clients, timeout=120)
        if not await cache.wait_for_acks(initial.version, timeout=120):
            raise TimeoutError("the simulated Envoys did not all ACK the initial snapshot")
        initial_s = time.perf_counter() - started
        rss_initial = me.memory_info().rss
        previous = initial
        for i in range(changes):
            weight = [20.0, 30.0, 5.0, 0.1, 50.0, 10.0][i % 6]
            snapshot = build_change_snapshot(weight)
            clock.arm(snapshot, previous, clients)
            pushes_before = clock.pushes
            cpu_before = me.cpu_times()
            t0 = time.perf_counter()
            changed = cache.set_snapshot(snapshot)
            acked = await cache.wait_for_acks(snapshot.version, timeout=60)
            t_wait = time.perf_counter()
            cpu_after = me.cpu_times()
            if not (changed and acked and clock.finished_at is not None):
                raise RuntimeError(f"change {i}: not every client ACKed version {snapshot.version}")
            rows.append(
                {
                    "change": i,
                    "canary_weight": weight,
                    "all_acked_s": clock.finished_at - t0,
                    "wait_for_acks_s": t_wait - t0,
                    "cpu_s": (cpu_after.user - cpu_before.user)
                    + (cpu_after.system - cpu_before.system),
                    "pushes": clock.pushes - pushes_before,
                }
            )
            previous = snapshot
            await asyncio.sleep(0.2)
        rss_after = me.memory_info().rss
    finally:
        stop.set()
        counts = []
        for proc, receive in procs:
            if receive.poll(30):
                counts.append(receive.recv())
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        await server.stop(grace=0.5)
    errors = sum(c.get("errors", 0) for c in counts)
    all_acked = [r["all_acked_s"] for r in rows]
    return {
        "clients": clients,
        "changes": rows,
        "initial_sync_s": round(initial_s, 3),
        "all_acked": summarize(all_acked),
        "wait_for_acks": summarize([r["wait_for_acks_s"] for r in rows]),
        "cpu_s_per_change_max": round(max(r["cpu_s"] for r in rows), 3),
        "cpu_s_per_change_mean": round(sum(r["cpu_s"] for r in rows) / len(rows), 3),
        "rss_mib_after_initial": round(rss_initial / 2**20, 1),
        "rss_mib_end": round(rss_after / 2**20, 1),
        "client_errors": errors,
        "resources": {
            type_urls.SHORT_NAMES[t]: len(initial.resources_of(t))
            for t in initial.type_urls()
            if t in type_urls.SHORT_NAMES
        },
        "target_met": max(all_acked) <= TARGET_S if clients >= 1000 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="100,1000", help="comma-separated client counts")
    parser.add_argument("--changes", type=int, default=5, help="policy changes per scenario")
    parser.add_argument("--quick", action="store_true", help="100 and 1000 clients, 3 changes")
    parser.add_argument("--json", default=None, help="results path (default bench/results/)")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    changes = 3 if args.quick else args.changes
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    scenarios = []
    for clients in counts:
        print(f"xds_fanout: {clients} clients, {changes} changes ...", file=sys.stderr)
        scenarios.append(asyncio.run(run_fanout(clients, changes)))
    print_table(
        "xDS fan-out: set_snapshot -> every client ACKed every type (control plane process)",
        [
            "clients",
            "initial sync s",
            "p50 ms",
            "max ms",
            "wait_for_acks p50 ms",
            "CP CPU s/change",
            "CP RSS MiB",
            "errors",
            f"all ACKed <= {TARGET_S:g} s",
        ],
        [
            (
                s["clients"],
                s["initial_sync_s"],
                s["all_acked"]["p50_ms"],
                s["all_acked"]["max_ms"],
                s["wait_for_acks"]["p50_ms"],
                s["cpu_s_per_change_mean"],
                s["rss_mib_end"],
                s["client_errors"],
                "yes" if s["all_acked"]["max_ms"] <= TARGET_S * 1000 else "no",
            )
            for s in scenarios
        ],
    )
    path = write_results(
        "xds_fanout",
        {
            "benchmark": "xds_fanout",
            "command": " ".join(["bench/xds_fanout.py", *(argv or sys.argv[1:])]),
            "target": f"1000 clients all ACKed within {TARGET_S} s of a change",
            "environment": environment(),
            "scenarios": scenarios,
        },
        None if args.json is None else __import__("pathlib").Path(args.json),
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
