"""Requests generated from a policy's routes so that every route and every condition of it
is exercised: for each route one request that satisfies all its conditions, then variants
that sit on each bound of a feature rule (rows, input bytes, numeric fields) and variants
that break one condition each (path, a header, a cookie, a field, a bound, a malformed body)
and so must fall to a later route, be refused, or reach no route.

A variant's expectation is not decided here: :func:`expect.expect` computes it from the
match order, so a variant that an earlier route catches is judged as the gateway must
route it. Regex conditions get their values from ``rstr`` (a string generated from the
pattern, kept only when RE2 agrees it matches).
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import re2

from inferway.policies.model import HeaderMatch, PathMatch
from inferway.policies.route_traffic import CookieMatch
from inferway.tools.verify.expect import Probe
from inferway.tools.verify.features import Bounds, FeatureRule, FieldRule
from inferway.tools.verify.routes import VerifyRoute

__all__ = ["Coverage", "generate_probes"]

PAD_FIELD = "id"
"""The OIP request's own optional ``id``: padding a body to a size changes nothing else."""
_TRIES = 32
_SAFE = set(string.ascii_letters + string.digits + "-._~/:@!$&'()*+,;=")
_NO_MATCH = ("inferway-verify-no-match", "", "0", "~", "/inferway-verify-no-match")


@dataclass
class Coverage:
    """What the generated requests could not cover, one line each (a regex no value was
    found for, a bound no body can sit on)."""

    uncovered: list[str] = field(default_factory=list)


class _Gen:
    def __init__(self, seed: int) -> None:
        import rstr  # the verify extra: imported when cases are made, not with the CLI

        self.random = random.Random(seed)
        self.rstr = rstr.Rstr(self.random)

    def sample(self, pattern: str, *, path: bool = False) -> str | None:
        """A value RE2 fully matches, of URL/header-safe characters (None: none found)."""
        for _ in range(_TRIES):
            try:
                value = self.rstr.xeger(pattern)
            except Exception:  # rstr reads Python's regex syntax; RE2-only syntax fails here
                return None
            if path and not value.startswith("/"):
                continue
            if set(value) <= _SAFE and re2.fullmatch(pattern, value) is not None:
                return value
        return None


def _no_match(pattern: str) -> str | None:
    """A value the pattern neither fully nor partly matches (whichever the router uses)."""
    for value in _NO_MATCH:
        if re2.search(pattern, value) is None:
            return value
    return None


def _path(match: PathMatch, gen: _Gen) -> str | None:
    if match.prefix is not None:
        return match.prefix + ("verify" if match.prefix.endswith("/") else "")
    if match.exact is not None:
        return match.exact
    assert match.regex is not None
    return gen.sample(match.regex, path=True)


def _path_miss(match: PathMatch) -> str | None:
    if match.prefix is not None:
        return None if match.prefix == "/" else "/inferway-verify-no-match"
    if match.exact is not None:
        return match.exact.rstrip("/") + "/inferway-verify-no-match"
    assert match.regex is not None
    candidate = "/inferway-verify-no-match"
    return candidate if re2.fullmatch(match.regex, candidate) is None else None


def _header_value(match: HeaderMatch, gen: _Gen, *, satisfy: bool) -> str | None:
    """A value for the header that makes the (possibly inverted) matcher hold or fail;
    None means: leave the header out."""
    want = satisfy != match.invert  # what the un-inverted condition must be
    if match.present is not None:
        return "1" if want == match.present else None
    if match.exact is not None:
        return match.exact if want else match.exact + "-not"
    if match.prefix is not None:
        return match.prefix + "verify" if want else "~" + match.prefix
    assert match.regex is not None
    return gen.sample(match.regex) if want else _no_match(match.regex)


def _header_needed(match: HeaderMatch, *, satisfy: bool) -> bool:
    """Whether the header must be sent for the outcome (a missing header matches only
    ``present: false``, or inverted ``present: true``)."""
    if match.present is not None:
        return (satisfy != match.invert) == match.present
    return satisfy


def _cookie_value(match: CookieMatch, *, satisfy: bool) -> str | None:
    if match.present is not None:
        return "1" if satisfy == match.present else None
    assert match.exact is not None
    return match.exact if satisfy else match.exact + "not"


def _field_value(rule: FieldRule, gen: _Gen) -> tuple[bool, Any]:
    """(set, value) satisfying the field rule."""
    if rule.present is not None:
        return rule.present, "present"
    if rule.exact is not None:
        return True, rule.exact
    if rule.regex is not None:
        value = gen.sample(rule.regex)
        return value is not None, value
    return True, _in_bounds(Bounds(min=rule.min, max=rule.max))


def _in_bounds(bounds: Bounds) -> float:
    if bounds.min is not None:
        return bounds.min
    return bounds.max if bounds.max is not None else 0


def _other(exact: bool | int | float | str) -> bool | int | float | str:
    """A value of the same JSON type that is not ``exact``."""
    if isinstance(exact, bool):
        return not exact
    if isinstance(exact, int | float):
        return exact + 1
    return exact + "-not"


def _set(document: dict[str, Any], path: str, value: Any, *, present: bool = True) -> None:
    """Set (or, not ``present``, remove) a dotted path; a number indexes an existing list."""
    *parents, last = path.split(".")
    node: Any = document
    for part in parents:
        if isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict):
            if not isinstance(node.get(part), dict | list):
                node[part] = {}
            node = node[part]
        else:
            return
    if isinstance(node, list) and last.isascii() and last.isdigit() and int(last) < len(node):
        if present:
            node[int(last)] = value
    elif isinstance(node, dict):
        if present:
            node[last] = value
        else:
            node.pop(last, None)


def _body(rows: int, fields: dict[str, tuple[bool, Any]], size: int | None = None) -> bytes | None:
    """An OIP request body with ``rows`` rows and the fields set, padded to ``size`` bytes
    through its ``id`` (None: it cannot be that small)."""
    document: dict[str, Any] = {
        "inputs": [{"name": "input", "shape": [rows, 1], "datatype": "FP32", "data": [0] * rows}]
    }
    for path, (present, value) in fields.items():
        _set(document, path, value, present=present)
    body = orjson.dumps(document)
    if size is None or size == len(body):
        return body
    if PAD_FIELD in document:
        return None
    overhead = len(orjson.dumps({**document, PAD_FIELD: ""})) - len(body)
    pad = size - len(body) - overhead
    if pad < 0:
        return None
    return orjson.dumps({**document, PAD_FIELD: "x" * pad})


@dataclass
class _Base:
    path: str
    headers: dict[str, str]
    cookies: dict[str, str]
    rows: int
    fields: dict[str, tuple[bool, Any]]
    size: int | None

    def probe(self, covers: str, **changes: Any) -> Probe | None:
        path = changes.get("path", self.path)
        headers = dict(changes.get("headers", self.headers))
        cookies = changes.get("cookies", self.cookies)
        body = changes.get("body")
        if body is None:
            body = _body(
                changes.get("rows", self.rows),
                changes.get("fields", self.fields),
                changes.get("size", self.size),
            )
        if body is None or path is None:
            return None
        if cookies:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        headers.setdefault("content-type", "application/json")
        return Probe(covers, path, tuple(sorted(headers.items())), body)


def _rows_range(bounds: Bounds | None) -> tuple[int | None, int | None]:
    if bounds is None:
        return None, None
    low = None if bounds.min is None else max(0, math.ceil(bounds.min))
    high = None if bounds.max is None else math.floor(bounds.max)
    return low, high


def _base(route: VerifyRoute, gen: _Gen) -> _Base | str:
    """The request satisfying every condition of ``route``, or why none could be made."""
    path = _path(route.path, gen)
    if path is None:
        return f"route {route.name}: no path found for regex {route.path.regex!r}"
    headers: dict[str, str] = {}
    for h in route.headers:
        if _header_needed(h, satisfy=True):
            value = _header_value(h, gen, satisfy=True)
            if value is None:
                return f"route {route.name}: no value found for header {h.name}"
            headers[h.name.lower()] = value
    cookies = {c.name: v for c in route.cookies if (v := _cookie_value(c, satisfy=True))}
    rule = route.features or FeatureRule()
    low, high = _rows_range(rule.rows)
    rows = low if low is not None else min(1, high) if high is not None else 1
    fields: dict[str, tuple[bool, Any]] = {}
    for f in rule.fields:
        fields[f.path] = _field_value(f, gen)
        if f.regex is not None and not fields[f.path][0]:
            return f"route {route.name}: no value found for field {f.path} regex {f.regex!r}"
    size = None
    if rule.input_bytes is not None and rule.input_bytes.min is not None:
        size = math.ceil(rule.input_bytes.min)
    return _Base(path, headers, cookies, rows, fields, size)


def _variants(route: VerifyRoute, base: _Base, gen: _Gen) -> Iterator[tuple[str, Probe | None]]:
    n = route.name
    yield f"{n}: every condition holds", base.probe(f"{n}: every condition holds")
    miss = _path_miss(route.path)
    if miss is not None:
        yield f"{n}: path does not match", base.probe(f"{n}: path does not match", path=miss)
    for h in route.headers:
        without = {k: v for k, v in base.headers.items() if k != h.name.lower()}
        if h.present is not None:  # present or absent: one way to break it
            label = f"{n}: header {h.name} not matching"
            if _header_needed(h, satisfy=False):
                without[h.name.lower()] = "1"
            yield label, base.probe(label, headers=without)
            continue
        label = f"{n}: header {h.name} absent"
        yield label, base.probe(label, headers=without)
        value = _header_value(h, gen, satisfy=False)
        label = f"{n}: header {h.name}: {value!r} not matching"
        yield (
            label,
            None
            if value is None
            else base.probe(label, headers={**without, h.name.lower(): value}),
        )
    for c in route.cookies:
        cookies = {k: v for k, v in base.cookies.items() if k != c.name}
        if (value := _cookie_value(c, satisfy=False)) is not None:
            cookies[c.name] = value
        label = f"{n}: cookie {c.name} not matching"
        yield label, base.probe(label, cookies=cookies)
    if route.features is not None:
        yield from _feature_variants(n, route.features, base)


def _feature_variants(n: str, rule: FeatureRule, base: _Base) -> Iterator[tuple[str, Probe | None]]:
    low, high = _rows_range(rule.rows)
    for rows, what in ((low, "min"), (high, "max")):
        if rows is not None:
            label = f"{n}: rows {rows} (at {what})"
            yield label, base.probe(label, rows=rows)
    if low is not None and low > 0:
        label = f"{n}: rows {low - 1} (below min)"
        yield label, base.probe(label, rows=low - 1)
    if high is not None:
        label = f"{n}: rows {high + 1} (above max)"
        yield label, base.probe(label, rows=high + 1)
    if rule.input_bytes is not None:
        for bound, step, what in (
            (rule.input_bytes.min, 0, "at min"),
            (rule.input_bytes.min, -1, "below min"),
            (rule.input_bytes.max, 0, "at max"),
            (rule.input_bytes.max, 1, "above max"),
        ):
            if bound is None:
                continue
            size = (math.ceil(bound) if step <= 0 else math.floor(bound)) + step
            label = f"{n}: body {size} bytes ({what})"
            yield label, base.probe(label, size=size)
    for f in rule.fields:
        yield from _field_variants(n, f, base)
    label = f"{n}: body not JSON (on_malformed: {rule.on_malformed})"
    yield label, base.probe(label, body=b"not json {")
    if rule.rows is not None:
        label = f"{n}: JSON but no inference request (on_malformed: {rule.on_malformed})"
        yield label, base.probe(label, body=b'{"parameters": {}}')


def _field_variants(n: str, f: FieldRule, base: _Base) -> Iterator[tuple[str, Probe | None]]:
    def with_field(present: bool, value: Any) -> dict[str, tuple[bool, Any]]:
        return {**base.fields, f.path: (present, value)}

    if f.present is not None:
        label = f"{n}: field {f.path} {'absent' if f.present else 'present'}"
        yield label, base.probe(label, fields=with_field(not f.present, "present"))
        return
    label = f"{n}: field {f.path} absent"
    yield label, base.probe(label, fields=with_field(False, None))
    if f.exact is not None:
        label = f"{n}: field {f.path} not {f.exact!r}"
        yield label, base.probe(label, fields=with_field(True, _other(f.exact)))
    elif f.regex is not None:
        value = _no_match(f.regex)
        label = f"{n}: field {f.path} not matching {f.regex!r}"
        yield label, None if value is None else base.probe(label, fields=with_field(True, value))
    else:
        for bound, step, what in (
            (f.min, 0, "min"),
            (f.max, 0, "max"),
            (f.min, -1, "below min"),
            (f.max, 1, "above max"),
        ):
            if bound is not None:
                label = f"{n}: field {f.path} = {bound + step:g} ({what})"
                yield label, base.probe(label, fields=with_field(True, bound + step))


def generate_probes(routes: list[VerifyRoute], *, seed: int = 0) -> tuple[list[Probe], Coverage]:
    """Probes covering every route of ``routes`` (in match order) and each of its conditions;
    deterministic for a seed."""
    gen = _Gen(seed)
    probes: list[Probe] = []
    coverage = Coverage()
    seen: set[tuple[str, tuple[tuple[str, str], ...], bytes]] = set()
    for route in routes:
        base = _base(route, gen)
        if isinstance(base, str):
            coverage.uncovered.append(base)
            continue
        for label, probe in _variants(route, base, gen):
            if probe is None:
                coverage.uncovered.append(f"{label}: no request could be made")
                continue
            key = (probe.path, probe.headers, probe.body)
            if key not in seen:
                seen.add(key)
                probes.append(probe)
    return probes, coverage
