"""``inferway envoy``: Envoy alone on a host of the fleet, against a remote control plane."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from inferway.cli.conventions import LogFormatOption
from inferway.console import configure_logging
from inferway.exit_codes import EXIT_USAGE

__all__ = ["envoy"]


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise typer.BadParameter(f"{value!r} is not HOST:PORT (port 1-65535)")
    return host, int(port)


def envoy(
    control_plane: Annotated[
        str,
        typer.Option(
            help="The control plane's xDS address, HOST:PORT (a replica of `inferway run "
            "--no-envoy`, or a Service in front of several)."
        ),
    ],
    node_id: Annotated[str, typer.Option(help="This Envoy's node.id (unique in the fleet).")],
    node_cluster: Annotated[str, typer.Option(help="node.cluster of the Envoy.")] = "inferway",
    zone: Annotated[str, typer.Option(help="This Envoy's zone (node.locality.zone).")] = "",
    region: Annotated[str, typer.Option(help="This Envoy's region (node.locality.region).")] = "",
    envoy_admin_port: Annotated[
        int, typer.Option(help="Envoy's own admin port (loopback).", min=1, max=65535)
    ] = 15001,
    advertise_address: Annotated[
        str,
        typer.Option(
            help="The host this Envoy's listeners are reached at, for `inferway verify` "
            "(default: the address its xDS connection comes from)."
        ),
    ] = "",
    workdir: Annotated[
        Path | None, typer.Option(help="Where the bootstrap is written (default: temp).")
    ] = None,
    xds_envoy_cert: Annotated[
        Path | None,
        typer.Option(help="Envoy's client certificate for xDS mutual TLS.", dir_okay=False),
    ] = None,
    xds_envoy_key: Annotated[
        Path | None, typer.Option(help="Its private key.", dir_okay=False)
    ] = None,
    xds_server_ca: Annotated[
        Path | None,
        typer.Option(help="The CA of the xDS server's certificate.", dir_okay=False),
    ] = None,
    envoy_log_level: Annotated[str, typer.Option(help="Envoy's log level.")] = "warning",
    log_level: Annotated[str, typer.Option(help="inferway's log level.")] = "info",
    log_format: LogFormatOption = None,
) -> None:
    """Run Envoy alone against a remote control plane: bootstrap, supervision (restarted on
    a crash), stats pushed to the control plane, and a drain on SIGTERM (docs/fleet.md)."""
    from inferway.gateway.edge_keeper import EdgeOptions, run_edge_keeper
    from inferway.gateway.foreground import run_event_loop
    from inferway.xds.auth import XdsClientTlsFiles

    host, port = _host_port(control_plane)
    tls_files = (xds_envoy_cert, xds_envoy_key, xds_server_ca)
    if any(tls_files) and not all(tls_files):
        typer.echo(
            "xDS mutual TLS needs all three: --xds-envoy-cert, --xds-envoy-key and --xds-server-ca",
            err=True,
        )
        raise typer.Exit(EXIT_USAGE)
    tls = (
        XdsClientTlsFiles(
            certificate=str(xds_envoy_cert),
            private_key=str(xds_envoy_key),
            ca=str(xds_server_ca),
        )
        if xds_envoy_cert is not None
        else None
    )
    configure_logging(log_level, log_format)
    folder = workdir or Path(tempfile.mkdtemp(prefix="inferway-envoy-"))
    options = EdgeOptions(
        xds_host=host,
        xds_port=port,
        workdir=folder.absolute(),
        node_id=node_id,
        node_cluster=node_cluster,
        zone=zone,
        region=region,
        envoy_admin_port=envoy_admin_port,
        advertise_address=advertise_address,
        envoy_log_level=envoy_log_level,
        xds_tls=tls,
    )
    raise typer.Exit(run_event_loop(run_edge_keeper(options)))
