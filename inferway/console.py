"""Shared rich output for the CLI: one look for errors, ages and versions across commands.

Light on purpose: ``inferway status`` imports it on the CLI's fast path, so the policy model
is a type only and the logging handlers are imported when logging is configured.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from inferway.observability.log_format import (
    JsonFormatter,
    LogFormat,
    TextFieldsFormatter,
    resolve_log_format,
)

if TYPE_CHECKING:
    from inferway.policies import PolicyIssue

__all__ = [
    "configure_logging",
    "format_age",
    "issue_text",
    "make_console",
    "print_issues",
    "short_version",
]


def make_console(*, stderr: bool = False, soft_wrap: bool = True) -> Console:
    """``soft_wrap`` keeps each printed line whole (an issue stays one greppable line); turn it
    off for tables and panels, which must wrap to the terminal."""
    return Console(stderr=stderr, highlight=False, soft_wrap=soft_wrap)


def configure_logging(
    level: str = "info", log_format: str | None = None, console: Console | None = None
) -> LogFormat:
    """Log to stderr as ``log_format`` (json or text; None: json unless stderr is a
    terminal): JSON lines for collectors, rich text for people. Returns the format chosen."""
    from rich.logging import RichHandler

    from inferway.observability.redaction import RedactingFilter

    chosen = resolve_log_format(log_format)
    handler: logging.Handler
    if chosen == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    else:
        handler = RichHandler(
            console=console or make_console(stderr=True),
            show_path=False,
            rich_tracebacks=True,
            markup=False,
        )
        handler.setFormatter(TextFieldsFormatter("%(message)s", datefmt="[%X]"))
    handler.addFilter(RedactingFilter())  # credentials never reach the log
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # watchfiles logs every change it sees at INFO; the watchers log what they do with it.
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    return chosen


def issue_text(issue: PolicyIssue) -> Text:
    """``file:line:column: path: message`` with the location dimmed, the field highlighted."""
    where = issue.file
    if issue.line is not None:
        where += f":{issue.line}"
        if issue.column is not None:
            where += f":{issue.column}"
    text = Text(where + ": ", style="bold")
    if issue.path:
        text.append(issue.path, style="cyan")
        text.append(": ")
    text.append(issue.message, style="red")
    return text


def print_issues(console: Console, issues: Iterable[PolicyIssue]) -> None:
    for issue in issues:
        console.print(issue_text(issue), soft_wrap=True)


def format_age(at: float | None, now: float | None = None) -> str:
    """``"12s ago"`` / ``"3m ago"`` / ``"2h ago"`` for a unix time; ``"-"`` when unknown."""
    if at is None:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - at)
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def short_version(version: str | None) -> str:
    return "-" if not version else version[:12]
