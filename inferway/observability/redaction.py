"""Keep credentials out of inferway's own logs.

Envoy's access logs and traces never read credential headers (see
``inferway.xds.translate.redaction``), but a Python log line can still carry one: an error
message quoting a request's headers, a dict of headers logged at debug level. ``RedactingFilter``
rewrites every record's message before any handler formats it, replacing the value of each
sensitive header (``Authorization: Bearer x``, ``'x-api-key': 'x'``, ``cookie=x``) and any
bare ``Bearer <token>`` with ``[REDACTED]``; then the policy's ``mask`` rules (e-mail
addresses, phone and ID numbers, its own patterns and JSON fields: observability/masking.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from inferway.observability.masking import NO_MASKING, Masker

__all__ = ["CREDENTIAL_HEADERS", "REDACTED", "RedactingFilter", "install_redaction", "redact_text"]

CREDENTIAL_HEADERS: tuple[str, ...] = (
    "authorization",
    "cookie",
    "proxy-authorization",
    "set-cookie",
    "x-api-key",
)
"""Headers that carry credentials: never written to access logs, traces or inferway's logs,
whatever the policy says (the policy's access rules and log fields read this list)."""

REDACTED = "[REDACTED]"
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")


def _header_pattern(names: Iterable[str]) -> re.Pattern[str]:
    """``name: value``, ``name=value``, ``'name': 'value'``: a quoted value up to its closing
    quote, an unquoted one up to the end of the line, a comma or a closing brace (generous on
    purpose: scrubbing too much beats leaking)."""
    alternatives = "|".join(re.escape(n) for n in sorted(set(names), key=len, reverse=True))
    return re.compile(
        rf"(?i)(?P<key>[\"']?\b(?:{alternatives})[\"']?\s*[:=]\s*)"
        r"(?:(?P<quote>[\"'])(?:\\.|(?!(?P=quote)).)*(?P=quote)|[^\r\n,}\]]+)"
    )


def _replace(match: re.Match[str]) -> str:
    quote = match["quote"] or ""
    return f"{match['key']}{quote}{REDACTED}{quote}"


def redact_text(text: str, names: Iterable[str] = CREDENTIAL_HEADERS) -> str:
    """``text`` with the values of the ``names`` headers and bearer tokens replaced."""
    text = _header_pattern(names).sub(_replace, text)
    return _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)


class RedactingFilter(logging.Filter):
    """A logging filter (attach to handlers) that scrubs each record's final message."""

    def __init__(
        self, names: Iterable[str] = CREDENTIAL_HEADERS, masker: Masker = NO_MASKING
    ) -> None:
        super().__init__()
        self.masker = masker
        """The policy's ``mask`` rules, applied after the header redaction."""
        self.set_names(names)

    def set_names(self, names: Iterable[str]) -> None:
        """Redact the credential headers plus ``names`` from now on (a policy's
        ``redact_headers`` can change while the gateway runs)."""
        self.names = tuple(dict.fromkeys([*CREDENTIAL_HEADERS, *(n.lower() for n in names)]))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it for the handler to report
            return True
        scrubbed = self._scrub(message)
        if scrubbed != message or record.args:
            record.msg, record.args = scrubbed, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._scrub(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = self._scrub(record.exc_text)
        return True

    def _scrub(self, text: str) -> str:
        return self.masker.text(redact_text(text, self.names))


def install_redaction(
    names: Iterable[str] = CREDENTIAL_HEADERS,
    logger: logging.Logger | None = None,
    masker: Masker = NO_MASKING,
) -> RedactingFilter:
    """Make every handler of ``logger`` (default: the root logger) redact the credential
    headers plus ``names`` and apply ``masker``: a handler's RedactingFilter is updated, one is
    added where none is."""
    target = logger or logging.getLogger()
    redacting = RedactingFilter(names, masker)
    for handler in target.handlers:
        present = [f for f in handler.filters if isinstance(f, RedactingFilter)]
        for existing in present:
            existing.set_names(names)
            existing.masker = masker
        if not present:
            handler.addFilter(redacting)
    return redacting
