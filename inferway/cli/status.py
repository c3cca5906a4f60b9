"""``inferway status``: ask a running gateway's admin API what is live and print it readably
(-o json|yaml: the ``GET /status`` document as it came)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from inferway.cli.admin_client import DEFAULT_ADMIN_URL, AdminClient, AdminError
from inferway.cli.output import OutputFormat, OutputOption, write_document
from inferway.console import format_age, make_console, short_version
from inferway.gateway.admin_documents import (
    FileProblemRecord,
    NackRecord,
    PickerStatusRecord,
    RefusalRecord,
    StatusDocument,
)

__all__ = ["render_status", "status"]


def status(
    admin: Annotated[str, typer.Option(help="The gateway's admin API URL.")] = DEFAULT_ADMIN_URL,
    output: OutputOption = OutputFormat.text,
) -> None:
    """Show what a running gateway has live: policy version, refused edits, Envoy ACKs/NACKs
    (-o json|yaml: the admin API's GET /status document). Exit 3 when it cannot be reached."""
    try:
        document = AdminClient(admin).status()
    except AdminError as error:
        make_console(stderr=True).print(Text(str(error), style="red"))
        raise typer.Exit(error.exit_code) from None
    if output is OutputFormat.text:
        render_status(document, make_console(soft_wrap=False))
    else:
        write_document(document, output)


def render_status(status: StatusDocument, console: Console, *, now: float | None = None) -> None:
    """The policy panel, the Envoy nodes, then what needs attention: unreadable files, the
    last refused edit, recent NACKs, warnings (a per-Envoy rate limit several Envoys serve)."""
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
    warnings = status.get("warnings") or []
    if warnings:
        console.print(
            Panel(Text("\n".join(warnings), style="yellow"), title="warnings", expand=False)
        )
    for service, picked in sorted((status.get("pickers") or {}).items()):
        in_envoy = picked.get("in_envoy")
        if in_envoy is not None and in_envoy.get("pick") == "score":
            weights = ", ".join(
                f"{name} {weight:g}" for name, weight in (in_envoy.get("scorers") or {}).items()
            )
            console.print(
                f"endpoint picker: {service}: scored in Envoy's Lua filter, per worker "
                f"({weights}); each pick's winner and reason in the access log and trace "
                "(inferway.picker)"
            )
            if picked.get("endpoints"):
                console.print(_in_envoy_table(service, picked, now, scored=True))
            continue
        if in_envoy is not None:
            console.print(
                f"endpoint picker: {service}: in Envoy, the prompt's first "
                f"{in_envoy.get('prefix_bytes', 0):g} bytes hashed, Maglev with load bound "
                f"{in_envoy.get('load_bound', 0):g}x (no per-pick scores: Envoy's access log "
                "and trace name each request's upstream)"
            )
            if picked.get("endpoints"):
                console.print(_in_envoy_table(service, picked, now))
            continue
        console.print(_picker_table(service, picked))


def _in_envoy_table(
    service: str, picked: PickerStatusRecord, now: float, *, scored: bool = False
) -> Table:
    """A ``process: envoy`` service's replicas as last scraped, and which Envoy leaves out
    (``scored``: as pushed to Envoy's Lua picker, which leaves saturated ones out itself)."""
    if scored:
        table = Table(
            title=f"endpoint picker: {service} (replicas' own metrics, as Envoy's picker has them)",
            title_justify="left",
        )
        for column in ("endpoint", "queue", "KV cache", "prefix hits", "Envoy"):
            table.add_column(column, justify="left" if column in ("endpoint", "Envoy") else "right")
        for endpoint, stats in sorted(picked.get("endpoints", {}).items()):
            depth, used = stats.get("depth"), stats.get("kv_cache")
            table.add_row(
                endpoint,
                "-" if depth is None else f"{depth:g}",
                "-" if used is None else f"{100 * float(used):.0f}%",
                _percent(stats.get("prefix_hit_rate")),
                "[yellow]saturated: skipped[/yellow]" if stats.get("saturated") else "scored",
            )
        return table
    changes = picked.get("changes") or []
    caption = "no replica left out yet"
    if changes:
        last = changes[-1]
        did = "left out" if last.get("left_out") else "taken back"
        caption = (
            f"last change: {last.get('endpoint')} {did} {format_age(last.get('at'), now)}: "
            f"{last.get('reason')}"
        )
    kept = picked.get("kept_in_saturated") or 0
    if kept:
        why = picked.get("no_room") or "at most half the pool is left out"
        caption += f"; {kept} saturated kept in ({why})"
    table = Table(
        title=f"endpoint picker: {service} (replicas' own metrics; saturated ones left out)",
        title_justify="left",
        caption=caption,
    )
    for column in ("endpoint", "queue", "KV cache", "prefix hits", "Envoy"):
        table.add_column(column, justify="left" if column in ("endpoint", "Envoy") else "right")
    for endpoint, stats in sorted(picked.get("endpoints", {}).items()):
        depth, used = stats.get("depth"), stats.get("kv_cache")
        if stats.get("left_out"):
            state = "[yellow]left out (saturated)[/yellow]"
        elif stats.get("saturated"):
            state = "[yellow]in (saturated, cap)[/yellow]"
        else:
            state = "in"
        table.add_row(
            endpoint,
            "-" if depth is None else f"{depth:g}",
            "-" if used is None else f"{100 * float(used):.0f}%",
            _percent(stats.get("prefix_hit_rate")),
            state,
        )
    return table


def _percent(value: object) -> str:
    """A 0..1 share as a percentage; "-" when not known."""
    return "-" if not isinstance(value, int | float) else f"{100 * float(value):.0f}%"


def _picker_table(service: str, picked: PickerStatusRecord) -> Table:
    """One picked service: each endpoint's queue, KV-cache use and prefix-hit rate."""
    last = picked.get("last_pick")
    caption = f"last pick: {last.get('picker.reason', '')}" if last else "no pick yet"
    asked = picked.get("asked")
    how = f" (asked over {asked['transport']} at {asked['address']})" if asked else ""
    table = Table(title=f"endpoint picker: {service}{how}", title_justify="left", caption=caption)
    for column in ("endpoint", "queue", "in flight", "KV cache", "picks", "prefix hits"):
        table.add_column(column, justify="left" if column == "endpoint" else "right")

    def share(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.0f}%"

    for endpoint, stats in sorted(picked.get("endpoints", {}).items()):
        table.add_row(
            endpoint,
            f"{stats.get('depth') or 0:g}",
            f"{stats.get('in_flight') or 0:g}",
            share(stats.get("kv_cache")),
            f"{stats.get('picks') or 0:g}",
            share(stats.get("prefix_hit_rate")),
        )
    return table


def _policy_panel(status: StatusDocument, now: float) -> Panel:
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


def _control_plane_line(status: StatusDocument, now: float) -> Text:
    """Under the keeper: the control-plane process, and whether it had to be restarted."""
    keeper = status.get("keeper")
    record = keeper.get("control_plane") if keeper else None
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


def _nodes_table(status: StatusDocument, now: float) -> Table:
    table = Table(title="Envoy nodes", title_justify="left")
    for column in ("node", "address", "connected", "in sync", "acked", "last NACK"):
        table.add_column(column)
    nodes = status.get("nodes") or []
    for node in nodes:
        acked = "\n".join(f"{k} {v[:8]}" for k, v in node.get("acked", {}).items())
        nack = node.get("last_nack")
        address = node.get("address") or ""
        table.add_row(
            node["node_id"],
            f"{address} ({node.get('address_source')})" if address else "-",
            Text("yes", "green")
            if node.get("connected")
            else Text(f"no (last seen {format_age(node.get('last_seen'), now)})", "red"),
            Text("yes", "green") if node.get("in_sync") else Text("no", "yellow"),
            acked or "-",
            "-" if not nack else f"{nack['type']} {format_age(nack['at'], now)}: {nack['message']}",
        )
    if not nodes:
        table.add_row("(none connected yet)", "", "", "", "", "")
    return table


def _file_problems_panel(problems: list[FileProblemRecord], now: float) -> Panel:
    body = [
        Text(f"{p['kind']} file {p['file']} — since {format_age(p['since'], now)}: {p['message']}")
        for p in problems
    ]
    return Panel(Group(*body), title="watched file unreadable", border_style="red", expand=False)


def _refusal_panel(refusal: RefusalRecord, now: float) -> Panel:
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


def _nacks_table(nacks: list[NackRecord], now: float) -> Table:
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
