"""What an autoscaling decision acts on: ``autoscale: {..., scale_target: ...}``.

    scale_target: replicas        # the gateway's own replica manager (the default with replicas:)
    scale_target: metric          # publish inferway_autoscale_desired_replicas (KEDA/HPA act)
    scale_target:                 # patch a Deployment's scale subresource from the gateway
      kubernetes: {deployment: inferway-backend, namespace: inferway}

``replicas`` needs the service's ``replicas:`` section; ``metric`` and ``kubernetes`` size
replicas something else runs, so they refuse it (the gateway would be sizing the same service
twice). Without ``replicas:`` a target is required. The block is read here, in the policy
layer, so ``inferway validate`` places every problem on its line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from inferway.policies.autoscale import Autoscale, AutoscaleRule
from inferway.policies.yaml_marks import Loc

__all__ = [
    "SCALE_TARGET_KEY",
    "Block",
    "ScaleTargetSpec",
    "read_scale_target",
    "scale_target_issues",
]

SCALE_TARGET_KEY = "scale_target"

_KINDS = ("replicas", "metric", "kubernetes")
# RFC 1123 label (namespace) and subdomain (Deployment name), as the API server checks them.
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class ScaleTargetSpec:
    """One service's scale target; ``deployment``/``namespace`` only for ``kubernetes``."""

    kind: Literal["replicas", "metric", "kubernetes"]
    deployment: str | None = None
    namespace: str | None = None


Block = Mapping[str, Any] | Autoscale | AutoscaleRule
"""An ``autoscale:`` block, typed (a loaded policy's) or as written."""


def _as_written(autoscale: Block) -> Mapping[str, Any]:
    """The block's ``scale_target`` as the user wrote it (absent when not written)."""
    if isinstance(autoscale, Mapping):
        return autoscale
    if SCALE_TARGET_KEY in autoscale.model_fields_set:
        return {SCALE_TARGET_KEY: autoscale.scale_target}
    return {}


def read_scale_target(autoscale: Block, *, has_replicas: bool) -> ScaleTargetSpec:
    """The target of a block that passed :func:`scale_target_issues` (raises ValueError on
    one that did not)."""
    issues = list(scale_target_issues(autoscale, has_replicas=has_replicas, loc=()))
    if issues:
        raise ValueError("; ".join(message for _, message in issues))
    raw = _as_written(autoscale).get(SCALE_TARGET_KEY, "replicas")
    if isinstance(raw, str):
        return ScaleTargetSpec("metric" if raw == "metric" else "replicas")
    spec = raw["kubernetes"]
    return ScaleTargetSpec("kubernetes", str(spec["deployment"]), str(spec["namespace"]))


def scale_target_issues(
    autoscale: Block, *, has_replicas: bool, loc: Loc
) -> Iterator[tuple[Loc, str]]:
    """Every problem of the block's ``scale_target`` (and of its pairing with ``replicas:``),
    each at its field under ``loc`` (the ``autoscale`` block's location)."""
    autoscale = _as_written(autoscale)
    at = (*loc, SCALE_TARGET_KEY)
    if SCALE_TARGET_KEY not in autoscale:
        if not has_replicas:
            yield (
                loc,
                "autoscale without replicas: needs a scale_target: metric (publish the "
                "desired count for KEDA or an HPA) or {kubernetes: {deployment: NAME, "
                "namespace: NS}} (patch that Deployment's scale); or add a replicas: section",
            )
        return
    raw = autoscale[SCALE_TARGET_KEY]
    if isinstance(raw, str):
        if raw not in ("replicas", "metric"):
            yield (
                at,
                f"unknown scale_target {raw!r}; expected replicas, metric or {{kubernetes: ...}}",
            )
            return
        kind = raw
    elif isinstance(raw, Mapping):
        if set(raw) != {"kubernetes"}:
            yield at, "a mapping scale_target has exactly one key, kubernetes"
            return
        yield from _kubernetes_issues(raw["kubernetes"], (*at, "kubernetes"))
        kind = "kubernetes"
    else:
        yield at, f"expected one of {', '.join(_KINDS)}, got {type(raw).__name__}"
        return
    if kind == "replicas" and not has_replicas:
        yield at, "scale_target replicas needs a replicas: section (the gateway runs them)"
    elif kind != "replicas" and has_replicas:
        yield (
            at,
            f"scale_target {kind} sizes replicas something else runs, but this service has "
            "replicas: the gateway runs them itself; remove replicas: or use scale_target "
            "replicas",
        )


def _kubernetes_issues(spec: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if not isinstance(spec, Mapping):
        yield loc, f"expected {{deployment: NAME, namespace: NS}}, got {type(spec).__name__}"
        return
    for key in sorted(set(spec) - {"deployment", "namespace"}, key=str):
        yield (*loc, key), "unknown key; expected deployment or namespace"
    checks = (
        ("deployment", _SUBDOMAIN, 253, "a DNS subdomain"),
        ("namespace", _LABEL, 63, "a DNS label"),
    )
    for key, pattern, longest, what in checks:
        value = spec.get(key)
        if value is None:
            yield (*loc, key) if key in spec else loc, f"{key} is required"
        elif not isinstance(value, str) or not pattern.match(value) or len(value) > longest:
            yield (*loc, key), f"{key} {value!r} is not {what} (lower case, digits, '-')"
