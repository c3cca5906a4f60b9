"""SDS references -> static secrets, for the ``envoy --mode validate`` bootstrap.

A static bootstrap has no SDS server: a secret reference without ``sds_config`` is looked up
in ``static_resources.secrets`` instead. Secrets present among the resources are inlined as
they are; a referenced name with no material (an IR resolved without certificate files, as the
golden tests do) gets throwaway development material, so Envoy still checks the whole TLS
configuration. Validation checks the config, not the certificate files.
"""

from __future__ import annotations

from collections.abc import Iterator

from inferway._xds_protos.envoy.config.bootstrap.v3 import bootstrap_pb2
from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.extensions.transport_sockets.tls.v3 import secret_pb2, tls_pb2
from inferway.pki.mint import build_ca, build_certificate
from inferway.state.model import TlsMaterial
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.translate.tls import TLS_TRANSPORT_SOCKET, build_secret

__all__ = ["inline_static_secrets"]


def inline_static_secrets(
    static: bootstrap_pb2.Bootstrap.StaticResources, resources: Resources
) -> None:
    """Rewrite every TLS transport socket in ``static`` to use static secrets and add them."""
    wanted: set[str] = set()
    for socket in _transport_sockets(static):
        wanted.update(_detach_sds(socket))
    known = resources.typed(type_urls.SECRET, secret_pb2.Secret)
    placeholder: dict[str, TlsMaterial] | None = None
    for name in sorted(wanted):
        if name in known:
            static.secrets.append(known[name])
            continue
        placeholder = placeholder or _placeholder_material()
        role = "ca" if name.endswith("/ca") else "cert"
        static.secrets.append(build_secret(name, placeholder[role]))


def _transport_sockets(
    static: bootstrap_pb2.Bootstrap.StaticResources,
) -> Iterator[base_pb2.TransportSocket]:
    for listener in static.listeners:
        for chain in listener.filter_chains:
            if chain.HasField("transport_socket"):
                yield chain.transport_socket
    for cluster in static.clusters:
        if cluster.HasField("transport_socket"):
            yield cluster.transport_socket


def _detach_sds(socket: base_pb2.TransportSocket) -> list[str]:
    if socket.name != TLS_TRANSPORT_SOCKET:
        return []
    for kind in (tls_pb2.DownstreamTlsContext, tls_pb2.UpstreamTlsContext):
        context = kind()
        if socket.typed_config.Unpack(context):
            break
    else:
        return []
    common = context.common_tls_context
    configs: list[secret_pb2.SdsSecretConfig] = list(common.tls_certificate_sds_secret_configs)
    if common.HasField("validation_context_sds_secret_config"):
        configs.append(common.validation_context_sds_secret_config)
    if common.HasField("combined_validation_context"):
        configs.append(common.combined_validation_context.validation_context_sds_secret_config)
    for config in configs:
        config.ClearField("sds_config")
    socket.typed_config.Pack(context)
    return [config.name for config in configs]


def _placeholder_material() -> dict[str, TlsMaterial]:
    ca = build_ca("inferway validation CA", days=1)
    leaf = build_certificate(ca, dns_names=["localhost"], server=True, client=True, days=1)
    return {
        "ca": TlsMaterial(trusted_ca=ca.cert_pem),
        "cert": TlsMaterial(certificate_chain=leaf.cert_pem, private_key=leaf.key_pem),
    }
