"""Map a message of Envoy's own validation back to the policy field it is about, so
``inferway validate --envoy`` can print ``file:line:column`` instead of a proto path.

Envoy names protos, not policy fields; three clues, tried in order, are usually enough:
a proto constraint error names the message type and field ("HeaderMatcherValidationError.Name"),
a quoted value may be one the policy holds, and resource names are the policy's own names
(clusters are services, listeners and routes keep their names). None fit: the caller reports
the message against the file as a whole.
"""

from __future__ import annotations

import re
from typing import Any

from inferway.policies.checks_ranges import walk_policy
from inferway.policies.model import Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["locate_envoy_message"]

_PROTO_ERROR = re.compile(r"(\w+?)ValidationError\.(\w+)")
_QUOTED = re.compile(r"'([^']+)'|\"([^\"]+)\"")
_SECTIONS = {
    "HeaderMatcher": "headers",
    "RouteMatch": "match",
    "Route": "routes",
    "RouteAction": "routes",
    "VirtualHost": "routes",
    "RetryPolicy": "retries",
    "Cluster": "services",
    "HealthCheck": "health_check",
    "OutlierDetection": "outlier_detection",
    "Listener": "listeners",
}
_NAMED_SECTIONS = ("services", "listeners", "routes")


def locate_envoy_message(policy: Policy, message: str) -> list[Loc]:
    """The policy locations ``message`` is about, most specific first; empty when unknown."""
    leaves = list(walk_policy(policy))
    for clue in (_by_proto_field, _by_quoted_value, _by_resource_name):
        found = clue(policy, leaves, message)
        if found:
            return found
    return []


def _by_proto_field(policy: Policy, leaves: list[tuple[Loc, str, Any]], message: str) -> list[Loc]:
    matches = _PROTO_ERROR.findall(message)
    if not matches:
        return []
    proto, field = matches[-1]  # the innermost cause
    section = _SECTIONS.get(proto)
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", field).lower()
    found = [loc for loc, leaf, _ in leaves if leaf == name and (section is None or section in loc)]
    return found if len(found) == 1 else []


def _by_quoted_value(policy: Policy, leaves: list[tuple[Loc, str, Any]], message: str) -> list[Loc]:
    quoted = {a or b for a, b in _QUOTED.findall(message)}
    return [loc for loc, _, value in leaves if isinstance(value, str) and value in quoted]


def _by_resource_name(
    policy: Policy, leaves: list[tuple[Loc, str, Any]], message: str
) -> list[Loc]:
    words = set(re.findall(r"[\w.-]+", message))
    found: list[Loc] = []
    for section in _NAMED_SECTIONS:
        for index, item in enumerate(getattr(policy, section)):
            if item.name in words:
                found.append((section, index, "name"))
    return found
