"""``inferway scale status``: the autoscaler of a running gateway, through its admin API's
``GET /autoscale``: each service's last decision and replicas, then the recent decisions."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from inferway.cli.output import OutputFormat, OutputOption, write_document
from inferway.exit_codes import EXIT_UNREACHABLE
from inferway.gateway.admin import DEFAULT_ADMIN_PORT

__all__ = ["app", "render_autoscale"]

app = typer.Typer(help="Show the autoscaler and the replicas it sizes.", no_args_is_help=True)


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True).print(Text(message, style="red"))
    return typer.Exit(code)


def _fetch(admin: str) -> dict[str, Any] | None:
    """GET /autoscale's document; None when the gateway has no autoscaler."""
    url = admin.rstrip("/") + "/autoscale"
    try:
        response = httpx.get(url, timeout=5.0)
    except httpx.HTTPError as exc:
        message = f"cannot reach the inferway admin API at {url}: {exc}"
        raise _fail(message, EXIT_UNREACHABLE) from None
    if response.status_code == 404:  # a gateway without replicas has no autoscaler
        return None
    if response.status_code != 200:
        raise _fail(
            f"{url}: HTTP {response.status_code}: {response.text.strip()}", EXIT_UNREACHABLE
        )
    try:
        document: dict[str, Any] = response.json()
    except ValueError:
        raise _fail(f"{url} did not answer JSON: is it the admin API?", EXIT_UNREACHABLE) from None
    return document


def render_autoscale(document: dict[str, Any], console: Console, *, decisions: int = 10) -> None:
    """Per service its rule and last decision, then the last ``decisions`` decisions."""
    replicas = {s["service"]: s for s in document.get("replicas", {}).get("services", [])}
    if not document.get("services"):
        console.print("no service has autoscale:")
    for service in document.get("services", []):
        name = service["service"]
        line = Text.assemble((name, "bold"), f"  {service['algorithm']} on {service['metric']}")
        r = replicas.get(name)
        if r is not None:
            ready = r.get("ready", 0)
            line.append(
                f"  {ready} ready of {r['desired']} desired (min {r['min']}, max {r['max']})"
            )
        target = service.get("scale_target") or {}
        if target.get("kind") == "metric":
            line.append("  -> published metric (KEDA/HPA act)")
        elif target.get("kind") == "kubernetes":
            line.append(f"  -> deployment {target['namespace']}/{target['deployment']}")
        console.print(line)
        last = service.get("last_decision")
        console.print(f"  {last['reason'] if last else 'no decision yet'}")
        if service.get("error"):
            console.print(Text(f"  error: {service['error']}", style="red"))
    recent = document.get("decisions", [])[-decisions:]
    if recent:
        table = Table(title="recent decisions", title_justify="left")
        for column in ("service", "current", "ready", "desired", "direction", "inputs"):
            table.add_column(column)
        for d in recent:
            inputs = ", ".join(
                f"{k} {v:g}" for k, v in sorted(d["inputs"].items()) if isinstance(v, int | float)
            )
            table.add_row(
                d["service"],
                str(d["current"]),
                str(d["ready"]),
                str(d["desired"]),
                d["direction"],
                inputs,
            )
        console.print(table)


@app.command()
def status(
    admin: Annotated[
        str, typer.Option(help="The gateway's admin API URL.")
    ] = f"http://127.0.0.1:{DEFAULT_ADMIN_PORT}",
    output: OutputOption = OutputFormat.text,
) -> None:
    """Each autoscaled service's last decision and replicas, then the recent decisions
    (-o json|yaml: the admin API's GET /autoscale document). Exit 3 when it cannot be
    reached; 0 with "no autoscaler" when no service of the gateway has replicas: or
    autoscale: (as ``rollout status`` with no rollouts)."""
    document = _fetch(admin)
    if document is None:
        Console(stderr=True).print(
            "no autoscaler: no service of the gateway has replicas: or autoscale:"
        )
        document = {"services": [], "decisions": []}
        if output is OutputFormat.text:
            return
    if output is OutputFormat.text:
        render_autoscale(document, Console(soft_wrap=False))
    else:
        write_document(document, output)
