"""``inferway rollout status|promote|abort|pause|resume|restart``: the rollouts of a running
gateway, through its admin API. Commands need the admin token (``--token-file`` or
``$INFERWAY_ADMIN_TOKEN``), as ``POST /reload`` does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from inferway.cli.admin_client import DEFAULT_ADMIN_URL, AdminClient, AdminError, admin_token
from inferway.cli.output import OutputFormat, OutputOption, write_document
from inferway.gateway.admin_documents import RolloutStatus

__all__ = ["app", "render_rollout"]

app = typer.Typer(help="Show and command canary rollouts.", no_args_is_help=True)

Admin = Annotated[str, typer.Option(help="The gateway's admin API URL.")]


def _fail(error: AdminError) -> typer.Exit:
    """Exit codes as every client command (docs/cli.md): 1 refused (unknown rollout, a command
    its phase refuses, no token), 2 usage, 3 the admin API unreachable or not answering."""
    Console(stderr=True).print(Text(str(error), style="red"))
    return typer.Exit(error.exit_code)


def render_rollout(status: RolloutStatus, console: Console) -> None:
    """One rollout: where it is, the evidence, and the verdicts of its last analysis."""
    steps = " ".join(
        f"[{p:g}]" if i == status["step"] else f"{p:g}" for i, p in enumerate(status["steps"])
    )
    console.print(
        Text.assemble(
            (f"{status['name']}", "bold"),
            f"  route {status['route']}: {status['stable']} -> {status['canary']}  ",
            (status["phase"], "green" if status["phase"] in ("progressing", "promoted") else "red"),
            f"  canary {status['weight_percent']:g}%  steps {steps}",
        )
    )
    console.print(f"  {status['reason']}")
    ev = status["evidence"]
    console.print(
        f"  canary {ev['canary']['errors']}/{ev['canary']['requests']} errors, "
        f"stable {ev['stable']['errors']}/{ev['stable']['requests']}"
    )
    last = status.get("last_analysis")
    if last:
        table = Table(title=f"last analysis: {last['result']}", title_justify="left")
        for column in ("check", "result", "reason"):
            table.add_column(column)
        for verdict in last["verdicts"]:
            style = {"pass": "green", "fail": "red"}.get(verdict["result"], "yellow")
            table.add_row(verdict["check"], Text(verdict["result"], style), verdict["reason"])
        console.print(table)


@app.command()
def status(
    name: Annotated[str | None, typer.Argument(help="One rollout (default: all).")] = None,
    admin: Admin = DEFAULT_ADMIN_URL,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh every second.")] = False,
    output: OutputOption = OutputFormat.text,
) -> None:
    """Step, weight, per-version counts and the verdicts behind the last decision."""
    console = Console(soft_wrap=False)
    client = AdminClient(admin)
    while True:
        try:
            documents = client.rollouts() if name is None else [client.rollout(name)]
        except AdminError as error:
            raise _fail(error) from None
        if output is not OutputFormat.text:
            body = documents[0] if name is not None else {"rollouts": documents}
            write_document(body, output)
        else:
            if watch:
                console.clear()
            for document in documents:
                render_rollout(document, console)
            if not documents:
                console.print("no rollouts in the live policy")
        if not watch:
            return
        time.sleep(1.0)


def _command(command: str, name: str, admin: str, token_file: Path | None) -> None:
    try:
        token = admin_token(token_file, needed_for="commands need")
        answer = AdminClient(admin, token=token).rollout_command(name, command)
    except AdminError as error:
        raise _fail(error) from None
    decision = answer["decision"]
    Console().print(f"{name}: {decision['action']}: {decision['reason']}")


TokenFile = Annotated[
    Path | None, typer.Option(help="File holding the admin token.", dir_okay=False)
]


def _make(command: str, doc: str) -> None:
    def run(
        name: Annotated[str, typer.Argument(help="The rollout.")],
        admin: Admin = DEFAULT_ADMIN_URL,
        token_file: TokenFile = None,
    ) -> None:
        _command(command, name, admin, token_file)

    run.__doc__ = doc
    app.command(command)(run)


_make("promote", "Skip the remaining steps: canary to 100%.")
_make("abort", "Stop the rollout: stable to 100%.")
_make("pause", "Hold the current step (a failing check still rolls back).")
_make("resume", "Continue a paused rollout.")
_make("restart", "Start over from the first step with fresh evidence.")
