"""A route's ``features:`` rule (rows, input size, JSON body fields) as verify reads it, and
whether a request body satisfies it.

verify keeps its own small reading of the rule so it can compute the expected pool of a
request independently of the gateway's implementation: a bug there shows up as a mismatch
here. Bounds are inclusive; a field's ``regex`` is RE2 and must match the whole value; an
``exact`` value matches a field of its own JSON type (a string a string, a number a number,
true/false a boolean); a number in a dotted path indexes a list (``inputs.0.name``). A body
is well formed when it is a JSON object, and, for a rule on ``rows``, an inference request
(``inputs[0].shape[0]`` a whole number); anything else is malformed for that rule.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import orjson
import re2
from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferway.gateway.features.measure import rows_of

__all__ = [
    "Bounds",
    "FeatureRule",
    "FieldRule",
    "Verdict",
    "body_document",
    "field_value",
    "match_features",
    "rows_of",
]


class _Model(BaseModel):
    # ignore: the gateway's own model (routing) may carry more than verify needs to know
    model_config = ConfigDict(extra="ignore", frozen=True)


class Bounds(_Model):
    """Inclusive ``min``/``max``; either may be left out."""

    min: float | None = None
    max: float | None = None

    def holds(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


class FieldRule(_Model):
    """One JSON body field by dotted path: ``exact``, ``regex``, ``present`` or ``min``/``max``."""

    path: str = Field(min_length=1)
    exact: bool | int | float | str | None = None
    regex: str | None = None
    present: bool | None = None
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> FieldRule:
        kinds = [k for k in ("exact", "regex", "present") if getattr(self, k) is not None]
        if self.min is not None or self.max is not None:
            kinds.append("min/max")
        if len(kinds) != 1:
            raise ValueError(
                f"field {self.path}: give one of exact, regex, present or min/max "
                f"(got {', '.join(kinds) or 'none'})"
            )
        return self

    def holds(self, document: dict[str, Any]) -> bool:
        found, value = field_value(document, self.path)
        if self.present is not None:
            return found == self.present
        if not found:
            return False
        if self.exact is not None:
            return _same(value, self.exact)
        if self.regex is not None:
            return isinstance(value, str) and re2.fullmatch(self.regex, value) is not None
        if not _number(value):
            return False
        return Bounds(min=self.min, max=self.max).holds(float(value))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same(value: object, exact: bool | int | float | str) -> bool:
    """Equal and of one JSON type (1 and 1.0 are one number; true is not 1)."""
    if isinstance(exact, bool) or isinstance(value, bool):
        return isinstance(exact, bool) and isinstance(value, bool) and value is exact
    if _number(exact):
        return _number(value) and float(value) == float(exact)  # type: ignore[arg-type]
    return isinstance(value, str) and value == exact


class FeatureRule(_Model):
    """All given conditions must hold; ``on_malformed`` says what a non-JSON body gets."""

    rows: Bounds | None = None
    input_bytes: Bounds | None = None
    fields: list[FieldRule] = Field(default_factory=list)
    on_malformed: Literal["skip", "reject"] = "skip"


class Verdict(enum.StrEnum):
    match = "match"
    miss = "miss"
    malformed = "malformed"
    """The body is not a JSON object: the rule skips the route or rejects (400)."""


def body_document(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None when it is not one."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return document if isinstance(document, dict) else None


def field_value(document: dict[str, Any], path: str) -> tuple[bool, Any]:
    """(found, value) of a dotted path such as ``parameters.priority`` (``inputs.0``: the
    first item of a list)."""
    node: Any = document
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def match_features(rule: FeatureRule, body: bytes) -> Verdict:
    """Whether ``body`` satisfies ``rule``."""
    document = body_document(body)
    if document is None:
        return Verdict.malformed
    rows = rows_of(document)
    if rule.rows is not None and rows is None:
        return Verdict.malformed  # a rule on rows needs an inference request
    if rule.input_bytes is not None and not rule.input_bytes.holds(len(body)):
        return Verdict.miss
    if rule.rows is not None and (rows is None or not rule.rows.holds(rows)):
        return Verdict.miss
    if not all(f.holds(document) for f in rule.fields):
        return Verdict.miss
    return Verdict.match
