"""Routing on what a request carries, not only where it goes: a route's ``match.features``.

.. code-block:: yaml

    match:
      path: {prefix: /v2/models/demo/infer}
      features:                       # every feature given must hold
        rows: {min: 1, max: 4}        # the first input's shape[0] (Open Inference Protocol)
        input_bytes: {max: 65536}     # the request body's size in bytes
        fields:                       # JSON body fields by dotted path (a number indexes a list)
          - {path: parameters.priority, exact: high}
        on_malformed: skip            # or reject: 400 with a JSON error

The body is inspected by inferway's feature router (an Envoy external processor in the
control plane process, docs/routing.md), which Envoy asks before it routes: routes are then
matched again with the request's features. ``on_malformed`` says what a body that is not a
JSON inference request does to this route: ``skip`` (the route does not match; the next one
decides) or ``reject`` (refused with 400).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferway.policies.types import Duration

__all__ = [
    "DEFAULT_FEATURE_ROUTER_PORT",
    "FIELD_PATH_PATTERN",
    "FeatureRouter",
    "Features",
    "FieldMatch",
    "NumberRange",
    "SizeRange",
]

DEFAULT_FEATURE_ROUTER_PORT = 18091
FIELD_PATH_PATTERN = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+){0,15}$"
"""Dotted keys (``parameters.priority``); a segment of digits indexes a list (``inputs.0``)."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


def _number(value: float) -> str:
    """``:g`` for a float; an int as written (``:g`` would convert it, and overflow)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


class NumberRange(_Model):
    """Inclusive bounds; give min, max or both."""

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _bounds(self) -> NumberRange:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both (e.g. {min: 1, max: 4})")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(
                f"min {_number(self.min)} is above max {_number(self.max)}: nothing could match"
            )
        return self


class SizeRange(NumberRange):
    """Whole non-negative counts (rows, bytes)."""

    min: Annotated[int, Field(ge=0)] | None = None
    max: Annotated[int, Field(ge=0)] | None = None


class FieldMatch(_Model):
    """One JSON body field: exactly one of exact, regex (RE2), present, or min/max."""

    path: str
    exact: bool | int | float | str | None = None
    """A string matches a string field, a number a number, true/false a boolean."""
    regex: str | None = Field(default=None, min_length=1)
    """RE2 (checks_ranges compiles it), matched against the whole of a string field."""
    present: bool | None = None
    """Whether the field exists at all (a null, object or list counts)."""
    min: float | None = None
    max: float | None = None

    @field_validator("path")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if not re.match(FIELD_PATH_PATTERN, value):
            raise ValueError(
                f"path {value!r}: dotted keys such as parameters.priority or inputs.0.name "
                "(letters, digits, '_' or '-'; a number indexes a list; at most 16 keys)"
            )
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> FieldMatch:
        given = [k for k in ("exact", "regex", "present") if getattr(self, k) is not None]
        if self.min is not None or self.max is not None:
            given.append("min/max")
        if len(given) != 1:
            raise ValueError(
                "give exactly one of exact, regex, present or min/max "
                f"(got {', '.join(given) or 'none'})"
            )
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(
                f"min {_number(self.min)} is above max {_number(self.max)}: nothing could match"
            )
        return self


class Features(_Model):
    """What the request body must show for the route to match; every one given must hold."""

    rows: SizeRange | None = None
    input_bytes: SizeRange | None = None
    fields: list[FieldMatch] = Field(default_factory=list)
    on_malformed: Literal["skip", "reject"] = "skip"

    @model_validator(mode="after")
    def _something(self) -> Features:
        if self.rows is None and self.input_bytes is None and not self.fields:
            raise ValueError("give at least one of rows, input_bytes or fields")
        return self


class FeatureRouter(_Model):
    """Where the gateway's feature router listens (Envoy's external processor for routes
    with ``features``), and how long Envoy waits for it before routing without features."""

    address: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_FEATURE_ROUTER_PORT, ge=1, le=65535)
    timeout: Duration = Field(default=0.2, gt=0, le=10)
