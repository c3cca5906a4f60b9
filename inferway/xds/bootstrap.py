"""The Envoy bootstrap for one node: who it is, where its ADS server is, and a loopback admin.

Everything else arrives over ADS, so this is the only static config an Envoy sidecar needs.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

import yaml

from inferway.xds.auth import XdsClientTlsFiles

__all__ = ["XDS_CLUSTER_NAME", "build_bootstrap", "write_bootstrap"]

XDS_CLUSTER_NAME = "inferway_xds"

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
) -> dict[str, Any]:
    """A JSON/YAML-able bootstrap. ``node.cluster`` is set too: SDS over ADS needs both.
    ``admin_port`` 0 lets Envoy pick one (read it back with ``--admin-address-path``).
    ``ads="delta"`` makes Envoy speak incremental xDS (api_type DELTA_GRPC): a change to one
    resource then sends only that resource."""
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
    if xds_tls is not None:
        bootstrap["static_resources"]["clusters"][0]["transport_socket"] = _xds_transport_socket(
            xds_tls
        )
    return bootstrap


def _xds_transport_socket(tls: XdsClientTlsFiles) -> dict[str, Any]:
    """mTLS to the control plane: present the node's certificate, trust only its CA."""
    validation: dict[str, Any] = {"trusted_ca": {"filename": tls.ca}}
    context: dict[str, Any] = {
        "@type": f"type.googleapis.com/{_UPSTREAM_TLS_CONTEXT}",
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "tls_certificates": [
                {
                    "certificate_chain": {"filename": tls.certificate},
                    "private_key": {"filename": tls.private_key},
                }
            ],
            "validation_context": validation,
        },
    }
    if tls.server_name:
        context["sni"] = tls.server_name
        validation["match_typed_subject_alt_names"] = [
            {"san_type": "DNS", "matcher": {"exact": tls.server_name}}
        ]
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


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
