"""A service's ``picker:`` as IR (policies/picker.py): the address Envoy asks, and how it
fails."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from inferway.policies.model import Endpoint
from inferway.policies.picker import Picker
from inferway.policies.types import is_ip_address, join_host_port, split_host_port
from inferway.resolve.ir.picker import PickerIR, ReplicaLoadIR
from inferway.state.model import ReplicaLoad

__all__ = ["resolve_picker"]


def _replicas(
    endpoints: Sequence[Endpoint], load: Mapping[str, ReplicaLoad]
) -> tuple[ReplicaLoadIR, ...]:
    """The replicas override_host can be sent to (IP addresses: a DNS name is not a host
    address Envoy matches), with their last scraped load."""
    out = []
    for endpoint in endpoints:
        if not is_ip_address(endpoint.host):
            continue
        address = join_host_port(endpoint.host, endpoint.port)  # GAIE's ip:port
        seen = load.get(address, ReplicaLoad())
        out.append(
            ReplicaLoadIR(
                address,
                seen.depth,
                seen.kv_cache,
                tuple(sorted(seen.loras_running)),
                tuple(sorted(seen.loras_waiting)),
                seen.max_lora,
            )
        )
    return tuple(out)


def resolve_picker(
    service: str,
    picker: Picker | None,
    endpoints: Sequence[Endpoint] = (),
    load: Mapping[str, ReplicaLoad] | None = None,
) -> PickerIR | None:
    """``endpoints`` and ``load``: the service's replicas and their scraped load (only a
    ``process: envoy``, ``pick: score`` picker carries them: Envoy's Lua picker reads them)."""
    if picker is None:
        return None
    scored = picker.process == "envoy" and picker.pick == "score"
    s = picker.scorers
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
        pick=picker.pick,
        weights=(s.queue, s.kv_cache, s.prefix, s.lora, s.session),
        queue_limit=picker.queue_limit,
        kv_cache_limit=picker.kv_cache_limit,
        fallbacks=picker.fallbacks,
        shed=picker.shed,
        replicas=_replicas(endpoints, load or {}) if scored else (),
    )
