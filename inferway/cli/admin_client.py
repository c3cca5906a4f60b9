"""``inferway status``: ask a running gateway's admin API what is live and print it readably."""

from __future__ import annotations

import time
from typing import Any

import httpx
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from inferway.console import format_age, short_version

__all__ = ["StatusUnavailableError", "fetch_status", "render_status"]


class StatusUnavailableError(Exception):
    """The admin API could not be reached or answered badly."""


def fetch_status(admin_url: str, *, timeout: float = 5.0) -> dict[str, Any]:
    url = admin_url.rstrip("/") + "/status"
    try:
        response = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise StatusUnavailableError(
            f"cannot reach the inferway admin API at {url}: {exc}. Is `inferway run` running, "
            "and is --admin its admin address?"
        ) from None
    if response.status_code != 200:
        raise StatusUnavailableError(f"{url} answered HTTP {response.status_code}")
    try:
        data: dict[str, Any] = response.json()
        return data
    except ValueError:
        raise StatusUnavailableError(f"{url} did not answer JSON") from None


def render_status(status: dict[str, Any], console: Console, *, now: float | None = None) -> None:
    now = time.time() if now is None else now
    console.print(_policy_panel(status, now))
    console.print(_nodes_table(status, now))
    problems = status.get("file_problems") or []
    if problems:
        console.print(_file_problems_panel(problems, now))
    refusal = status.get("last_refused")
    if refusal:
        console.print(_refusal_panel(refusal, now))
    nacks = status.get("nacks") or []
    if nacks:
        console.print(_nacks_table(nacks, now))


def _policy_panel(status: dict[str, Any], now: float) -> Panel:
    policy = status.get("policy")
    lines = Text()
    health = status.get("health") or {}
    if health.get("ok") is False:
        lines.append(f"{health.get('reason') or health.get('status')}\n", style="bold red")
    if policy is None:
        lines.append("no policy applied yet", style="yellow")
    else:
        lines.append("version  ", style="bold")
        lines.append(short_version(policy["version"]), style="green")
        lines.append(f"\nsource   {policy['source']}")
        lines.append(f"\napplied  {format_age(policy['applied_at'], now)}")
    envoy = status.get("envoy")
    if envoy:
        state = "running" if envoy.get("running") else "down"
        lines.append("\nenvoy    ", style="bold")
        lines.append(state, style="green" if state == "running" else "red")
        lines.append(f" (pid {envoy.get('pid') or '-'}, restarts {envoy.get('restarts', 0)}")
        if envoy.get("last_exit_code") is not None:
            lines.append(f", last exit code {envoy['last_exit_code']}")
        lines.append(")")
    lines.append_text(_control_plane_line(status, now))
    return Panel(lines, title="inferway policy", expand=False)


def _control_plane_line(status: dict[str, Any], now: float) -> Text:
    """Under the keeper: the control-plane process, and whether it had to be restarted."""
    record = (status.get("keeper") or {}).get("control_plane")
    line = Text()
    if not record:
        return line
    line.append("\ncontrol  ", style="bold")
    line.append(f"pid {record.get('pid') or '-'}")
    restarts = record.get("restarts", 0)
    if restarts:
        line.append(f", restarted {restarts} time(s)", style="yellow")
        if record.get("last_exit_code") is not None:
            line.append(
                f", last exit code {record['last_exit_code']} "
                f"{format_age(record.get('last_exit_at'), now)}"
            )
    return line


def _nodes_table(status: dict[str, Any], now: float) -> Table:
    table = Table(title="Envoy nodes", title_justify="left")
    for column in ("node", "connected", "in sync", "acked", "last NACK"):
        table.add_column(column)
    nodes = status.get("nodes") or []
    for node in nodes:
        acked = "\n".join(f"{k} {v[:8]}" for k, v in node.get("acked", {}).items())
        nack = node.get("last_nack")
        table.add_row(
            node["node_id"],
            Text("yes", "green")
            if node.get("connected")
            else Text(f"no (last seen {format_age(node.get('last_seen'), now)})", "red"),
            Text("yes", "green") if node.get("in_sync") else Text("no", "yellow"),
            acked or "-",
            "-" if not nack else f"{nack['type']} {format_age(nack['at'], now)}: {nack['message']}",
        )
    if not nodes:
        table.add_row("(none connected yet)", "", "", "", "")
    return table


def _file_problems_panel(problems: list[dict[str, Any]], now: float) -> Panel:
    body = [
        Text(f"{p['kind']} file {p['file']} — since {format_age(p['since'], now)}: {p['message']}")
        for p in problems
    ]
    return Panel(Group(*body), title="watched file unreadable", border_style="red", expand=False)


def _refusal_panel(refusal: dict[str, Any], now: float) -> Panel:
    pending = refusal.get("pending")
    head = Text(
        f"{refusal['file']} — {format_age(refusal['at'], now)}",
        style="bold",
    )
    body = [head]
    for issue in refusal.get("issues", []):
        body.append(Text(issue["text"], style="red"))
    title = "last edit REFUSED (live policy unchanged)" if pending else "last refused edit"
    return Panel(Group(*body), title=title, border_style="red" if pending else "dim", expand=False)


def _nacks_table(nacks: list[dict[str, Any]], now: float) -> Table:
    table = Table(title="Recent NACKs", title_justify="left")
    for column in ("node", "type", "version", "when", "message"):
        table.add_column(column)
    for nack in nacks[-10:]:
        table.add_row(
            nack["node_id"],
            nack["type"],
            short_version(nack["version"]),
            format_age(nack["at"], now),
            nack["message"],
        )
    return table
