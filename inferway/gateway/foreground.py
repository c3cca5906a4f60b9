"""Run one gateway in the foreground until SIGTERM or SIGINT: ``inferway run --no-envoy`` and
the keeper's control-plane process both serve through :func:`serve_gateway`.

The signal handlers go in before anything starts, and start-up races them: a SIGTERM that
arrives while the gateway is still starting (loading the policy, binding ports, waiting for
Envoy) stops it at once instead of being noticed only when start-up is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from inferway.backends.process_tuning import freeze_startup_heap
from inferway.console import make_console, print_issues
from inferway.exit_codes import EXIT_CANNOT_START, EXIT_INVALID
from inferway.gateway.control_plane import PolicyRefusedError
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.gateway.xds_mtls import XdsMtlsError
from inferway.policies import PolicyError

__all__ = [
    "run_event_loop",
    "serve_gateway",
    "unless_stopped",
]

log = logging.getLogger("inferway")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_T = TypeVar("_T")


async def serve_gateway(
    options: GatewayOptions, *, on_ready: Callable[[Gateway], None] | None = None
) -> int:
    """Start the gateway, call ``on_ready``, serve until a stop signal; returns the exit code
    (0 stopped, 1 the policy was refused, 2 the gateway could not start)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            started = await unless_stopped(start_gateway(options), stop)
        except (PolicyError, PolicyRefusedError) as error:
            issues = error.issues if isinstance(error, PolicyError) else error.refusal.issues
            err = make_console(stderr=True)
            err.print("[red]refusing to start: the policy is invalid[/red]")
            print_issues(err, issues)
            return EXIT_INVALID
        except (OSError, XdsMtlsError) as error:
            log.error("cannot start the gateway: %s", error)
            return EXIT_CANNOT_START
        if started is None:
            log.info("stopped during start-up")
            return 0
        gateway = started
        try:
            if gateway.supervisor is not None:
                await unless_stopped(_report_envoy_ready(gateway), stop)
            if not stop.is_set():
                # a full collection walking the start-up heap stalls every request the
                # processors (LLM, features, picker) are answering: 60-odd ms at 100 streams
                freeze_startup_heap()
                if on_ready is not None:
                    on_ready(gateway)
                log.info("running; Ctrl-C to stop")
                await stop.wait()
            log.info("stopping")
        finally:
            await gateway.stop()
    finally:
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)
    return 0


async def unless_stopped(work: Awaitable[_T], stop: asyncio.Event) -> _T | None:
    """``work``'s result, or None (``work`` cancelled) when ``stop`` is set first."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def _report_envoy_ready(gateway: Gateway) -> None:
    supervisor = gateway.supervisor
    assert supervisor is not None
    if await supervisor.wait_ready(30):
        log.info("envoy is ready (admin on port %d)", supervisor.admin_port)
    else:
        log.warning(
            "envoy is not ready after 30s; last output:\n  %s",
            "\n  ".join(supervisor.stderr_tail()[-10:]) or "(none)",
        )


def run_event_loop(coro: Coroutine[Any, Any, _T]) -> _T:
    """uvloop when installed, else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
