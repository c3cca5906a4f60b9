"""Zone-aware EDS: what per-zone renderings cost the control plane.

Every Envoy with a locality gets its zone's rendering (its own zone's endpoints first), shared
by all nodes of that zone (node group ``zone:<region>/<zone>``). This measures, on a policy of
``--services`` services x ``--endpoints`` endpoints spread over ``--zones`` zones, with
``--nodes`` Envoys connected evenly across the zones: the time of one policy apply (resolve,
translate, the default snapshot and every zone's), against the same apply with Envoys without
a locality (one rendering), and how many distinct snapshots the cache holds (one per zone, not
per node). Pure control-plane work: no sockets.

    .venv/bin/python bench/zone_renderings.py                # 100 x 30 over 3 zones, 1,000 nodes
    .venv/bin/python bench/zone_renderings.py --quick
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from _common import environment, print_table, summarize, write_results

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.gateway.control_plane import ControlPlane
from inferway.policies.model import Backend, Endpoint, Listener, Policy, Route, Service
from inferway.xds.cache import SnapshotCache
from inferway.xds.node_groups import node_group

__all__ = ["main"]


def zoned_policy(services: int, endpoints: int, zones: int, shift: int = 0) -> Policy:
    """``services`` services of ``endpoints`` endpoints, round-robin over ``zones`` zones;
    ``shift`` moves one endpoint's port (an edit that changes one assignment)."""
    return Policy(
        listeners=[Listener(name="edge", port=10000)],
        services=[
            Service(
                name=f"svc-{s}",
                endpoints=[
                    Endpoint(
                        host=f"10.{s // 250}.{s % 250}.{e + 1}",
                        port=8000 + (shift if s == 0 and e == 0 else 0),
                        zone=f"zone-{e % zones}",
                        region="r1",
                    )
                    for e in range(endpoints)
                ],
            )
            for s in range(services)
        ],
        routes=[Route(name="all", backends=[Backend(service="svc-0")])],
    )


def measure(args: argparse.Namespace, *, with_locality: bool) -> dict[str, object]:
    cache = SnapshotCache(node_group=node_group)
    plane = ControlPlane(cache)
    plane.apply_policy(zoned_policy(args.services, args.endpoints, args.zones), "bench")
    for n in range(args.nodes):
        zone = f"zone-{n % args.zones}" if with_locality else ""
        region = "r1" if with_locality else ""
        locality = base_pb2.Locality(zone=zone, region=region)
        cache.open_stream(base_pb2.Node(id=f"envoy-{n}", cluster="c", locality=locality))
    policies = [
        zoned_policy(args.services, args.endpoints, args.zones, shift=step)
        for step in range(1, 2 * args.applies + 2)
    ]
    times = []
    for policy in policies[: args.applies]:
        start = time.perf_counter()
        plane.apply_policy(policy, "bench")
        times.append(time.perf_counter() - start)
    tracemalloc.start()  # the snapshots one more apply keeps, measured apart from the timing
    before = tracemalloc.take_snapshot()
    plane.apply_policy(policies[args.applies], "bench")
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    groups = [g for g in cache.groups() if cache.get_snapshot(g) is not None]
    distinct = {id(cache.get_snapshot(g)) for g in groups}
    return {
        "with_locality": with_locality,
        "apply_s": summarize(times),
        "groups": len(groups),
        "distinct_snapshots": len(distinct),
        "memory_growth_bytes": grown,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--endpoints", type=int, default=30)
    parser.add_argument("--zones", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--applies", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.services, args.nodes, args.applies = 20, 100, 3
    results = [measure(args, with_locality=False), measure(args, with_locality=True)]
    rows = [
        [
            "zones" if r["with_locality"] else "no locality",
            r["groups"],
            r["distinct_snapshots"],
            r["apply_s"]["p50_ms"],  # type: ignore[index]
            r["apply_s"]["max_ms"],  # type: ignore[index]
            round(int(r["memory_growth_bytes"]) / 1e6, 1),  # type: ignore[call-overload]
        ]
        for r in results
    ]
    title = (
        f"one apply, {args.services} services x {args.endpoints} endpoints over {args.zones} "
        f"zones, {args.nodes} Envoys"
    )
    columns = ["Envoys", "groups", "snapshots", "apply p50 ms", "apply max ms", "MB kept"]
    print_table(title, columns, rows)
    write_results(
        "zone_renderings",
        {"args": vars(args), "results": results, "environment": environment()},
    )


if __name__ == "__main__":
    main()
