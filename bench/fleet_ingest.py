"""Fleet ingest: control-plane replicas taking the stats of 1,000 Envoys, and an error burst
on one Envoy rolled back on all of them.

A real 3-member etcd cluster and control-plane replicas as processes (bench/_fleet_cluster.py);
1,000 simulated Envoys in child processes (bench/_fleet_sim.py), each with an ADS stream and
Envoy's ``open_telemetry`` stat sink: a unary OTLP ``Export`` every ``--push-s`` (Envoy's
``stats_flush_interval`` that ``inferway`` writes, 2 s by default) whose body is a real
Envoy's export, captured at the start from an Envoy of the same policy, plus the node's own
running stable/canary counters. Measured per replica count:

- CPU per report: the replicas' CPU seconds (psutil, all replicas summed) over a window with
  every Envoy reporting, minus a window of the same length with the reports paused (the ADS
  streams, heartbeats and election stay), divided by the reports in the window;
- memory: each replica's RSS after the windows;
- burst -> rollback everywhere: the rollout is restarted (step 0, 20%), after ``--settle-s``
  one Envoy's next export carries ``--burst`` canary 5xx; the clock runs from that export
  being sent until every simulated Envoy ACKed the rolled-back routes (the decision's own
  time, from the leader's history, splits it into judging and pushing).

    .venv/bin/python bench/fleet_ingest.py --envoys 1000 --replicas 1,3
    .venv/bin/python bench/fleet_ingest.py --quick

Needs Debian's etcd-server (``etcd`` on PATH) and Envoy.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests.* helpers

import grpc
import httpx
import psutil
from _common import environment, free_port, print_table, summarize, write_results
from _fleet_cluster import FleetCluster, render_fleet_policy
from _fleet_sim import SimFleet
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as otlp
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
    MetricsServiceServicer,
    add_MetricsServiceServicer_to_server,
)

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.fleet.otlp_totals import CLUSTER
from inferway.policies import load_policy_text
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import start_xds_server
from tests.aiohttp_sites import answer_every_path, start_site
from tests.envoy_process import EnvoyProcess
from tests.etcd_cluster import ETCD

__all__ = ["main"]

VARYING = {"cluster.upstream_rq_completed", "cluster.upstream_rq_xx"}
"""The metrics whose stable/canary points each simulated Envoy writes itself."""


class _Capture(MetricsServiceServicer):
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def Export(
        self, request: otlp.ExportMetricsServiceRequest, context: grpc.aio.ServicerContext
    ) -> otlp.ExportMetricsServiceResponse:
        self.bodies.append(request.SerializeToString())
        return otlp.ExportMetricsServiceResponse()


async def capture_envoy_export() -> tuple[bytes, int]:
    """A real Envoy's stats export for this policy after some traffic, without the points
    the simulation writes; and how many metrics it holds."""
    from aiohttp import web

    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"version": "v1"})

    runner, backend_port = await start_site(answer_every_path(answer))
    listener_port = free_port()
    text = render_fleet_policy(listener_port=listener_port, backend_port=backend_port)
    cache = SnapshotCache()
    ControlPlane(cache).apply_policy(load_policy_text(text, "<capture>"), "<capture>")
    capture = _Capture()
    server = await start_xds_server(
        cache, services=[lambda s: add_MetricsServiceServicer_to_server(capture, s)]
    )
    bootstrap = build_bootstrap(
        node_id="capture", xds_port=server.port, admin_port=0, stats_push_s=0.5
    )
    try:
        async with EnvoyProcess(bootstrap), httpx.AsyncClient(timeout=5) as client:
            for _ in range(50):
                await client.get(f"http://127.0.0.1:{listener_port}/infer")
            seen = len(capture.bodies)
            deadline = time.monotonic() + 10
            while len(capture.bodies) < seen + 2:
                if time.monotonic() > deadline:
                    raise TimeoutError("the Envoy pushed no stats")
                await asyncio.sleep(0.1)
    finally:
        await server.stop(0)
        await runner.cleanup()
    request = otlp.ExportMetricsServiceRequest.FromString(capture.bodies[-1])
    metrics = 0
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                metrics += 1
                if metric.name in VARYING and metric.WhichOneof("data") == "sum":
                    keep = [
                        p
                        for p in metric.sum.data_points
                        if not any(
                            a.key == CLUSTER and a.value.string_value in ("v1", "v2")
                            for a in p.attributes
                        )
                    ]
                    del metric.sum.data_points[:]
                    metric.sum.data_points.extend(keep)
    return request.SerializeToString(), metrics


def _cpu(processes: list[psutil.Process]) -> float:
    return sum(p.cpu_times().user + p.cpu_times().system for p in processes)


async def _window(
    sim: SimFleet, processes: list[psutil.Process], seconds: float
) -> tuple[float, int]:
    cpu, exports = _cpu(processes), sim.exports()
    await asyncio.sleep(seconds)
    await asyncio.sleep(1.1)  # the children's counts lag by up to a second
    cpu_used = _cpu(processes) - cpu
    return cpu_used, sim.exports() - exports


async def run_scenario(
    workdir: Path, args: argparse.Namespace, replicas: int, template: bytes
) -> dict[str, Any]:
    policy = render_fleet_policy(
        listener_port=free_port(), backend_port=free_port(), interval=f"{args.interval}s"
    )
    async with FleetCluster(workdir, policy, replicas=replicas) as fleet:
        leader = await fleet.leader()
        names = sorted(fleet.replicas)
        nodes = [
            (f"sim-{i:05d}", fleet.replicas[names[i % len(names)]].xds_port)
            for i in range(args.envoys)
        ]
        processes = [psutil.Process(r.process.pid) for r in fleet.replicas.values()]
        sim = SimFleet(nodes, otlp_static=template, push_s=args.push_s)
        sim.start()
        bursts: list[dict[str, Any]] = []
        try:
            version = at_step_0 = await sim.wait_synced(timeout=180)  # started at 20%
            await asyncio.sleep(2 * args.push_s + 1)  # every node reported at least once
            sim.exporting(False)
            await asyncio.sleep(args.push_s)
            idle_cpu, idle_exports = await _window(sim, processes, args.window_s)
            sim.exporting(True)
            await asyncio.sleep(args.push_s)
            busy_cpu, exports = await _window(sim, processes, args.window_s)
            rss = {r.name: psutil.Process(r.process.pid).memory_info().rss / 2**20 for r in
                   fleet.replicas.values()}  # fmt: skip
            status = await fleet.status(fleet.replicas[leader])
            reporting = len(status["fleet"]["envoys"])
            # a follower's Envoy when there is one: its evidence crosses etcd
            burst_nodes = [n for n, port in nodes if port != fleet.replicas[leader].xds_port]
            burst_nodes = burst_nodes or [n for n, _ in nodes]
            for k in range(args.bursts):
                leader = await fleet.wait_leader()
                await fleet.command(leader, "restart")  # fresh evidence, step 0 (20%)
                await sim.wait_at(at_step_0, timeout=60)
                version = at_step_0
                await asyncio.sleep(args.settle_s)
                node = burst_nodes[(k * 97) % len(burst_nodes)]
                sim.burst(node, args.burst)
                deadline = time.monotonic() + 10
                while node not in sim.burst_sent:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{node} never sent its burst")
                    await asyncio.sleep(0.005)
                sent, sent_unix = sim.burst_sent.pop(node)
                moved = await sim.wait_moved(version, sent, timeout=60)
                version = await sim.wait_synced(timeout=10)
                rollout = await fleet.rollout(fleet.replicas[leader])
                last = rollout["history"][-1]
                if rollout["phase"] != "rolled_back" or last["action"] != "rollback":
                    raise RuntimeError(f"burst {k}: not rolled back: {rollout['phase']} {last}")
                bursts.append(
                    {
                        "node": node,
                        "all_applied_s": moved[-1],
                        "decided_s": last["at"] - sent_unix,
                        "reason": last["reason"],
                    }
                )
                print(f"burst {k + 1}: rolled back everywhere in {moved[-1]:.3f}s", file=sys.stderr)
        except BaseException:
            for replica in fleet.replicas.values():
                rollout = await fleet.rollout(replica)
                print(f"--- {replica.name}: {rollout['phase']}", file=sys.stderr)
                for decision in rollout["history"][-6:]:
                    print(decision["at"], decision["action"], decision["reason"], file=sys.stderr)
                print(replica.log_tail(), file=sys.stderr)
            raise
        finally:
            counts = sim.stop()
            lost = fleet.leadership_lost()
    reports_per_s = exports / (args.window_s + 1.1)
    return {
        "replicas": replicas,
        "leadership_lost": lost,
        "envoys": args.envoys,
        "push_s": args.push_s,
        "analysis_interval_s": args.interval,
        "reports_in_window": exports,
        "reports_per_s": round(reports_per_s, 1),
        "reports_while_paused": idle_exports,
        "cpu_s_busy": round(busy_cpu, 3),
        "cpu_s_idle": round(idle_cpu, 3),
        "cpu_ms_per_report": round(1000 * (busy_cpu - idle_cpu) / max(1, exports), 3),
        "cpu_ms_per_report_total": round(1000 * busy_cpu / max(1, exports), 3),
        "cpu_cores_for_reports": round((busy_cpu - idle_cpu) / (args.window_s + 1.1), 3),
        "rss_mib": {k: round(v, 1) for k, v in rss.items()},
        "envoys_reporting": reporting,
        "burst_to_all_rolled_back": summarize([b["all_applied_s"] for b in bursts]),
        "burst_to_decision": summarize([b["decided_s"] for b in bursts]),
        "bursts": bursts,
        "client_errors": counts.get("errors", 0),
        "export_errors": counts.get("export_errors", 0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envoys", type=int, default=1000, help="simulated Envoys")
    parser.add_argument("--replicas", default="1,3", help="replica counts to measure")
    parser.add_argument("--push-s", type=float, default=2.0, help="stats push interval")
    parser.add_argument("--interval", type=float, default=1.0, help="rollout analysis interval")
    parser.add_argument("--window-s", type=float, default=20.0, help="CPU window")
    parser.add_argument("--bursts", type=int, default=5, help="error bursts per replica count")
    parser.add_argument("--burst", type=int, default=500, help="canary 5xx in the burst")
    parser.add_argument("--settle-s", type=float, default=4.0, help="restart -> burst")
    parser.add_argument("--quick", action="store_true", help="10 s windows, 3 bursts")
    parser.add_argument("--json", type=Path, default=None, help="results path")
    args = parser.parse_args(argv)
    if ETCD is None:
        sys.exit("needs etcd on PATH (Debian: apt-get install etcd-server)")
    if args.quick:
        args.window_s, args.bursts = 10.0, 3
    scenarios = []
    with tempfile.TemporaryDirectory(prefix="inferway-fleet-ingest-") as tmp:
        template, metrics = asyncio.run(capture_envoy_export())
        print(f"captured a real Envoy export: {len(template)} bytes, {metrics} metrics",
              file=sys.stderr)  # fmt: skip
        for count in [int(c) for c in args.replicas.split(",") if c.strip()]:
            print(f"{args.envoys} Envoys reporting to {count} replicas ...", file=sys.stderr)
            workdir = Path(tmp) / f"r{count}"
            workdir.mkdir()
            scenarios.append(asyncio.run(run_scenario(workdir, args, count, template)))
    print_table(
        f"Fleet ingest: {args.envoys} Envoys pushing stats every {args.push_s:g} s "
        f"(real export, {len(template)} B, {metrics} metrics)",
        [
            "replicas",
            "reports/s",
            "CPU ms/report",
            "cores for reports",
            "RSS MiB (each)",
            "burst->all rolled back p50 ms",
            "max ms",
            "burst->decision p50 ms",
        ],
        [
            (
                s["replicas"],
                s["reports_per_s"],
                s["cpu_ms_per_report"],
                s["cpu_cores_for_reports"],
                " ".join(f"{v:g}" for v in s["rss_mib"].values()),
                s["burst_to_all_rolled_back"].get("p50_ms"),
                s["burst_to_all_rolled_back"].get("max_ms"),
                s["burst_to_decision"].get("p50_ms"),
            )
            for s in scenarios
        ],
    )
    path = write_results(
        "fleet_ingest",
        {
            "benchmark": "fleet_ingest",
            "command": " ".join(["bench/fleet_ingest.py", *(argv or sys.argv[1:])]),
            "export_bytes": len(template),
            "export_metrics": metrics,
            "environment": environment(),
            "scenarios": scenarios,
        },
        args.json,
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
