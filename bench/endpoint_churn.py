"""Endpoint churn: one endpoint changes in a 10,000-endpoint fleet; SotW vs delta xDS.

One control plane (SnapshotCache + ADS server, with the server's own XdsStats counters) runs
in this process; N simulated Envoys run in a separate client process, each on its own ADS
stream, either state-of-the-world or delta. Each subscribes like Envoy (CDS and LDS wildcard,
EDS for every cluster, RDS for every listener) and ACKs every response. After every client
ACKed the initial snapshot, one endpoint of one service moves; the clock runs from
``set_snapshot`` until every client ACKed every type of the new version, and the server's
counters say how many responses, resources and bytes that change cost.

    .venv/bin/python bench/endpoint_churn.py                      # 100 x 100, clients 1,50
    .venv/bin/python bench/endpoint_churn.py --quick              # fewer changes
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

from _common import build_bench_policy, environment, print_table, summarize, write_results

from inferway.policies.model import Endpoint, Policy
from inferway.resolve import resolve_policy
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import start_xds_server
from inferway.xds.snapshot import build_snapshot
from inferway.xds.stats import XdsStats
from inferway.xds.translate import translate

__all__ = ["main", "run_churn"]

SERVICES = 100
ENDPOINTS_PER_SERVICE = 100
LISTENERS = 10


def build_fleet(services: int, per_service: int) -> Policy:
    return build_bench_policy(
        listeners=LISTENERS, services=services, endpoints_per_service=per_service
    )


def moved(policy: Policy, step: int) -> Policy:
    """The fleet with endpoint 0 of service 0 on another port (a replica rescheduled)."""
    service = policy.services[0]
    first = service.endpoints[0]
    endpoints = [Endpoint(host=first.host, port=9000 + step), *service.endpoints[1:]]
    services = [service.model_copy(update={"endpoints": endpoints}), *policy.services[1:]]
    return policy.model_copy(update={"services": services})


# -- simulated Envoys (client process) ----------------------------------------------------------


def _client_process(
    port: int,
    protocol: str,
    node_ids: list[str],
    names: dict[str, list[str]],
    stop: MpEvent,
    report: Connection,
) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    report.send(asyncio.run(_run_clients(port, protocol, node_ids, names, stop)))
    report.close()


async def _run_clients(
    port: int, protocol: str, node_ids: list[str], names: dict[str, list[str]], stop: MpEvent
) -> dict[str, int]:
    import grpc

    from inferway._xds_protos.envoy.service.discovery.v3 import ads_pb2_grpc

    counts = {"responses": 0, "errors": 0}
    options = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options)
    stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    run = _sotw_client if protocol == "sotw" else _delta_client
    tasks = [asyncio.create_task(run(stub, node_id, names, counts)) for node_id in node_ids]
    while not stop.is_set():
        await asyncio.sleep(0.05)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await channel.close(grace=None)
    return counts


async def _sotw_client(
    stub: Any, node_id: str, names: dict[str, list[str]], counts: dict[str, int]
) -> None:
    from inferway._xds_protos.envoy.config.core.v3 import base_pb2
    from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2

    call = stub.StreamAggregatedResources()
    node = base_pb2.Node(id=node_id, cluster="bench")
    try:
        for type_url in (
            type_urls.CLUSTER,
            type_urls.ENDPOINT,
            type_urls.LISTENER,
            type_urls.ROUTE,
        ):
            await call.write(
                discovery_pb2.DiscoveryRequest(
                    node=node, type_url=type_url, resource_names=names.get(type_url, [])
                )
            )
        while (response := await call.read()) is not None and hasattr(response, "type_url"):
            counts["responses"] += 1
            await call.write(
                discovery_pb2.DiscoveryRequest(
                    type_url=response.type_url,
                    resource_names=names.get(response.type_url, []),
                    version_info=response.version_info,
                    response_nonce=response.nonce,
                )
            )
    except asyncio.CancelledError:
        call.cancel()
        raise
    except Exception:
        counts["errors"] += 1


async def _delta_client(
    stub: Any, node_id: str, names: dict[str, list[str]], counts: dict[str, int]
) -> None:
    from inferway._xds_protos.envoy.config.core.v3 import base_pb2
    from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2

    call = stub.DeltaAggregatedResources()
    node = base_pb2.Node(id=node_id, cluster="bench")
    try:
        for type_url in (
            type_urls.CLUSTER,
            type_urls.ENDPOINT,
            type_urls.LISTENER,
            type_urls.ROUTE,
        ):
            await call.write(
                discovery_pb2.DeltaDiscoveryRequest(
                    node=node,
                    type_url=type_url,
                    resource_names_subscribe=names.get(type_url, []),
                )
            )
        while (response := await call.read()) is not None and hasattr(response, "type_url"):
            counts["responses"] += 1
            await call.write(
                discovery_pb2.DeltaDiscoveryRequest(
                    type_url=response.type_url, response_nonce=response.nonce
                )
            )
    except asyncio.CancelledError:
        call.cancel()
        raise
    except Exception:
        counts["errors"] += 1


# -- the control plane side (this process) ------------------------------------------------------


async def run_churn(
    policy: Policy, protocol: str, clients: int, changes: int, timeout: float = 60.0
) -> dict[str, Any]:
    cache = SnapshotCache()
    stats = XdsStats()
    cache.add_hook(stats)
    initial = build_snapshot(translate(resolve_policy(policy)))
    cache.set_snapshot(initial)
    server = await start_xds_server(cache, max_message_bytes=256 * 1024 * 1024)
    names = {
        type_urls.ENDPOINT: sorted(initial.resources_of(type_urls.ENDPOINT)),
        type_urls.ROUTE: sorted(initial.resources_of(type_urls.ROUTE)),
    }
    node_ids = [f"{protocol}-{i}" for i in range(clients)]
    context = mp.get_context("spawn")
    stop = context.Event()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_client_process,
        args=(server.port, protocol, node_ids, names, stop, sender),
        daemon=True,
    )
    process.start()
    try:
        started = time.perf_counter()
        if not await cache.wait_for_acks(initial.version, node_ids=node_ids, timeout=timeout):
            raise RuntimeError(f"{protocol}: clients did not ACK the initial snapshot")
        initial_s = time.perf_counter() - started
        initial_bytes = stats.totals().bytes
        push_s: list[float] = []
        build_s: list[float] = []
        per_change: list[dict[str, int]] = []
        for step in range(1, changes + 1):
            stats.reset()
            t0 = time.perf_counter()
            snapshot = build_snapshot(translate(resolve_policy(moved(policy, step))))
            t1 = time.perf_counter()
            cache.set_snapshot(snapshot)
            if not await cache.wait_for_acks(snapshot.version, node_ids=node_ids, timeout=timeout):
                raise RuntimeError(f"{protocol}: clients did not ACK change {step}")
            push_s.append(time.perf_counter() - t1)
            build_s.append(t1 - t0)
            total = stats.totals()
            per_change.append(
                {"responses": total.responses, "resources": total.resources, "bytes": total.bytes}
            )
    finally:
        stop.set()
        counts = receiver.recv() if receiver.poll(10) else {}
        process.join(10)
        if process.is_alive():
            process.kill()
        await server.stop(0.1)
    last = per_change[-1]
    return {
        "protocol": protocol,
        "clients": clients,
        "changes": changes,
        "initial_sync_s": round(initial_s, 3),
        "initial_bytes": initial_bytes,
        "push": summarize(push_s),
        "snapshot_build": summarize(build_s),
        "responses_per_change": last["responses"],
        "resources_per_change": last["resources"],
        "bytes_per_change": last["bytes"],
        "client_counts": counts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,50", help="comma-separated client counts")
    parser.add_argument("--changes", type=int, default=10, help="endpoint changes per run")
    parser.add_argument("--services", type=int, default=SERVICES)
    parser.add_argument("--endpoints", type=int, default=ENDPOINTS_PER_SERVICE)
    parser.add_argument("--quick", action="store_true", help="3 changes per run")
    args = parser.parse_args(argv)
    changes = 3 if args.quick else args.changes
    policy = build_fleet(args.services, args.endpoints)
    total_endpoints = sum(len(s.endpoints) for s in policy.services)
    results = []
    for clients in [int(c) for c in args.clients.split(",")]:
        for protocol in ("sotw", "delta"):
            results.append(asyncio.run(run_churn(policy, protocol, clients, changes)))
    rows = [
        [
            r["protocol"],
            r["clients"],
            r["push"]["p50_ms"],
            r["push"]["max_ms"],
            r["responses_per_change"],
            r["resources_per_change"],
            f"{r['bytes_per_change']:,}",
            r["snapshot_build"]["p50_ms"],
            f"{r['initial_bytes']:,}",
        ]
        for r in results
    ]
    print_table(
        f"Endpoint churn: 1 endpoint moves among {total_endpoints:,} "
        f"({args.services} services), {changes} changes",
        [
            "protocol",
            "clients",
            "push→all ACK p50 ms",
            "max ms",
            "responses",
            "resources",
            "bytes sent",
            "snapshot build ms",
            "initial sync bytes",
        ],
        rows,
    )
    path = write_results(
        "endpoint_churn",
        {
            "environment": environment(),
            "command": " ".join([sys.executable, *sys.argv]),
            "services": args.services,
            "endpoints": total_endpoints,
            "results": results,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
