"""The Envoy bootstrap for one node: who it is, where its ADS server is, and a loopback admin.

Everything else arrives over ADS, so this is the only static config an Envoy sidecar needs.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from inferway.xds.auth import XdsClientTlsFiles
from inferway.xds.node_address import ADVERTISE_METADATA_KEY

__all__ = [
    "XDS_CLUSTER_NAME",
    "build_bootstrap",
    "build_xds_client_secrets",
    "write_bootstrap",
    "write_xds_client_secrets",
]

XDS_CLUSTER_NAME = "inferway_xds"
XDS_CLIENT_CERTIFICATE_SECRET = "inferway_xds_client_certificate"
XDS_SERVER_CA_SECRET = "inferway_xds_server_ca"
_SECRET_FILES = {
    XDS_CLIENT_CERTIFICATE_SECRET: "xds-client-certificate.sds.json",
    XDS_SERVER_CA_SECRET: "xds-server-ca.sds.json",
}
_SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

_HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_UPSTREAM_TLS_CONTEXT = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


def build_bootstrap(
    *,
    node_id: str,
    node_cluster: str = "inferway",
    xds_host: str = "127.0.0.1",
    xds_port: int,
    admin_port: int,
    admin_address: str = "127.0.0.1",
    ads: Literal["sotw", "delta"] = "sotw",
    xds_tls: XdsClientTlsFiles | None = None,
    xds_tls_sds_dir: str | Path | None = None,
    locality: Mapping[str, str] | None = None,
    stats_push_s: float | None = None,
    advertise_address: str = "",
) -> dict[str, Any]:
    """A JSON/YAML-able bootstrap. ``node.cluster`` is set too: SDS over ADS needs both.
    ``admin_port`` 0 lets Envoy pick one (read it back with ``--admin-address-path``).
    ``ads="delta"`` makes Envoy speak incremental xDS (api_type DELTA_GRPC): a change to one
    resource then sends only that resource.

    With ``xds_tls``, Envoy connects with mutual TLS. Given ``xds_tls_sds_dir`` (where
    ``write_xds_client_secrets`` put its files) it reads the certificate, key and CA through
    file-based SDS, which watches them: a rotation takes effect at the next connection, with
    no restart. Without it the files are named inline and read once, at start.

    ``locality`` (``zone``, ``region``) is the node's: zone-aware routing reads it, and the
    control plane shows it. ``stats_push_s`` makes Envoy push its stats to the control plane
    every so often (OpenTelemetry's OTLP over the xDS cluster, with its node id and zone as
    gRPC metadata), so the control plane's loops see every Envoy without reaching its admin.
    ``advertise_address`` (node metadata ``INFERWAY_ADVERTISE_ADDRESS``) is the host its
    listeners are reached at, which ``inferway verify`` uses (else the ADS peer's address)."""
    if not node_id:
        raise ValueError("build_bootstrap: node_id must be a non-empty string")
    if not 0 < xds_port < 65536:
        raise ValueError(f"build_bootstrap: xds_port {xds_port} is not a TCP port (1..65535)")
    if not 0 <= admin_port < 65536:
        raise ValueError(f"build_bootstrap: admin_port {admin_port} is not a TCP port (0..65535)")
    if ads not in ("sotw", "delta"):
        raise ValueError(f"build_bootstrap: ads must be 'sotw' or 'delta', not {ads!r}")
    ads_source = {"ads": {}, "resource_api_version": "V3"}
    bootstrap: dict[str, Any] = {
        "node": {"id": node_id, "cluster": node_cluster},
        "admin": {
            "address": {"socket_address": {"address": admin_address, "port_value": admin_port}}
        },
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if ads == "delta" else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER_NAME}}],
            },
            "lds_config": dict(ads_source),
            "cds_config": dict(ads_source),
        },
        "static_resources": {
            "clusters": [
                {
                    "name": XDS_CLUSTER_NAME,
                    "type": _discovery_type(xds_host),
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        _HTTP_PROTOCOL_OPTIONS: {
                            "@type": f"type.googleapis.com/{_HTTP_PROTOCOL_OPTIONS}",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    "load_assignment": {
                        "cluster_name": XDS_CLUSTER_NAME,
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {
                                                    "address": xds_host,
                                                    "port_value": xds_port,
                                                }
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                }
            ]
        },
    }
    if advertise_address:
        bootstrap["node"]["metadata"] = {ADVERTISE_METADATA_KEY: advertise_address}
    if locality:
        bootstrap["node"]["locality"] = {k: v for k, v in locality.items() if v}
    if stats_push_s is not None:
        bootstrap.update(_stats_push(node_id, (locality or {}).get("zone", ""), stats_push_s))
    if xds_tls is not None:
        bootstrap["static_resources"]["clusters"][0]["transport_socket"] = _xds_transport_socket(
            xds_tls, None if xds_tls_sds_dir is None else Path(xds_tls_sds_dir)
        )
    return bootstrap


STATS_NODE_HEADER = "x-inferway-node"
STATS_ZONE_HEADER = "x-inferway-zone"
_OTEL_SINK = "type.googleapis.com/envoy.extensions.stat_sinks.open_telemetry.v3.SinkConfig"


def _stats_push(node_id: str, zone: str, every_s: float) -> dict[str, Any]:
    if not 0.1 <= every_s <= 3600:
        raise ValueError(f"build_bootstrap: stats_push_s {every_s} is not within 0.1..3600 s")
    metadata = [{"key": STATS_NODE_HEADER, "value": node_id}]
    if zone:
        metadata.append({"key": STATS_ZONE_HEADER, "value": zone})
    return {
        "stats_flush_interval": f"{every_s:.3f}s",
        "stats_sinks": [
            {
                "name": "envoy.stat_sinks.open_telemetry",
                "typed_config": {
                    "@type": _OTEL_SINK,
                    "grpc_service": {
                        "envoy_grpc": {"cluster_name": XDS_CLUSTER_NAME},
                        "initial_metadata": metadata,
                    },
                },
            }
        ],
    }


def build_xds_client_secrets(tls: XdsClientTlsFiles) -> dict[str, dict[str, Any]]:
    """The file-based SDS resources, by secret name: Envoy's client certificate and key, and
    the CA it trusts for the xDS server. One secret per file, as Envoy requires."""
    return {
        XDS_CLIENT_CERTIFICATE_SECRET: {
            "tls_certificate": {
                "certificate_chain": {"filename": tls.certificate},
                "private_key": {"filename": tls.private_key},
            }
        },
        XDS_SERVER_CA_SECRET: {"validation_context": {"trusted_ca": {"filename": tls.ca}}},
    }


def write_xds_client_secrets(directory: str | Path, tls: XdsClientTlsFiles) -> list[Path]:
    """Write the SDS files a bootstrap built with ``xds_tls_sds_dir=directory`` reads."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, secret in build_xds_client_secrets(tls).items():
        path = target / _SECRET_FILES[name]
        resource = {"@type": _SECRET, "name": name, **secret}
        path.write_text(json.dumps({"resources": [resource]}, indent=2))
        written.append(path)
    return written


def _xds_transport_socket(tls: XdsClientTlsFiles, sds_dir: Path | None) -> dict[str, Any]:
    """mTLS to the control plane: present the node's certificate, trust only its CA."""
    common: dict[str, Any] = {"alpn_protocols": ["h2"]}
    validation: dict[str, Any] = {}
    if sds_dir is None:
        common["tls_certificates"] = [
            {
                "certificate_chain": {"filename": tls.certificate},
                "private_key": {"filename": tls.private_key},
            }
        ]
        validation["trusted_ca"] = {"filename": tls.ca}
        common["validation_context"] = validation
    else:
        common["tls_certificate_sds_secret_configs"] = [
            _file_sds(sds_dir, XDS_CLIENT_CERTIFICATE_SECRET)
        ]
        common["combined_validation_context"] = {
            "default_validation_context": validation,
            "validation_context_sds_secret_config": _file_sds(sds_dir, XDS_SERVER_CA_SECRET),
        }
    context: dict[str, Any] = {
        "@type": f"type.googleapis.com/{_UPSTREAM_TLS_CONTEXT}",
        "common_tls_context": common,
    }
    if tls.server_name:
        context["sni"] = tls.server_name
        validation["match_typed_subject_alt_names"] = [
            {"san_type": "DNS", "matcher": {"exact": tls.server_name}}
        ]
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def _file_sds(directory: Path, name: str) -> dict[str, Any]:
    path = (directory / _SECRET_FILES[name]).resolve()
    return {
        "name": name,
        "sds_config": {"path_config_source": {"path": str(path)}, "resource_api_version": "V3"},
    }


def _discovery_type(host: str) -> str:
    """STATIC for an IP address; a host name needs DNS resolution."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "STRICT_DNS"
    return "STATIC"


def write_bootstrap(path: str | Path, bootstrap: dict[str, Any]) -> Path:
    """Write ``bootstrap`` as YAML to ``path`` (parents created); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(bootstrap, sort_keys=False, default_flow_style=False))
    return target
