"""Turn pydantic validation errors into located, human issues.

pydantic reports ``loc=('routes', 0, 'retires')`` and ``Extra inputs are not permitted``;
a person needs ``policy.yaml:9:5: routes[0]: unknown key 'retires' (did you mean
'retries'?)``. This module walks the model classes alongside the error's ``loc`` (to know
the allowed keys, and to drop pydantic's internal loc parts) and asks the
:class:`MarkedDocument` for the position. It works for any pydantic root model, so other
YAML configs can reuse it.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Tag, ValidationError

from inferway.policies.errors import PolicyError, PolicyIssue
from inferway.policies.yaml_marks import (
    Loc,
    MarkedDocument,
    YamlSyntaxError,
    format_loc,
    load_marked_yaml,
)

__all__ = [
    "boolean_number_issues",
    "describe_kind",
    "describe_value",
    "known_keys",
    "locate_issue",
    "parse_loc",
    "place_issues",
    "validation_issues",
]

_EXTRA_KEYS: dict[str, tuple[str, ...]] = {"Endpoint": ("address",)}
"""Keys a model accepts besides its fields (consumed by a ``mode='before'`` validator)."""

_NAME_RULE = (
    "use lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or "
    "digit, at most 63 characters"
)


def describe_value(value: object) -> str:
    """A value as a person wrote it in YAML, for 'got ...' in messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value)


def describe_kind(value: object) -> str:
    """What kind of value this is, without the value: for files whose content must not be
    echoed (a file a policy names may be anything, and errors are shown by ``GET /status``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a value"


def _unwrap(annotation: Any) -> list[Any]:
    """The classes an annotation may hold: ``list[X] | None`` -> ``[list[X]]``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return [annotation]


def _step(annotation: Any, part: str | int) -> Any | None:
    """The annotation one level down ``part``, or None when ``part`` is not a field."""
    for candidate in _unwrap(annotation):
        origin = typing.get_origin(candidate)
        if isinstance(part, int) and origin in (list, tuple):
            args = typing.get_args(candidate)
            return args[0] if args else Any
        if (
            isinstance(part, str)
            and isinstance(candidate, type)
            and issubclass(candidate, BaseModel)
            and part in candidate.model_fields
        ):
            return candidate.model_fields[part].annotation
    return None


def _tagged(annotation: Any, part: str | int) -> Any | None:
    """The member of a tagged union (``Annotated[X, Tag(part)] | ...``) that ``part`` names,
    the loc part pydantic adds for a discriminated union."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        if any(isinstance(meta, Tag) and meta.tag == part for meta in annotation.__metadata__):
            return typing.get_args(annotation)[0]
        return _tagged(typing.get_args(annotation)[0], part)
    if origin is typing.Union or origin is types.UnionType:
        for member in typing.get_args(annotation):
            found = _tagged(member, part)
            if found is not None:
                return found
    return None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in _unwrap(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def known_keys(model: type[BaseModel]) -> tuple[str, ...]:
    """Every key a mapping for ``model`` may contain."""
    return (*model.model_fields, *_EXTRA_KEYS.get(model.__name__, ()))


def _clean_loc(root: type[BaseModel], loc: tuple[Any, ...], data: object) -> tuple[Loc, Any, Any]:
    """Keep the loc parts that are fields, list indexes or keys in the data.

    Returns the cleaned loc and the annotations of its last part and of that part's parent.
    """
    cleaned: list[str | int] = []
    annotation: Any = root
    parent: Any = root
    node: object = data
    for part in loc:
        nxt = _step(annotation, part)
        in_data = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        )
        if nxt is None and not in_data:
            member = _tagged(annotation, part)
            if member is not None:  # a tagged union's member: its fields come next
                annotation = member
            continue  # pydantic's own loc parts (union members, validator names)
        cleaned.append(part)
        parent = annotation
        annotation = nxt if nxt is not None else Any
        node = node[part] if in_data else None  # type: ignore[index]
    return tuple(cleaned), parent, annotation


_YAML_BOOL_HINT = (
    "YAML reads an unquoted yes, no, on, off, true or false as a boolean: quote the word you meant"
)


def _message(error: Any, loc: Loc, parent: Any, node: Any) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = describe_value(error.get("input"))
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        model = _model_of(parent)
        allowed = known_keys(model) if model else ()
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        if close:
            return f"unknown key '{key}' (did you mean '{close[0]}'?)"
        if allowed:
            return f"unknown key '{key}'; allowed keys: {', '.join(allowed)}"
        return f"unknown key '{key}'"
    if kind == "missing":
        return f"missing required field '{loc[-1]}'" if loc else "missing required field"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        if loc == ("version",):
            return f"unsupported policy version {got}; this inferway reads version 1"
        message = f"expected {ctx.get('expected')}, got {got}"
        if isinstance(error.get("input"), bool):
            message += f" ({_YAML_BOOL_HINT})"
        return message
    if kind == "string_pattern_mismatch":
        return f"invalid name {got}: {_NAME_RULE}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected a whole number, got {got}"
    if kind == "finite_number":
        return f"expected a finite number, got {got}"
    if kind in ("float_type", "float_parsing"):
        return f"expected a number, got {got}"
    if kind in ("bool_type", "bool_parsing"):
        return f"expected true or false, got {got}"
    if kind in ("string_type", "string_sub_type"):
        return f"expected a string, got {got}"
    if kind in ("list_type", "tuple_type"):
        return f"expected a list, got {got}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        model = _model_of(node)
        if model is not None and model.__name__ == "Endpoint":
            keys = ", ".join(known_keys(model))
            return f"expected 'host:port' or a mapping with keys {keys}, got {got}"
        keys = f" with keys {', '.join(known_keys(model))}" if model else ""
        return f"expected a mapping{keys}, got {got}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "too_long":
        return f"allows at most {ctx.get('max_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}, got {got}"
    if kind == "greater_than":
        return f"must be more than {ctx.get('gt')}, got {got}"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}, got {got}"
    if kind == "less_than":
        return f"must be less than {ctx.get('lt')}, got {got}"
    return f"{error['msg']} (got {got})"


def parse_located(text: str, source: str) -> tuple[MarkedDocument, list[PolicyIssue]]:
    """The YAML ``text`` with node positions, plus the located issues found while reading it
    (such as duplicate keys). A syntax error raises PolicyError at once: nothing to check."""
    try:
        document = load_marked_yaml(text)
    except YamlSyntaxError as error:
        raise PolicyError(
            [PolicyIssue(source, error.mark.line, error.mark.column, "", error.message)]
        ) from None
    issues = [
        PolicyIssue(source, i.mark.line, i.mark.column, format_loc(i.loc), i.message)
        for i in document.issues
    ]
    return document, issues


def in_file_order(issues: list[PolicyIssue]) -> list[PolicyIssue]:
    return sorted(issues, key=lambda i: (i.line or 0, i.column or 0))


def locate_issue(
    document: MarkedDocument, source: str, loc: Loc, message: str, *, at_key: bool = False
) -> PolicyIssue:
    """An issue for ``loc``, positioned on the deepest node of ``loc`` the document has."""
    mark = document.position(loc, at_key=at_key)
    return PolicyIssue(source, mark.line, mark.column, format_loc(loc), message)


def validation_issues(
    error: ValidationError, document: MarkedDocument, source: str, root: type[BaseModel]
) -> list[PolicyIssue]:
    """One located issue per pydantic error, for a model validated from ``document.data``."""
    issues: list[PolicyIssue] = []
    for item in error.errors(include_url=False):
        loc, parent, node = _clean_loc(root, tuple(item["loc"]), document.data)
        message = _message(item, loc, parent, node)
        at_key = item["type"] == "extra_forbidden"
        issues.append(locate_issue(document, source, loc, message, at_key=at_key))
    return issues


def _numeric(annotation: Any) -> bool:
    """An int or float field (a duration included), not a bool or a union with bool."""
    kinds = _unwrap(annotation)
    return bool(kinds) and all(k in (int, float) for k in kinds)


def boolean_number_issues(
    document: MarkedDocument, source: str, root: type[BaseModel]
) -> list[PolicyIssue]:
    """``weight: true`` is a number to pydantic (1) and a mistake to a person: one located
    issue for each YAML boolean written where ``root``'s schema expects a number."""
    issues: list[PolicyIssue] = []
    stack: list[tuple[object, Any, Loc]] = [(document.data, root, ())]
    while stack:
        node, annotation, loc = stack.pop()
        if isinstance(node, bool):
            if _numeric(annotation):
                message = f"expected a number, got {describe_value(node)}"
                issues.append(locate_issue(document, source, loc, message))
            continue
        items: Iterable[tuple[str | int, object]]
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        for part, child in items:
            below = _step(annotation, part)
            if below is not None:
                stack.append((child, below, (*loc, part)))
    return issues


_LOC_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def parse_loc(path: str) -> Loc:
    """``"routes[0].backends[1]"`` -> ``("routes", 0, "backends", 1)`` (format_loc's inverse)."""
    return tuple(int(index) if index else key for index, key in _LOC_PART.findall(path))


def place_issues(text: str, source: str, issues: Iterable[PolicyIssue]) -> list[PolicyIssue]:
    """Give a line and column to issues found after the policy loaded (such as a certificate
    file its TLS settings name that cannot be read): each issue of ``source`` (the policy
    file, whose content is ``text``) that names a field but no position is placed on that
    field; the others are kept as they are."""
    document: MarkedDocument | None = None
    placed: list[PolicyIssue] = []
    for issue in issues:
        if issue.file != source or issue.line is not None or not issue.path:
            placed.append(issue)
            continue
        if document is None:
            document = load_marked_yaml(text)
        mark = document.position(parse_loc(issue.path))
        placed.append(PolicyIssue(source, mark.line, mark.column, issue.path, issue.message))
    return placed
