"""Fleet propagation: a decision made by the leader -> every Envoy of the fleet applied it.

A real 3-member etcd cluster and control-plane replicas as their own processes
(``inferway run --no-envoy --store etcd://...``, bench/_fleet_cluster.py). Each decision is a
rollout command sent to the leader's admin API (promote, restart, abort, restart, ...: each
moves the canary's weight); the leader decides within the request, pushes to its own Envoys
and writes the state to etcd (fenced); every other replica gets it from its watch and pushes
it. The clock runs from sending the command until the last Envoy applied the new routes:

- real Envoys (one per replica, round robin): Envoy's admin reports the new RDS version
  (``http.edge.rds.edge.version_text``, polled every ``--poll-ms`` over keep-alive);
- simulated ADS clients (bench/_fleet_sim.py, child processes): the time each ACKed the new
  route version, on one replica and on several.

    .venv/bin/python bench/fleet_propagation.py --decisions 100 --sim-decisions 20
    .venv/bin/python bench/fleet_propagation.py --quick

Needs Debian's etcd-server (``etcd`` on PATH) and Envoy. Targets (issue 31): p99 < 100 ms
with 3 Envoys, p99 < 2 s with 1,000 simulated ADS clients.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests.* helpers

import aiohttp
from _common import environment, free_port, print_table, summarize, write_results
from _fleet_cluster import FleetCluster, render_fleet_policy
from _fleet_sim import SimFleet

from inferway.xds.bootstrap import build_bootstrap
from tests.envoy_process import EnvoyProcess
from tests.etcd_cluster import ETCD

__all__ = ["main"]

TARGET_ENVOYS_S = 0.100
TARGET_SIM_S = 2.0
CYCLE = ("promote", "restart", "abort", "restart")
"""Commands in turn: 100%, step 0 (20%), 0%, 20%: every one changes the routes."""
STATS = "/stats?filter=^http\\.edge\\.rds\\.edge\\.version_text$"


async def _route_version(session: aiohttp.ClientSession, admin: str) -> str | None:
    async with session.get(admin + STATS) as response:
        text = await response.text()
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name.endswith(".version_text"):
            return value.strip().strip('"')
    return None


async def _until_changed(
    session: aiohttp.ClientSession, admin: str, old: str | None, poll_s: float
) -> tuple[float, str | None]:
    deadline = time.monotonic() + 10
    while (seen := await _route_version(session, admin)) == old:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Envoy at {admin} still reports route version {old}")
        await asyncio.sleep(poll_s)
    return time.monotonic(), seen


async def run_envoys(
    workdir: Path, replicas: int, envoys: int, decisions: int, poll_s: float
) -> dict[str, Any]:
    policy = render_fleet_policy(listener_port=free_port(), backend_port=free_port())
    rows: list[dict[str, Any]] = []
    async with FleetCluster(workdir, policy, replicas=replicas) as fleet:
        leader = await fleet.leader()
        names = sorted(fleet.replicas)
        processes: list[tuple[str, EnvoyProcess]] = []
        sessions: list[aiohttp.ClientSession] = []
        try:
            for i in range(envoys):
                replica = fleet.replicas[names[i % len(names)]]
                bootstrap = build_bootstrap(
                    node_id=f"envoy-{i}", xds_port=replica.xds_port, admin_port=0
                )
                processes.append((replica.name, await EnvoyProcess(bootstrap).start()))
                sessions.append(
                    aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=1),
                        timeout=aiohttp.ClientTimeout(total=5),
                    )
                )
            admins = [envoy.admin_url for _, envoy in processes]
            pollers = list(zip(sessions, admins, strict=True))
            deadline = time.monotonic() + 30
            while len({await _route_version(s, a) for s, a in pollers} - {None}) != 1:
                if time.monotonic() > deadline:
                    raise TimeoutError("the Envoys never agreed on one route version")
                await asyncio.sleep(0.1)
            for i in range(decisions):
                command = CYCLE[i % len(CYCLE)]
                before = [await _route_version(s, a) for s, a in pollers]
                t0 = time.monotonic()
                waits = [
                    asyncio.create_task(_until_changed(s, a, old, poll_s))
                    for (s, a), old in zip(pollers, before, strict=True)
                ]
                await fleet.command(leader, command)
                decided = time.monotonic() - t0
                seen = await asyncio.gather(*waits)
                if len({version for _, version in seen}) != 1:
                    raise RuntimeError(f"decision {i}: the Envoys differ: {seen}")
                per_envoy = [at - t0 for at, _ in seen]
                rows.append(
                    {
                        "command": command,
                        "command_answered_s": decided,
                        "all_applied_s": max(per_envoy),
                        "per_envoy_s": per_envoy,
                    }
                )
                await asyncio.sleep(random.uniform(0.05, 0.15))
        finally:
            lost = fleet.leadership_lost()
            for session in sessions:
                await session.close()
            for _, envoy in processes:
                envoy.stop()
    via = [name for name, _ in processes]
    own = [r["per_envoy_s"][k] for r in rows for k, name in enumerate(via) if name == leader]
    other = [r["per_envoy_s"][k] for r in rows for k, name in enumerate(via) if name != leader]
    return {
        "scenario": "envoys",
        "leadership_lost": lost,
        "replicas": replicas,
        "clients": envoys,
        "decisions": len(rows),
        "all_applied": summarize([r["all_applied_s"] for r in rows]),
        "via_leader": summarize(own),
        "via_follower": summarize(other),
        "command_answered": summarize([r["command_answered_s"] for r in rows]),
        "target_ms": TARGET_ENVOYS_S * 1000,
        "rows": rows,
    }


async def run_simulated(
    workdir: Path, replicas: int, clients: int, decisions: int
) -> dict[str, Any]:
    policy = render_fleet_policy(listener_port=free_port(), backend_port=free_port())
    rows: list[dict[str, Any]] = []
    async with FleetCluster(workdir, policy, replicas=replicas) as fleet:
        leader = await fleet.leader()
        ports = [fleet.replicas[n].xds_port for n in sorted(fleet.replicas)]
        nodes = [(f"sim-{i:05d}", ports[i % len(ports)]) for i in range(clients)]
        sim = SimFleet(nodes)
        sim.start()
        try:
            started = time.monotonic()
            version = await sim.wait_synced(timeout=180)
            initial_s = time.monotonic() - started
            for i in range(decisions):
                command = CYCLE[i % len(CYCLE)]
                leader = await fleet.wait_leader()  # the connect storm may have cost its lease
                t0 = time.monotonic()
                await fleet.command(leader, command)
                decided = time.monotonic() - t0
                moved = await sim.wait_moved(version, t0, timeout=60)
                version = await sim.wait_synced(timeout=10)
                rows.append(
                    {
                        "command": command,
                        "command_answered_s": decided,
                        "all_applied_s": moved[-1],
                        "client_p50_s": moved[len(moved) // 2],
                    }
                )
                await asyncio.sleep(random.uniform(0.3, 0.5))
        finally:
            counts = sim.stop()
            lost = fleet.leadership_lost()
    return {
        "scenario": "simulated",
        "leadership_lost": lost,
        "replicas": replicas,
        "clients": clients,
        "decisions": len(rows),
        "initial_sync_s": round(initial_s, 3),
        "all_applied": summarize([r["all_applied_s"] for r in rows]),
        "client_p50": summarize([r["client_p50_s"] for r in rows]),
        "command_answered": summarize([r["command_answered_s"] for r in rows]),
        "client_errors": counts.get("errors", 0),
        "target_ms": TARGET_SIM_S * 1000,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3, help="control-plane replicas")
    parser.add_argument("--envoys", type=int, default=3, help="real Envoys")
    parser.add_argument("--decisions", type=int, default=100, help="decisions, real Envoys")
    parser.add_argument("--clients", type=int, default=1000, help="simulated ADS clients")
    parser.add_argument("--sim-replicas", default="1,3", help="replica counts for simulated")
    parser.add_argument("--sim-decisions", type=int, default=20, help="decisions, simulated")
    parser.add_argument("--poll-ms", type=float, default=2.0, help="Envoy admin poll interval")
    parser.add_argument("--quick", action="store_true", help="30 and 8 decisions")
    parser.add_argument("--json", type=Path, default=None, help="results path")
    args = parser.parse_args(argv)
    if ETCD is None:
        sys.exit("needs etcd on PATH (Debian: apt-get install etcd-server)")
    decisions = 30 if args.quick else args.decisions
    sim_decisions = 8 if args.quick else args.sim_decisions
    scenarios: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="inferway-fleet-propagation-") as tmp:
        base = Path(tmp)
        if args.envoys > 0 and decisions > 0:
            print(f"{args.envoys} Envoys on {args.replicas} replicas ...", file=sys.stderr)
            workdir = base / "envoys"
            workdir.mkdir()
            scenarios.append(
                asyncio.run(
                    run_envoys(workdir, args.replicas, args.envoys, decisions, args.poll_ms / 1e3)
                )
            )
        for count in [int(c) for c in args.sim_replicas.split(",") if c.strip()]:
            print(f"{args.clients} simulated clients on {count} replicas ...", file=sys.stderr)
            workdir = base / f"sim-{count}"
            workdir.mkdir()
            scenarios.append(
                asyncio.run(run_simulated(workdir, count, args.clients, sim_decisions))
            )
    print_table(
        "Fleet propagation: command to the leader -> every Envoy applied the new routes (ms)",
        [
            "Envoys",
            "replicas",
            "decisions",
            "p50",
            "p99",
            "max",
            "target p99",
            "met",
            "leases lost",
        ],
        [
            (
                f"{s['clients']} {'real' if s['scenario'] == 'envoys' else 'simulated'}",
                s["replicas"],
                s["decisions"],
                s["all_applied"]["p50_ms"],
                s["all_applied"]["p99_ms"],
                s["all_applied"]["max_ms"],
                f"< {s['target_ms']:g}",
                "yes" if s["all_applied"]["p99_ms"] < s["target_ms"] else "no",
                s["leadership_lost"],
            )
            for s in scenarios
        ],
    )
    path = write_results(
        "fleet_propagation",
        {
            "benchmark": "fleet_propagation",
            "command": " ".join(["bench/fleet_propagation.py", *(argv or sys.argv[1:])]),
            "targets": "p99 < 100 ms with 3 Envoys; p99 < 2 s with 1,000 simulated ADS clients",
            "environment": environment(),
            "scenarios": scenarios,
        },
        args.json,
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
