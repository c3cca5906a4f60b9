"""The supervised Envoy's bootstrap for a gateway's options: one function, so the keeper
(``inferway run``) and an in-process gateway (``inferway demo``, tests) start the same Envoy."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from inferway.xds.auth import XdsClientTlsFiles
from inferway.xds.bootstrap import build_bootstrap, write_xds_client_secrets
from inferway.xds.translate.tracing import build_layered_runtime

__all__ = ["BootstrapOptions", "build_gateway_bootstrap"]


class BootstrapOptions(Protocol):
    """What the bootstrap reads of the gateway's options (``GatewayOptions`` is one)."""

    @property
    def node_id(self) -> str: ...
    @property
    def node_cluster(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def envoy_admin_port(self) -> int: ...
    @property
    def xds_protocol(self) -> Literal["sotw", "delta"]: ...
    @property
    def envoy_runtime(self) -> Mapping[str, Any] | None: ...
    @property
    def zone(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def stats_push_s(self) -> float | None: ...


def build_gateway_bootstrap(
    options: BootstrapOptions,
    *,
    xds_port: int,
    workdir: Path,
    xds_client_tls: XdsClientTlsFiles | None,
) -> dict[str, Any]:
    """The bootstrap dict; with xDS mutual TLS it also writes the file-based SDS secrets into
    ``workdir`` (read through SDS, so certificate rotations apply live)."""
    if xds_client_tls is not None:
        write_xds_client_secrets(workdir, xds_client_tls)
    bootstrap = build_bootstrap(
        node_id=options.node_id,
        node_cluster=options.node_cluster,
        xds_host=options.host,
        xds_port=xds_port,
        admin_port=options.envoy_admin_port,
        ads=options.xds_protocol,
        xds_tls=xds_client_tls,
        xds_tls_sds_dir=workdir if xds_client_tls is not None else None,
        locality={"zone": options.zone, "region": options.region},
        stats_push_s=options.stats_push_s,
    )
    if options.envoy_runtime:
        bootstrap["layered_runtime"] = build_layered_runtime(options.envoy_runtime)
    return bootstrap
