"""The fleet verdict as a person reads it: each checked Envoy's own tables (report.py), then
one row per Envoy (where it was reached, whether it ACKed what its group is served, its bars)
and the verdict sentence that names the Envoys that failed."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from inferway.tools.verify.report import render_run

__all__ = ["render_fleet"]


def _bar(run: dict[str, Any] | None, prefix: str) -> str:
    for bar in (run or {}).get("bars", []):
        if bar["name"].startswith(prefix):
            return str(bar["measured"])
    return "-"


def _result(row: dict[str, Any]) -> Text:
    if not row["reachable"]:
        return Text("NOT CHECKED", style="bold red")
    return Text("pass", style="green") if row["ok"] else Text("FAIL", style="bold red")


def render_fleet(document: dict[str, Any], console: Console, *, per_envoy: bool = True) -> None:
    """Each Envoy's run (``per_envoy``), the per-Envoy table and the verdict."""
    if per_envoy:
        for row in document["envoys"]:
            if row["run"] is not None:
                console.rule(f"Envoy {row['node']}")
                render_run(row["run"], console)
    table = Table(title=f"inferway verify {document['policy']}: the fleet of {document['admin']}")
    for column in ("envoy", "zone", "listener", "in sync", "routed correctly", "activation",
                   "result", "problems"):  # fmt: skip
        table.add_column(column)
    for row in document["envoys"]:
        table.add_row(
            row["node"],
            row["zone"] or "-",
            row["gateway"] or f"{row['address'] or '?'} ({row['address_source'] or 'unknown'})",
            Text("yes", "green") if row["in_sync"] else Text("no", "yellow"),
            _bar(row["run"], "routed correctly"),
            _bar(row["run"], "activation frequency (all pools)"),
            _result(row),
            "\n".join(row["problems"]) or "-",
        )
    for skipped in document["skipped"]:
        table.add_row(
            skipped["node"], "", "", "", "", "", Text("skipped", "dim"), skipped["reason"]
        )
    console.print(table)
    style = "green" if document["ok"] else "bold red"
    console.print(Text(document["verdict"], style=style))
