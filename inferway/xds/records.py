"""What the cache records about Envoys: node status, each NACK, each snapshot an Envoy
rejected, and each response written. Plain frozen values in a module of their own, so the hooks
that receive them and the cache and streams that make them all import them here (and not each
other)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["NackRecord", "NodeStatus", "Rejection", "SentResponse", "XdsProtocol"]

XdsProtocol = Literal["sotw", "delta"]


@dataclass(frozen=True)
class NackRecord:
    """Envoy rejected ``version`` of ``type_url`` (sent with ``nonce``), saying ``message``;
    ``snapshot`` is the snapshot version the rejected response was built from ("" unknown)."""

    node_id: str
    type_url: str
    version: str
    nonce: str
    message: str
    at: float
    snapshot: str = ""
    resource_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeStatus:
    node_id: str
    cluster: str
    group: str
    connected: bool
    connected_since: float
    acked: Mapping[str, str]
    last_nack: NackRecord | None
    last_seen: float | None = None
    """When the node last connected, NACKed or disconnected."""
    address: str = ""
    """The host its listeners are reached at ("" unknown; ``xds/node_address.py``)."""
    address_source: str = ""
    """``advertised`` (its bootstrap said so) or ``ads-peer`` (where its stream comes from)."""


@dataclass(frozen=True)
class Rejection:
    """Snapshot ``version`` of ``group`` was refused because an Envoy NACKed it (``nack``);
    the cache serves ``restored`` instead (the last snapshot an Envoy ACKed; None when there
    was none, so the rejected one stays)."""

    group: str
    version: str
    nack: NackRecord
    restored: str | None

    @property
    def message(self) -> str:
        return self.nack.message


@dataclass(frozen=True)
class SentResponse:
    """One response written to one stream. ``removed`` counts delta's removed_resources;
    ``bytes`` is the serialized size of the response message."""

    node_id: str
    protocol: XdsProtocol
    type_url: str
    version: str
    resources: int
    removed: int
    bytes: int
