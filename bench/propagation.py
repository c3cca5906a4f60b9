"""Policy propagation: from saving the policy file to Envoy serving the new routes.

The production path end to end, in one process plus Envoy: PolicyWatcher (watchfiles) ->
load_policy_text -> ControlPlane (translate, snapshot) -> SnapshotCache -> ADS server ->
the real Envoy (run by EnvoySupervisor). Each edit moves a canary weight and is written with an
atomic replace; the clock stops when Envoy's admin API reports the new RDS version
(``/stats`` text readout ``http.<listener>.rds.<route config>.version_text``, polled about
every millisecond over one keep-alive connection). Stage times come from the watcher's
``on_reload`` callback (file saved -> snapshot set) and a cache hook (-> Envoy ACKed).

Several watcher debounce settings run side by side in one run (these machines are noisy):

    .venv/bin/python bench/propagation.py --edits 60 --debounce-ms 50,10
    .venv/bin/python bench/propagation.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from _common import environment, free_port, print_table, summarize, write_results
from aiohttp import web

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.supervisor import EnvoySupervisor
from inferway.gateway.watcher import PolicyWatcher, ReloadResult
from inferway.policies import load_policy_text
from inferway.resolve import resolve_policy
from inferway.xds import type_urls
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.hooks import XdsObserver
from inferway.xds.server import start_xds_server
from inferway.xds.snapshot import build_snapshot
from inferway.xds.translate import translate

__all__ = ["main", "run_propagation"]

TARGET_P50_S = 0.050
LISTENER = "edge"
NODE_ID = "bench-propagation"
WEIGHTS = (10.0, 20.0, 5.0, 0.1, 50.0, 1.0)


def render_policy(listener_port: int, backend_port: int, canary_weight: float) -> str:
    return (
        "version: 1\n"
        "listeners:\n"
        f"  - name: {LISTENER}\n    port: {listener_port}\n"
        "services:\n"
        f'  - name: stable\n    endpoints: ["127.0.0.1:{backend_port}"]\n'
        f'  - name: canary\n    endpoints: ["127.0.0.1:{backend_port}"]\n'
        "routes:\n"
        "  - name: models\n"
        "    match: {path: {prefix: /}}\n"
        "    backends:\n"
        f"      - service: stable\n        weight: {round(100.0 - canary_weight, 1)}\n"
        f"      - service: canary\n        weight: {canary_weight}\n"
    )


def route_version_of(text: str) -> str:
    """The RDS version Envoy will report for this policy (pure: same path the gateway takes)."""
    snapshot = build_snapshot(translate(resolve_policy(load_policy_text(text, "<bench>"))))
    return snapshot.versions[type_urls.ROUTE]


def write_atomically(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


async def start_backend() -> tuple[web.AppRunner, int]:
    async def answer(_request: web.Request) -> web.Response:
        return web.json_response({"version": "bench"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None and site._server.sockets
    return runner, int(site._server.sockets[0].getsockname()[1])


class _Stages(XdsObserver):
    """When the watcher applied each version and when Envoy ACKed its RDS."""

    def __init__(self) -> None:
        self.applied: dict[str, float] = {}
        self.acked: dict[str, float] = {}

    def on_reload(self, result: ReloadResult) -> None:
        if result.version is not None:
            self.applied.setdefault(result.version, time.perf_counter())

    def on_ack(self, node_id: str, type_url: str, version: str) -> None:
        if type_url == type_urls.ROUTE:
            self.acked.setdefault(version, time.perf_counter())


async def _envoy_route_version(session: aiohttp.ClientSession, url: str) -> str | None:
    async with session.get(url) as response:
        text = await response.text()
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name.endswith(".version_text"):
            return value.strip().strip('"')
    return None


async def run_propagation(edits: int, debounce_ms: int, poll_interval_s: float) -> dict[str, Any]:
    """One scenario: a fresh gateway with the watcher at ``debounce_ms``, ``edits`` edits."""
    workdir = Path(tempfile.mkdtemp(prefix="inferway-bench-propagation-"))
    policy_path = workdir / "policy" / "policy.yaml"
    policy_path.parent.mkdir()
    backend, backend_port = await start_backend()
    listener_port, admin_port = free_port(), free_port()
    text = render_policy(listener_port, backend_port, WEIGHTS[0])
    policy_path.write_text(text)

    cache = SnapshotCache()
    stages = _Stages()
    cache.add_hook(stages)
    control_plane = ControlPlane(cache)
    control_plane.apply_policy(load_policy_text(text, str(policy_path)), str(policy_path))
    watcher = PolicyWatcher(
        policy_path, control_plane, debounce_ms=debounce_ms, on_reload=stages.on_reload
    )
    watcher.mark_loaded(text)
    server = await start_xds_server(cache)
    envoy = EnvoySupervisor(
        build_bootstrap(node_id=NODE_ID, xds_port=server.port, admin_port=admin_port),
        workdir=workdir / "envoy",
    )
    stats_url = (
        f"http://127.0.0.1:{admin_port}/stats?filter="
        f"^http\\.{LISTENER}\\.rds\\.{LISTENER}\\.version_text$"
    )
    rows: list[dict[str, float]] = []
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=5)
    )
    try:
        await watcher.start()
        await envoy.start()
        if not await envoy.wait_ready(20):
            raise RuntimeError("Envoy did not become ready:\n" + "\n".join(envoy.stderr_tail()))
        if not await cache.wait_for_acks(control_plane.version or "", timeout=20):
            raise RuntimeError("Envoy did not ACK the initial snapshot")
        current = await _envoy_route_version(session, stats_url)
        if current != route_version_of(text):
            raise RuntimeError(f"Envoy reports RDS version {current!r}; is the stat name right?")
        async with session.get(f"http://127.0.0.1:{listener_port}/") as response:
            if response.status != 200:
                raise RuntimeError(f"Envoy -> backend answered {response.status}")

        for i in range(edits):
            weight = WEIGHTS[(i + 1) % len(WEIGHTS)]
            text = render_policy(listener_port, backend_port, weight)
            expected = route_version_of(text)
            snapshot_version = build_snapshot(
                translate(resolve_policy(load_policy_text(text, "<bench>")))
            ).version
            t0 = time.perf_counter()
            write_atomically(policy_path, text)
            deadline = t0 + 10.0
            while (seen := await _envoy_route_version(session, stats_url)) != expected:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"edit {i}: Envoy still reports {seen!r}, not {expected!r}")
                await asyncio.sleep(poll_interval_s)
            t_seen = time.perf_counter()
            # Envoy updates its stats before its ACK reaches us: wait for the ACK (untimed).
            while expected not in stages.acked and time.perf_counter() < deadline:
                await asyncio.sleep(0.001)
            t_applied = stages.applied.get(snapshot_version, float("nan"))
            t_acked = stages.acked.get(expected, float("nan"))
            rows.append(
                {
                    "edit": i,
                    "canary_weight": weight,
                    "total_s": t_seen - t0,
                    "file_to_snapshot_s": t_applied - t0,
                    "snapshot_to_ack_s": t_acked - t_applied,
                }
            )
            stages.applied.clear()
            stages.acked.clear()
            await asyncio.sleep(0.05 + 0.002 * (i % 10))  # edits are separate saves
    finally:
        await session.close()
        await envoy.stop()
        await watcher.stop()
        await server.stop(grace=0.2)
        await backend.cleanup()
    return {
        "debounce_ms": debounce_ms,
        "edits": len(rows),
        "total": summarize([r["total_s"] for r in rows]),
        "file_to_snapshot": summarize([r["file_to_snapshot_s"] for r in rows]),
        "snapshot_to_ack": summarize([r["snapshot_to_ack_s"] for r in rows]),
        "target_p50_met": summarize([r["total_s"] for r in rows])["p50_ms"] <= TARGET_P50_S * 1000,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=60, help="policy edits per scenario (>=50)")
    parser.add_argument(
        "--debounce-ms",
        default="50,10",
        help="comma-separated PolicyWatcher debounce_ms settings to compare (50 = its default)",
    )
    parser.add_argument("--poll-ms", type=float, default=1.0, help="admin poll interval")
    parser.add_argument("--quick", action="store_true", help="50 edits per setting")
    parser.add_argument("--json", default=None, help="results path (default bench/results/)")
    args = parser.parse_args(argv)
    edits = 50 if args.quick else args.edits
    settings = [int(d) for d in args.debounce_ms.split(",") if d.strip()]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    scenarios = []
    for debounce in settings:
        print(f"propagation: debounce_ms={debounce}, {edits} edits ...", file=sys.stderr)
        scenarios.append(asyncio.run(run_propagation(edits, debounce, args.poll_ms / 1000.0)))
    print_table(
        "Policy propagation: file saved -> Envoy reports the new RDS version (ms)",
        [
            "watcher debounce_ms",
            "edits",
            "p50",
            "p99",
            "max",
            "file->snapshot p50",
            "snapshot->ACK p50",
            f"p50 < {TARGET_P50_S * 1000:.0f} ms",
        ],
        [
            (
                s["debounce_ms"],
                s["edits"],
                s["total"]["p50_ms"],
                s["total"]["p99_ms"],
                s["total"]["max_ms"],
                s["file_to_snapshot"]["p50_ms"],
                s["snapshot_to_ack"]["p50_ms"],
                "yes" if s["target_p50_met"] else "no",
            )
            for s in scenarios
        ],
    )
    path = write_results(
        "propagation",
        {
            "benchmark": "propagation",
            "command": " ".join(["bench/propagation.py", *(argv or sys.argv[1:])]),
            "target": f"p50 under {TARGET_P50_S * 1000:.0f} ms from file write to Envoy",
            "environment": environment(),
            "scenarios": scenarios,
        },
        None if args.json is None else Path(args.json),
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
