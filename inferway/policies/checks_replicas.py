"""Semantic checks of ``services[].replicas``: counts that cannot all hold, devices that
cannot give every replica its own accelerator, placeholders with nothing to fill them; and
what ``autoscale:`` acts on (its ``scale_target``, which ``replicas:`` decides the default of)
and a metric only the gateway's own replicas can give."""

from __future__ import annotations

from collections.abc import Iterator

from inferway.policies.autoscale import AutoscaleRule
from inferway.policies.autoscale_fields import BACKEND_METRICS
from inferway.policies.model import Policy, Service
from inferway.policies.replicas import Replicas, placeholders_in
from inferway.policies.scale_target import scale_target_issues
from inferway.policies.yaml_marks import Loc

__all__ = ["check_replicas"]


def check_replicas(policy: Policy) -> Iterator[tuple[Loc, str]]:
    for s, service in enumerate(policy.services):
        if service.replicas is not None:
            yield from _one(service.replicas, ("services", s, "replicas"))
        if service.autoscale is not None:
            loc = ("services", s, "autoscale")
            has_replicas = service.replicas is not None
            target = list(
                scale_target_issues(service.autoscale, has_replicas=has_replicas, loc=loc)
            )
            yield from target
            if not target and not has_replicas:
                yield from _backend_metric(service, loc)


def _backend_metric(service: Service, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """A metric read from each replica's /metrics needs replicas the gateway runs."""
    block = service.autoscale
    if isinstance(block, AutoscaleRule):
        metric, at = block.scaling_policy.metric_type, (*loc, "scaling_policy", "metric_type")
    elif block is not None:
        metric, at = block.metric, (*loc, "metric")
    else:
        return
    if metric in BACKEND_METRICS:
        yield (
            at,
            f"{metric} is read from each replica's /metrics, which only the gateway's own "
            "replicas (replicas:) give it; with this scale_target use in_flight, "
            "request_rate or p99_latency (Envoy's view of the cluster)",
        )


def _one(spec: Replicas, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if spec.min > spec.max:
        yield (
            (*loc, "min"),
            f"min {spec.min} is more than max {spec.max}; make min at most max",
        )
    elif spec.initial is not None and not spec.min <= spec.initial <= spec.max:
        yield (
            (*loc, "initial"),
            f"initial {spec.initial} is outside min..max ({spec.min}..{spec.max})",
        )
    if spec.backoff.initial > spec.backoff.max:
        yield (
            (*loc, "backoff", "initial"),
            f"initial backoff {spec.backoff.initial:g}s is longer than max {spec.backoff.max:g}s",
        )
    used = {n for word in _texts(spec) for n in placeholders_in(word)}
    devices = spec.devices
    if devices is None:
        if "device" in used:
            yield (
                (*loc, "command"),
                "the command uses {device} but no devices are listed; add devices: [...]",
            )
        if spec.share_devices:
            yield (
                (*loc, "share_devices"),
                "share_devices has no effect without devices; list them or remove it",
            )
        return
    if not devices:
        yield (*loc, "devices"), "an empty device list; list at least one or remove devices"
        return
    first: dict[str, int] = {}
    for index, device in enumerate(devices):
        if device in first:
            yield (
                (*loc, "devices", index),
                f"device '{device}' is listed twice (also devices[{first[device]}])",
            )
        first.setdefault(device, index)
    if len(first) < spec.max and not spec.share_devices:
        yield (
            (*loc, "devices"),
            f"{len(first)} device(s) for up to {spec.max} replicas: two replicas would share "
            "a device; list more devices, lower max, or set share_devices: true",
        )


def _texts(spec: Replicas) -> list[str]:
    return [spec.command, spec.readiness, *spec.env.values()]
