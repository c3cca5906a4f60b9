"""``inferway profile``: py-spy on a live backend or gateway, a flame graph SVG and the top
frames (docs/operations.md, "Profiling a live process").

Local by default: the process is found in /proc (profile_targets) or given with ``--pid``.
With ``--admin URL`` the gateway's admin API does it (``POST /profile``, admin token), for an
operator without a shell on the host: the control plane itself, or a replica it runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from inferway.cli.admin_client import AdminClient, AdminError, admin_token
from inferway.cli.output import OutputFormat, OutputOption, write_document
from inferway.console import make_console
from inferway.exit_codes import EXIT_CANNOT_START, EXIT_INVALID
from inferway.gateway.profile_admin import MAX_SECONDS, profile_document
from inferway.gateway.profile_targets import (
    ProfileTarget,
    TargetError,
    find_targets,
    pick_target,
)
from inferway.observability.py_spy import ProfileError, record_profile

__all__ = ["profile", "render_profile"]


def render_profile(document: dict[str, Any], svg: Path | None) -> None:
    console = make_console(soft_wrap=False)
    console.print(
        Text(
            f"{document['target']} pid {document['pid']}: {document['samples']} samples over "
            f"{document['seconds']:g} s at {document['rate']} Hz"
            + (f" -> {svg}" if svg is not None else "")
        )
    )
    table = Table("self %", "total %", "frame", box=None, pad_edge=False)
    for row in document["top"]:
        table.add_row(f"{row['self_percent']:.1f}", f"{row['total_percent']:.1f}", row["frame"])
    console.print(table)


def _fail(message: str, code: int) -> typer.Exit:
    make_console(stderr=True).print(Text(message, style="red"))
    return typer.Exit(code)


def _remote(
    admin: str, token_file: Path | None, body: dict[str, Any], seconds: float
) -> dict[str, Any]:
    try:
        token = admin_token(token_file, needed_for="--admin needs")
        return AdminClient(admin, token=token).profile(body, seconds=seconds)
    except AdminError as error:
        raise _fail(str(error), error.exit_code) from None


def profile(
    target: Annotated[
        ProfileTarget, typer.Option(help="What to profile (found in /proc unless --pid).")
    ] = ProfileTarget.backend,
    pid: Annotated[int | None, typer.Option(help="Profile this process instead.")] = None,
    seconds: Annotated[
        float, typer.Option(min=1, max=MAX_SECONDS, help="How long to sample.")
    ] = 10.0,
    rate: Annotated[int, typer.Option(min=1, max=1000, help="Samples per second.")] = 100,
    out: Annotated[
        Path, typer.Option("--out", help="Where the flame graph SVG is written.", dir_okay=False)
    ] = Path("profile.svg"),
    top: Annotated[int, typer.Option(min=1, max=200, help="Frames in the table.")] = 15,
    idle: Annotated[bool, typer.Option(help="Include idle threads' stacks.")] = False,
    admin: Annotated[
        str | None,
        typer.Option(help="Ask this gateway admin API instead (POST /profile, admin token)."),
    ] = None,
    service: Annotated[
        str | None, typer.Option(help="With --admin --target backend: a service it runs.")
    ] = None,
    replica: Annotated[int, typer.Option(min=0, help="With --service: replica index.")] = 0,
    token_file: Annotated[
        Path | None, typer.Option(help="The admin token (default $INFERWAY_ADMIN_TOKEN).")
    ] = None,
    output: OutputOption = OutputFormat.text,
) -> None:
    """Profile a live backend or gateway with py-spy: flame graph SVG + top frames.

    Exit 1: no or several matching processes, or the admin API refused; 2: py-spy missing, not
    allowed to attach (ptrace) or failed; 3: the admin API is unreachable."""
    if admin is not None:
        body: dict[str, Any] = {"target": target.value, "seconds": seconds, "rate": rate}
        body |= {"top": top, "idle": idle}
        if service is not None:
            body |= {"service": service, "replica": replica}
        document = _remote(admin, token_file, body, seconds)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(document.pop("svg"), encoding="utf-8")
    else:
        label = target.value
        if pid is None:
            try:
                chosen = pick_target(target, find_targets(target))
            except TargetError as error:
                raise _fail(str(error), EXIT_INVALID) from None
            pid = chosen.pid
        try:
            result = asyncio.run(
                record_profile(
                    pid,
                    out,
                    seconds=seconds,
                    rate=rate,
                    idle=idle,
                    subprocesses=target is ProfileTarget.backend,
                )
            )
        except ProfileError as error:
            raise _fail(str(error), EXIT_CANNOT_START) from None
        document = profile_document(result, top=top, target=label)
    document["svg"] = str(out)
    if output is OutputFormat.text:
        render_profile(document, out)
    else:
        write_document(document, output)
