"""``inferway rollout status|promote|abort|pause|resume|restart``: the rollouts of a running
gateway, through its admin API. Commands need the admin token (``--token-file`` or
``$INFERWAY_ADMIN_TOKEN``), as ``POST /reload`` does."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from inferway.cli.output import OutputFormat, OutputOption, write_document
from inferway.exit_codes import EXIT_INVALID, EXIT_UNREACHABLE
from inferway.gateway.admin import DEFAULT_ADMIN_PORT
from inferway.gateway.admin_security import ADMIN_TOKEN_ENV

__all__ = ["app", "render_rollout"]

app = typer.Typer(help="Show and command canary rollouts.", no_args_is_help=True)

Admin = Annotated[str, typer.Option(help="The gateway's admin API URL.")]
_ADMIN = f"http://127.0.0.1:{DEFAULT_ADMIN_PORT}"


def _fail(message: str, code: int = EXIT_INVALID) -> typer.Exit:
    """Exit codes as every client command (docs/cli.md): 1 refused (unknown rollout, a command
    its phase refuses, no token), 2 usage, 3 the admin API unreachable or not answering."""
    Console(stderr=True).print(Text(message, style="red"))
    return typer.Exit(code)


def _get(admin: str, path: str) -> dict[str, Any]:
    url = admin.rstrip("/") + path
    try:
        response = httpx.get(url, timeout=5.0)
    except httpx.HTTPError as exc:
        raise _fail(
            f"cannot reach the inferway admin API at {url}: {exc}", EXIT_UNREACHABLE
        ) from None
    if response.status_code == 404 and path.startswith("/rollouts/"):
        raise _fail(f"{url}: HTTP 404: {response.text.strip()}")
    if response.status_code != 200:
        raise _fail(
            f"{url}: HTTP {response.status_code}: {response.text.strip()}", EXIT_UNREACHABLE
        )
    try:
        document: dict[str, Any] = response.json()
    except ValueError:
        raise _fail(f"{url} did not answer JSON: is it the admin API?", EXIT_UNREACHABLE) from None
    return document


def render_rollout(status: dict[str, Any], console: Console) -> None:
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
    admin: Admin = _ADMIN,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh every second.")] = False,
    output: OutputOption = OutputFormat.text,
) -> None:
    """Step, weight, per-version counts and the verdicts behind the last decision."""
    console = Console(soft_wrap=False)
    while True:
        if name is None:
            documents = _get(admin, "/rollouts")["rollouts"]
        else:
            documents = [_get(admin, f"/rollouts/{name}")]
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


def _token(token_file: Path | None) -> str:
    if token_file is not None:
        return token_file.read_text(encoding="utf-8").strip()
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if not token:
        raise _fail(f"commands need the admin token: --token-file or ${ADMIN_TOKEN_ENV}")
    return token


def _command(command: str, name: str, admin: str, token_file: Path | None) -> None:
    url = f"{admin.rstrip('/')}/rollouts/{name}/{command}"
    headers = {"Authorization": f"Bearer {_token(token_file)}"}
    try:
        response = httpx.post(url, headers=headers, timeout=5.0)
    except httpx.HTTPError as exc:
        raise _fail(
            f"cannot reach the inferway admin API at {url}: {exc}", EXIT_UNREACHABLE
        ) from None
    if response.status_code != 200:
        try:
            message = response.json().get("error", response.text)
        except ValueError:
            message = response.text
        raise _fail(f"{command} {name}: HTTP {response.status_code}: {message}")
    decision = response.json()["decision"]
    Console().print(f"{name}: {decision['action']}: {decision['reason']}")


TokenFile = Annotated[
    Path | None, typer.Option(help="File holding the admin token.", dir_okay=False)
]


def _make(command: str, doc: str) -> None:
    def run(
        name: Annotated[str, typer.Argument(help="The rollout.")],
        admin: Admin = _ADMIN,
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
