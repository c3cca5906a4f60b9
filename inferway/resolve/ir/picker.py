"""IR of a service's endpoint picker: where Envoy asks (inferway's own or an external GAIE
picker) and what Envoy does when it does not answer; or, ``in_envoy``, how Envoy picks itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["PickerIR"]


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
