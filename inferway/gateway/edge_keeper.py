"""``inferway envoy --control-plane HOST:PORT``: a keeper with Envoy only, on a host of the
fleet, against a remote control plane (a replica of ``inferway run --no-envoy``).

It writes the bootstrap (node id, zone and region, the xDS server, its client certificate when
xDS uses mutual TLS, and the stats push to the control plane), supervises Envoy (restarted on a
crash; it keeps its last config while no control plane answers), and on SIGTERM/SIGINT drains
Envoy's listeners before it stops it, as ``inferway run`` does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from inferway.exit_codes import EXIT_CANNOT_START
from inferway.gateway.envoy_drain import drain_envoy
from inferway.gateway.envoy_modules import provide_envoy_modules
from inferway.gateway.supervisor import EnvoySupervisor, wait_envoy_started
from inferway.xds.auth import XdsClientTlsFiles
from inferway.xds.bootstrap import build_bootstrap, write_xds_client_secrets

__all__ = ["EdgeOptions", "run_edge_keeper"]

log = logging.getLogger("inferway")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class EdgeOptions:
    xds_host: str
    xds_port: int
    workdir: Path
    node_id: str
    node_cluster: str = "inferway"
    zone: str = ""
    region: str = ""
    envoy_admin_port: int = 15001
    advertise_address: str = ""
    """Where its listeners are reached ("": the control plane uses the ADS peer's address)."""
    envoy_log_level: str = "warning"
    envoy_concurrency: int | None = None
    stats_push_s: float | None = 2.0
    xds_tls: XdsClientTlsFiles | None = None


def build_edge_bootstrap(options: EdgeOptions) -> dict[str, object]:
    if options.xds_tls is not None:
        write_xds_client_secrets(options.workdir, options.xds_tls)
    return build_bootstrap(
        node_id=options.node_id,
        node_cluster=options.node_cluster,
        xds_host=options.xds_host,
        xds_port=options.xds_port,
        admin_port=options.envoy_admin_port,
        xds_tls=options.xds_tls,
        xds_tls_sds_dir=options.workdir if options.xds_tls is not None else None,
        locality={"zone": options.zone, "region": options.region},
        stats_push_s=options.stats_push_s,
        advertise_address=options.advertise_address,
    )


async def run_edge_keeper(options: EdgeOptions) -> int:
    """Run Envoy until SIGTERM/SIGINT; 0 when stopped, 2 when Envoy cannot start."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    options.workdir.mkdir(parents=True, exist_ok=True)
    bootstrap = build_edge_bootstrap(options)
    envoy = EnvoySupervisor(
        bootstrap,
        workdir=options.workdir,
        log_level=options.envoy_log_level,
        concurrency=options.envoy_concurrency,
        env=provide_envoy_modules(bootstrap),
    )
    try:
        try:
            await envoy.start()
        except OSError as error:
            log.error("cannot start envoy: %s", error)
            return EXIT_CANNOT_START
        ready = asyncio.create_task(wait_envoy_started(envoy))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            return 0
        stopped.cancel()
        if (failure := ready.result()) is not None:
            log.error("%s", failure)
            return EXIT_CANNOT_START
        log.info(
            "envoy %s runs against the control plane at %s:%d; Ctrl-C to stop",
            options.node_id, options.xds_host, options.xds_port,
        )  # fmt: skip
        await stop.wait()
        await drain_envoy(envoy.admin_port, drain_time_s=envoy.drain_time_s)
        return 0
    finally:
        await envoy.stop()
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)
