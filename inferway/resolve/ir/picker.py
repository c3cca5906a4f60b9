"""IR of a service's endpoint picker: where Envoy asks (inferway's own or an external GAIE
picker) and what Envoy does when it does not answer."""

from __future__ import annotations

from dataclasses import dataclass

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
