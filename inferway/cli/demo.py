"""``inferway demo``: the canary demo (two backends, Envoy, a live edit), and optionally the
rollout scene. It runs the backend too, so it says which install lacks what before importing
the demo runner (``devtools``, which nothing else in the product imports)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from inferway.console import configure_logging
from inferway.exit_codes import EXIT_CANNOT_START
from inferway.gateway.foreground import run_event_loop

__all__ = ["demo"]


def demo(
    once: Annotated[
        bool, typer.Option("--once", help="Run the scenario once and exit (for CI).")
    ] = False,
    requests: Annotated[
        int, typer.Option("--requests", "-n", min=20, help="Requests per traffic sample.")
    ] = 400,
    trace: Annotated[
        bool, typer.Option("--trace/--no-trace", help="Trace requests; print one trace tree.")
    ] = True,
    mtls: Annotated[
        bool, typer.Option("--mtls", help="Mutual TLS on the listener (development CA).")
    ] = False,
    rollout: Annotated[
        bool,
        typer.Option(
            "--rollout",
            help="Then a rollout scene: v2 promoted step by step, a bad v3 rolled back.",
        ),
    ] = False,
    llm: Annotated[
        bool,
        typer.Option(
            "--llm",
            help="Instead: one streamed request through Envoy to a real LLM engine, with its "
            "TTFT, tokens and cost (says how to install the engine when it is not).",
        ),
    ] = False,
) -> None:
    """Canary demo: two backends, Envoy at 10% canary, then a live edit to 50%."""
    from inferway.backends.install_check import missing_backend_message, missing_backend_modules
    from inferway.xds.envoy_binary import find_envoy

    if llm:
        _llm_scene(find_envoy)
    missing = missing_backend_modules()
    if missing:  # a gateway-only or core-only install (docs/install.md)
        typer.echo(missing_backend_message("demo", missing), err=True)
        raise typer.Exit(EXIT_CANNOT_START)
    try:
        find_envoy()
    except FileNotFoundError as exc:  # a backend-only or core-only install
        typer.echo(f"inferway demo: {exc}", err=True)
        raise typer.Exit(EXIT_CANNOT_START) from None
    from inferway.devtools.demo import run_demo  # imports the backend: after the checks

    configure_logging("warning")
    raise typer.Exit(
        run_event_loop(
            run_demo(once=once, requests=requests, trace=trace, mtls=mtls, rollout=rollout)
        )
    )


def _llm_scene(find_envoy: Callable[[], object]) -> None:
    """``--llm``: the LLM scene alone (devtools.demo_llm); needs Envoy, not the ONNX backend."""
    try:
        find_envoy()
    except FileNotFoundError as exc:
        typer.echo(f"inferway demo --llm: {exc}", err=True)
        raise typer.Exit(EXIT_CANNOT_START) from None
    from inferway.console import make_console
    from inferway.devtools.demo_llm import run_llm_scene

    configure_logging("warning")
    raise typer.Exit(run_event_loop(run_llm_scene(make_console(soft_wrap=False))))
