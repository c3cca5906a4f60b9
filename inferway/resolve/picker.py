"""A service's ``picker:`` as IR (policies/picker.py): the address Envoy asks, and how it
fails."""

from __future__ import annotations

from inferway.policies.picker import Picker
from inferway.policies.types import split_host_port
from inferway.resolve.ir.picker import PickerIR

__all__ = ["resolve_picker"]


def resolve_picker(service: str, picker: Picker | None) -> PickerIR | None:
    if picker is None:
        return None
    host, port = split_host_port(picker.external or picker.listen)
    http_host, http_port = split_host_port(picker.http_listen)
    asked_over_http = picker.transport == "http" and picker.process != "envoy"
    return PickerIR(
        service=service,
        host=host,
        port=port,
        external=picker.external is not None,
        fail_open=picker.fail == "open",
        timeout=picker.timeout,
        session_header=picker.session_header,
        transport=picker.transport,
        http_host=http_host if asked_over_http else "",
        http_port=http_port if asked_over_http else 0,
        in_envoy=picker.process == "envoy",
        prefix_bytes=picker.prefix_bytes,
        load_bound=picker.load_bound,
    )
