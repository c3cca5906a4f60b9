"""inferway's own log lines as JSON objects (for log collectors) or text (for people).

A collector (Kubernetes, journald, Loki) reads stderr line by line: ``json`` gives it one
object per line with ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message`` and the line's
structured fields (a log call's ``extra=``: a failed request's line carries ``request_id``,
Envoy's x-request-id, so it joins its access log line and its trace; xDS lines carry
``node_id`` and ``type_url``). ``text`` is for a terminal, fields in brackets.
``resolve_log_format(None)`` picks json when stderr is not a TTY (a container, a pipe).
"""

from __future__ import annotations

import datetime
import enum
import json
import logging
import sys
from typing import IO, Any, Literal

__all__ = [
    "LOG_FORMATS",
    "TEXT_LINE_FORMAT",
    "JsonFormatter",
    "LogFormat",
    "LogFormatChoice",
    "TextFieldsFormatter",
    "install_log_handler",
    "record_fields",
    "resolve_log_format",
]

LogFormat = Literal["json", "text"]
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "text")


class LogFormatChoice(enum.StrEnum):
    """The ``--log-format`` values, as a CLI choice (completion, a usage error for others)."""

    json = "json"
    text = "text"


TEXT_LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""A ``text`` line of a plain (not rich) handler; structured fields follow in brackets."""

# What every LogRecord has: anything else on a record came from a log call's ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def resolve_log_format(value: str | None, stream: IO[str] | None = None) -> LogFormat:
    """``value`` checked (``json`` or ``text``, any case), or, when None, json unless
    ``stream`` (default stderr) is a terminal. A bad value raises ValueError naming both."""
    if value is None:
        target = sys.stderr if stream is None else stream
        isatty = getattr(target, "isatty", None)
        return "text" if callable(isatty) and isatty() else "json"
    lowered = value.strip().lower()
    if lowered == "json":
        return "json"
    if lowered == "text":
        return "text"
    raise ValueError(f"unknown log format {value!r}: expected one of json, text")


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of one line: what its log call passed as ``extra=`` (or a
    filter added), e.g. ``request_id``, ``model``, ``node_id``."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per record; the fixed keys come first and are never overwritten by a
    field of the same name (such a field is kept as ``field_<name>``)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            document[f"field_{key}" if key in document else key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str, ensure_ascii=False)


class TextFieldsFormatter(logging.Formatter):
    """A plain format string, with the line's structured fields appended as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = record_fields(record)
        if not fields:
            return line
        suffix = " ".join(f"{key}={value}" for key, value in fields.items())
        head, newline, rest = line.partition("\n")  # keep a traceback below the fields
        return f"{head} [{suffix}]{newline}{rest}"


def install_log_handler(
    level: int | str,
    log_format: LogFormat,
    text_format: str = TEXT_LINE_FORMAT,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Make the root logger write ``log_format`` lines at ``level`` to ``stream`` (default
    stderr), replacing its handlers: the process that calls this owns its log output."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    formatter = JsonFormatter() if log_format == "json" else TextFieldsFormatter(text_format)
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return handler
