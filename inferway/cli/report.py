"""``inferway report cost``: what each service cost over a window, per hour, per 1,000
requests, per row and per 1,000 tokens, its replicas' utilization, and the forecast of the
next days' spend, from Prometheus' history of the gateway's and the backends' series."""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from inferway.cli.output import OutputFormat, OutputOption, write_document
from inferway.exit_codes import EXIT_UNREACHABLE
from inferway.tools.cost.prometheus_history import HistoryError, load_history
from inferway.tools.cost.report import CostReport, build_report
from inferway.tools.cost.spend_forecast import WARN_DAYS_AHEAD

__all__ = ["app", "parse_end", "parse_window_hours", "render_cost"]

app = typer.Typer(help="Reports over the gateway's metrics history.", no_args_is_help=True)

_WINDOW = re.compile(r"^(\d+)([hdw])$")
_HOURS = {"h": 1, "d": 24, "w": 168}


def parse_window_hours(text: str) -> int:
    """``24h``, ``7d``, ``2w`` -> whole hours (the report's step is one hour)."""
    match = _WINDOW.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise typer.BadParameter(f"expected a window such as 24h, 7d or 2w, got {text!r}")
    return int(match.group(1)) * _HOURS[match.group(2)]


def parse_end(text: str | None) -> float:
    """Now, unix seconds, or an RFC 3339 time (``2026-12-01T00:00:00Z``)."""
    if text is None:
        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(
            f"expected unix seconds or an RFC 3339 time, got {text!r}"
        ) from None
    if parsed.tzinfo is None:
        raise typer.BadParameter(f"{text!r} has no time zone; add Z or +00:00")
    return parsed.timestamp()


def _money(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def render_cost(report: CostReport, console: Console) -> None:
    start = dt.datetime.fromtimestamp(report.start, dt.UTC).strftime("%Y-%m-%d %H:%M")
    end = dt.datetime.fromtimestamp(report.end, dt.UTC).strftime("%Y-%m-%d %H:%M")
    if not report.services:
        console.print(f"no service has a cost: section with history in {start}..{end} UTC")
        return
    table = Table(title=f"cost {start} .. {end} UTC", title_justify="left")
    columns = ["service", "currency", "replica-h", "spend", "per hour", "requests", "per 1k req"]
    columns += ["budget/1k", "rows", "per row", "tokens", "per 1k tok", "util", "next days"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("service", "currency") else "right")
    for s in report.services:
        c = s.cost
        util = "-" if c.utilization is None else f"{c.utilization:.0%}"
        table.add_row(
            c.service,
            c.currency,
            f"{c.replica_hours:,.1f}",
            _money(c.spend),
            _money(c.cost_per_hour),
            _count(c.requests),
            _money(c.cost_per_1k_requests, 4),
            _money(c.budget_per_1k_requests, 4),
            _count(c.rows),
            "-" if c.cost_per_row is None else f"{c.cost_per_row:.3g}",
            _count(c.tokens),
            _money(c.cost_per_1k_tokens, 6),
            util,
            " ".join(_money(d) for d in s.forecast.daily[:WARN_DAYS_AHEAD]),
        )
    console.print(table)
    totals = ", ".join(f"{amount:,.2f} {code}" for code, amount in report.totals().items())
    methods = "; ".join(sorted({s.forecast.method for s in report.services}))
    console.print(f"total {totals}; forecast: {methods}")
    for warning in report.warnings:
        console.print(Text(f"warning: {warning}", style="yellow"))


@app.command()
def cost(
    prometheus: Annotated[
        str,
        typer.Option(help="Prometheus' URL (the one scraping the gateway and the backends)."),
    ],
    window: Annotated[str, typer.Option(help="How far back: 24h, 7d, 2w.")] = "24h",
    end: Annotated[
        str | None, typer.Option(help="The window's end: unix seconds or RFC 3339; now if unset.")
    ] = None,
    days: Annotated[int, typer.Option(min=1, max=30, help="Days of spend to forecast.")] = 3,
    output: OutputOption = OutputFormat.text,
) -> None:
    """Per service: replica-hours, spend, cost per hour, per 1,000 requests, per row and per
    1,000 tokens, utilization, and the next days' forecast spend, warning when the forecast
    exceeds cost.budget_per_day within 3 days or the window's cost per 1,000 requests or
    tokens exceeds its budget. Exit 3 when Prometheus cannot be reached or refuses."""
    hours = parse_window_hours(window)
    until = parse_end(end)
    try:
        series = load_history(prometheus, end=until, hours=hours)
    except HistoryError as error:
        Console(stderr=True).print(Text(str(error), style="red"))
        raise typer.Exit(EXIT_UNREACHABLE) from None
    report = build_report(series, start=until - hours * 3600, end=until, days=days)
    if output is OutputFormat.text:
        render_cost(report, Console(soft_wrap=False, width=190))
    else:
        write_document(report.to_dict(), output)
