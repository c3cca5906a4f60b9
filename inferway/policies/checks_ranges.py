"""What Envoy's own validation refuses although the schema accepts it: regexes that RE2 (the
engine Envoy compiles them with) cannot parse, and numbers outside the protobuf ranges the
values end up in. Without these, such a policy validates, is pushed, and Envoy NACKs it.

Walks the whole validated policy generically, so a new field is covered without a new rule:
every ``regex`` string is compiled with RE2, every integer must fit a uint32 (Envoy's counts,
thresholds and sizes), every duration must fit a protobuf Duration, and timeouts Envoy requires
to be positive are checked by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import re2
from pydantic import BaseModel

from inferway.policies.model import Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["check_ranges", "check_regex", "walk_policy"]

UINT32_MAX = 2**32 - 1
MAX_DURATION_S = 315_576_000_000
"""google.protobuf.Duration holds at most +315,576,000,000 seconds (about 10,000 years)."""
_POSITIVE_DURATIONS = {"connect_timeout"}
"""Durations Envoy validates as ``gt: 0`` (a zero is refused by Envoy, not by the schema)."""

_REGEX_FIELDS = {"regex", "patterns"}
"""Fields holding RE2 patterns (``patterns``: the list of the policy's ``mask``)."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the error comes back as a located issue, not on stderr


def check_regex(pattern: str) -> str | None:
    """RE2's complaint about ``pattern`` (e.g. "missing ): tr(ue"), None when it compiles."""
    try:
        re2.compile(pattern, _OPTIONS)
    except re2.error as error:
        reason = error.args[0] if error.args else str(error)
        return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    return None


def check_ranges(policy: Policy) -> Iterator[tuple[Loc, str]]:
    for loc, name, value in walk_policy(policy):
        if name in _REGEX_FIELDS and isinstance(value, str):
            reason = check_regex(value)
            if reason is not None:
                yield loc, f"invalid regex {value!r}: {reason} (Envoy compiles regexes with RE2)"
        elif isinstance(value, bool) or ("features" in loc and "fields" in loc):
            continue  # a body field's bounds and values are JSON numbers, not Envoy's counts
        elif isinstance(value, int):
            if value > UINT32_MAX:
                yield loc, f"{value} is too large: Envoy holds it in 32 bits (at most {UINT32_MAX})"
            elif value < 0:
                yield loc, f"{value} must not be negative"
        elif isinstance(value, float):
            if value > MAX_DURATION_S:
                yield loc, f"{value:g} is too large (at most {MAX_DURATION_S} seconds)"
            elif name in _POSITIVE_DURATIONS and value <= 0:
                yield loc, f"{name} must be more than 0 s (Envoy refuses 0), got {value:g}"


def walk_policy(policy: Policy) -> Iterator[tuple[Loc, str, Any]]:
    """Every leaf value of ``policy`` as (loc, field name, value); list items carry the name
    of the list's field."""
    return _walk(policy, ())


def _walk(value: Any, loc: Loc, name: str = "") -> Iterator[tuple[Loc, str, Any]]:
    if isinstance(value, BaseModel):
        for field in type(value).model_fields:
            yield from _walk(getattr(value, field), (*loc, field), field)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _walk(item, (*loc, index), name)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, (*loc, str(key)), name)
    else:
        yield loc, name, value
