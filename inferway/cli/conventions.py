"""The pieces of the ``inferway`` command that every operator tool has (docs/cli.md): the
version flag, the ``--log-format`` option, and help that survives a pipe. Kept apart from
the commands so each command module only declares what it does."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from inferway.observability.log_format import LogFormatChoice

__all__ = [
    "DISTRIBUTION",
    "PIPED_HELP_WIDTH",
    "LogFormatOption",
    "PolicyFile",
    "VersionOption",
    "installed_version",
    "run_app",
]

DISTRIBUTION = "inferway-core"
"""The distribution that holds the code, whichever meta-distribution (``inferway``,
``inferway-gateway``, ...) pulled it in: all of them pin the same release (docs/install.md)."""

PIPED_HELP_WIDTH = 1000
"""Help's line width when stdout is not a terminal: wide enough that nothing wraps or is cut."""


def installed_version() -> str:
    """The installed code distribution's version, from its metadata (what pip and bug reports
    name); a source tree that was never installed says so."""
    import importlib.metadata  # only --version reads it: every other command starts without

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"inferway {installed_version()}\n")
        raise typer.Exit()


VersionOption = Annotated[
    bool,
    typer.Option(
        "--version",
        help="Print inferway's version and exit.",
        callback=_print_version,
        is_eager=True,
    ),
]

PolicyFile = Annotated[
    Path,
    typer.Option("--file", "-f", help="The policy YAML.", dir_okay=False, show_default=False),
]

LogFormatOption = Annotated[
    LogFormatChoice | None,
    typer.Option(
        case_sensitive=False,
        help="json (one object per line: time, level, logger, message, fields) or text; "
        "default: json unless stderr is a terminal.",
        envvar="INFERWAY_LOG_FORMAT",
        show_default=False,
    ),
]


def run_app(app: typer.Typer) -> None:
    """Run ``app`` as the ``inferway`` program. Piped or captured help (``--help | grep``, a
    CI log) is plain text, one line per option and command, never cut to the 80 columns
    rich assumes without a terminal; on a terminal it is rich's layout."""
    if sys.stdout.isatty():
        app(prog_name="inferway")
        return
    app.rich_markup_mode = None
    app(prog_name="inferway", terminal_width=PIPED_HELP_WIDTH, max_content_width=PIPED_HELP_WIDTH)
