"""``inferway scale status``: the autoscaler of a running gateway, through its admin API's
``GET /autoscale``: each service's last decision and replicas, then the recent decisions."""

from __future__ import annotations

from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from inferway.cli.admin_client import DEFAULT_ADMIN_URL, AdminClient, AdminError
from inferway.cli.output import OutputFormat, OutputOption, write_document
from inferway.gateway.admin_documents import AutoscaleDocument

__all__ = ["app", "render_autoscale"]

app = typer.Typer(help="Show the autoscaler and the replicas it sizes.", no_args_is_help=True)


def render_autoscale(document: AutoscaleDocument, console: Console, *, decisions: int = 10) -> None:
    """Per service its rule and last decision, then the last ``decisions`` decisions."""
    replicas = {s["service"]: s for s in document.get("replicas", {}).get("services", [])}
    autoscaled = {s["service"] for s in document.get("services", [])}
    if not autoscaled:
        console.print("no service has autoscale:")
    for service in document.get("services", []):
        name = service["service"]
        line = Text.assemble((name, "bold"), f"  {service['algorithm']} on {service['metric']}")
        r = replicas.get(name)
        if r is not None:
            line.append(_counts(r))
        tokens = service.get("tokens_per_s")
        if tokens:
            per_replica = service.get("tokens_per_s_per_replica")
            line.append(f"  {tokens:,.0f} tokens/s")
            if per_replica is not None:
                line.append(f" ({per_replica:,.0f} per replica)")
        target = service.get("scale_target") or {}
        if target.get("kind") == "metric":
            line.append("  -> published metric (KEDA/HPA act)")
        elif target.get("kind") == "kubernetes":
            line.append(f"  -> deployment {target['namespace']}/{target['deployment']}")
        console.print(line)
        _print_not_ready(r, console)
        last = service.get("last_decision")
        console.print(f"  {last['reason'] if last else 'no decision yet'}")
        if service.get("error"):
            console.print(Text(f"  error: {service['error']}", style="red"))
    for name, r in replicas.items():
        if name not in autoscaled:  # replicas: without autoscale: a fixed count
            console.print(Text.assemble((name, "bold"), "  replicas", _counts(r)))
            _print_not_ready(r, console)
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


def _counts(r: dict[str, Any]) -> str:
    return f"  {r.get('ready', 0)} ready of {r['desired']} desired (min {r['min']}, max {r['max']})"


def _print_not_ready(r: dict[str, Any] | None, console: Console) -> None:
    """Why replicas are not ready (the replica manager's reasons), under the counts."""
    for reason in (r or {}).get("not_ready", []):
        console.print(Text(f"  not ready: {reason}", style="yellow"), soft_wrap=True)


@app.command()
def status(
    admin: Annotated[str, typer.Option(help="The gateway's admin API URL.")] = DEFAULT_ADMIN_URL,
    output: OutputOption = OutputFormat.text,
) -> None:
    """Each autoscaled service's last decision and replicas, then the recent decisions
    (-o json|yaml: the admin API's GET /autoscale document). Exit 3 when it cannot be
    reached; 0 with "no autoscaler" when no service of the gateway has replicas: or
    autoscale: (as ``rollout status`` with no rollouts)."""
    try:
        found = AdminClient(admin).autoscale(missing_ok=True)
    except AdminError as error:
        Console(stderr=True).print(Text(str(error), style="red"))
        raise typer.Exit(error.exit_code) from None
    if found is None:
        Console(stderr=True).print(
            "no autoscaler: no service of the gateway has replicas: or autoscale:"
        )
        if output is OutputFormat.text:
            return
    empty = cast(AutoscaleDocument, {"services": [], "decisions": []})
    document = found if found is not None else empty
    if output is OutputFormat.text:
        render_autoscale(document, Console(soft_wrap=False))
    else:
        write_document(document, output)
