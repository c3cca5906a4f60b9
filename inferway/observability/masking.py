"""Masking sensitive request data out of what inferway logs and traces.

Two kinds of rule, from the policy's ``mask`` (policies/masking.py): JSON field paths, whose
values are replaced whatever they hold, and RE2 patterns (the built-ins for e-mail addresses,
phone and ID numbers, and the policy's own), whose matches are replaced in any string. A
string that is itself a JSON object or list (a logged body, an attribute holding one) gets
both: its fields by path, then every string in it by pattern.

Pure and cheap when idle: a :class:`Masker` with no rules returns its input unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import re2

__all__ = ["BUILTIN_PATTERNS", "NO_MASKING", "Masker", "build_masker_from", "pattern_error"]

BUILTIN_PATTERNS: dict[str, str] = {
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "phone": (
        r"\+\d{1,3}[ .-]?\(?\d{1,4}\)?(?:[ .-]\d{2,4}){2,3}\b"
        r"|\+\d{8,15}\b"
        r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}\b"
        r"|\b\d{3}[.-]\d{3}[.-]\d{4}\b"
    ),
    "id_number": r"\b\d{3}-\d{2}-\d{4}\b|\b\d{17}[\dXx]\b|\b(?:\d{4}[ -]?){3}\d{4}\b",
}
"""Deliberately narrow (a date or a request id must not look like a phone number): e-mail
addresses; phone numbers with a country code (``+44 20 7946 0958``, ``+14155550100``) or as
``(555) 123-4567`` / ``555-123-4567``; ID numbers as US social security numbers
(``123-45-6789``), 18-character resident ID numbers and 16-digit card numbers."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


class Masker:
    def __init__(
        self,
        fields: Iterable[str] = (),
        patterns: Iterable[str] = (),
        replacement: str = "[MASKED]",
    ) -> None:
        self.fields = tuple(dict.fromkeys(fields))
        self.patterns = tuple(dict.fromkeys(patterns))
        self.replacement = replacement
        self._regex = (
            re2.compile("|".join(f"(?:{p})" for p in self.patterns), _OPTIONS)
            if self.patterns
            else None
        )
        self._paths = [tuple(f.split(".")) for f in self.fields]

    @property
    def active(self) -> bool:
        return bool(self.fields or self.patterns)

    def text(self, value: str) -> str:
        """``value`` with every pattern match replaced; a JSON document also has its fields
        masked by path."""
        if not self.active:
            return value
        stripped = value.lstrip()
        if self._paths and stripped[:1] in ("{", "["):
            try:
                document = json.loads(value)
            except ValueError:
                pass
            else:
                return json.dumps(self.document(document), separators=(",", ":"))
        return self._patterns(value)

    def document(self, document: Any) -> Any:
        """A parsed JSON document with its masked fields replaced and every string in it
        pattern-masked (a new object; the input is not changed)."""
        if not self.active:
            return document
        masked = self._strings(document)
        for path in self._paths:
            _replace_path(masked, path, self.replacement)
        return masked

    def value(self, value: Any) -> Any:
        """An attribute or log value: strings masked, lists and dicts walked."""
        return self._strings(value) if self.active else value

    def _patterns(self, value: str) -> str:
        if self._regex is None:
            return value
        return str(self._regex.sub(self.replacement, value))

    def _strings(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value) if self._paths else self._patterns(value)
        if isinstance(value, dict):
            return {k: self._strings(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._strings(v) for v in value]
        return value


def _replace_path(document: Any, path: tuple[str, ...], replacement: str) -> None:
    current = document
    for segment in path[:-1]:
        current = _child(current, segment)
        if current is None:
            return
    last = path[-1]
    if isinstance(current, dict) and last in current:
        current[last] = replacement
    elif (
        isinstance(current, list) and last.isascii() and last.isdigit() and int(last) < len(current)
    ):
        current[int(last)] = replacement


def _child(node: Any, segment: str) -> Any:
    if isinstance(node, dict):
        return node.get(segment)
    if (
        isinstance(node, list)
        and segment.isascii()
        and segment.isdigit()
        and int(segment) < len(node)
    ):
        return node[int(segment)]
    return None


NO_MASKING = Masker()


def build_masker_from(
    rules: Iterable[str], fields: Iterable[str] = (), replacement: str = "[MASKED]"
) -> Masker:
    """A masker from built-in names (``email``, ``phone``, ``id_number``) and RE2 patterns,
    as ``inferway serve --mask`` and the policy's ``mask`` give them."""
    return Masker(fields, [BUILTIN_PATTERNS.get(r, r) for r in rules], replacement)


def pattern_error(pattern: str) -> str | None:
    """Why RE2 cannot compile ``pattern`` (None: it can)."""
    try:
        re2.compile(pattern, _OPTIONS)
    except re2.error as error:
        reason = error.args[0] if error.args else str(error)
        return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    return None
