"""IR of a service's endpoint picker: where Envoy asks (inferway's own or an external GAIE
picker) and what Envoy does when it does not answer; or, ``in_envoy``, how Envoy picks itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["PickerIR", "ReplicaLoadIR"]


@dataclass(frozen=True)
class ReplicaLoadIR:
    """A replica of a ``pick: score`` picker in Envoy, and its load as last scraped (None:
    not known): what Envoy's Lua picker reads from its route's metadata."""

    address: str
    """``ip:port`` as ``override_host`` reads it (an IPv6 address in brackets)."""
    depth: float | None = None
    kv_cache: float | None = None
    loras_running: tuple[str, ...] = ()
    loras_waiting: tuple[str, ...] = ()
    max_lora: int | None = None


@dataclass(frozen=True)
class PickerIR:
    service: str
    host: str
    port: int
    external: bool
    fail_open: bool
    timeout: float
    session_header: str
    transport: Literal["ext_proc", "http"] = "ext_proc"
    """``http``: Envoy asks over ext_authz's HTTP service at ``http_host:http_port`` and
    reports each request's end over its gRPC access log to ``host:port``."""
    http_host: str = ""
    http_port: int = 0
    in_envoy: bool = False
    """``process: envoy``: no picker to ask; Envoy hashes ``prefix_bytes`` of the prompt and
    balances by Maglev with ``load_bound`` (xds/translate/picker_envoy.py)."""
    prefix_bytes: int = 1024
    load_bound: float = 1.1
    pick: Literal["hash", "score"] = "hash"
    """``in_envoy``: ``hash`` (the prefix hash and Maglev) or ``score`` (the scoring picker in
    Envoy's Lua filter, xds/translate/picker_score.py; ``override_host`` as for an asked
    picker)."""
    weights: tuple[float, float, float, float, float] = (2.0, 2.0, 3.0, 1.0, 0.0)
    """``pick: score``: queue, kv_cache, prefix, lora, session."""
    queue_limit: float = 8.0
    kv_cache_limit: float = 0.95
    fallbacks: int = 2
    shed: bool = False
    replicas: tuple[ReplicaLoadIR, ...] = ()
    """``pick: score``: the replicas Envoy's Lua picker chooses from, with their load."""

    @property
    def scored_in_envoy(self) -> bool:
        return self.in_envoy and self.pick == "score"

    @property
    def hashed_in_envoy(self) -> bool:
        return self.in_envoy and self.pick == "hash"
