"""Where an Envoy's listeners can be reached, as the control plane knows it: the address the
Envoy advertises in its bootstrap's node metadata (``inferway envoy --advertise-address``), or
else the address its ADS stream comes from. ``inferway verify`` reaches every Envoy of a fleet
there, instead of a random pod behind a Service (docs/verify.md)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Literal

from inferway._xds_protos.envoy.config.core.v3 import base_pb2

__all__ = [
    "ADVERTISE_METADATA_KEY",
    "PEER_METADATA_KEY",
    "AddressSource",
    "node_address",
    "peer_host",
    "with_peer",
]

ADVERTISE_METADATA_KEY = "INFERWAY_ADVERTISE_ADDRESS"
"""Node metadata the bootstrap carries: the host this Envoy's listeners are reached at."""
PEER_METADATA_KEY = "INFERWAY_ADS_PEER"
"""Set by the ADS server on a stream's first node: the host the stream comes from."""

AddressSource = Literal["advertised", "ads-peer", ""]
_SOURCES: tuple[tuple[str, AddressSource], ...] = (
    (ADVERTISE_METADATA_KEY, "advertised"),
    (PEER_METADATA_KEY, "ads-peer"),
)


def peer_host(peer: str) -> str:
    """gRPC's peer string -> the host: ``ipv4:10.0.0.2:5467`` -> ``10.0.0.2``,
    ``ipv6:[::1]:5467`` -> ``::1``; "" for a peer that is not an IP (a unix socket)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        host = rest.rpartition(":")[0]
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return ""


def node_address(node: base_pb2.Node) -> tuple[str, AddressSource]:
    """The node's listener host and where it was learned; ("", "") when neither is known."""
    for key, source in _SOURCES:
        value = node.metadata.fields.get(key)
        if value is not None and value.string_value.strip():
            return value.string_value.strip(), source
    return "", ""


async def with_peer(requests: AsyncIterable[Any], peer: str) -> AsyncIterator[Any]:
    """``requests`` with the stream's peer host written into the first request's node (the
    one that names the node), so the cache records where the stream comes from."""
    host = peer_host(peer)
    first = True
    async for request in requests:
        if first and host and request.HasField("node"):
            request.node.metadata.fields[PEER_METADATA_KEY].string_value = host
        first = False
        yield request
