"""The keeper's side of the control-plane process: start it, know when it is ready, restart it
when it dies, stop it on request.

The control plane (policy watcher, xDS server, admin API) runs in a child process so that a
crash of it, even SIGKILL, leaves the keeper and its Envoy running: Envoy keeps serving its
last config and resyncs when the restarted control plane listens on the same xDS port again
(versions derive from content, so nothing Envoy holds is re-applied). The child is started in
a new session (a terminal's Ctrl-C reaches only the keeper, which stops it in order) with
``PR_SET_PDEATHSIG``, so it never outlives the keeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from inferway import background
from inferway.gateway.keeper_state import ProcessRecord
from inferway.gateway.restart_loop import Backoff, Exit, keep_restarting
from inferway.gateway.runtime import GatewayOptions
from inferway.observability.log_format import LogFormat
from inferway.parent_death import set_parent_death_signal

__all__ = ["READY_LINE", "ControlPlaneProcess", "ControlPlaneSpec"]

log = logging.getLogger(__name__)

READY_LINE = "ready\n"


@dataclass(frozen=True)
class ControlPlaneSpec:
    """What the control-plane process is told (pickled through its stdin)."""

    options: GatewayOptions
    log_level: str = "info"
    log_format: LogFormat = "text"
    """The keeper's resolved ``--log-format``: both processes share its stderr."""
    otlp_endpoint: str | None = None


class ControlPlaneProcess:
    """One control-plane child at a time; ``start`` returns once it is ready (or exited)."""

    def __init__(
        self,
        spec: ControlPlaneSpec,
        *,
        backoff: Backoff | None = None,
        stop_grace: float = 5.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.backoff = backoff or Backoff()
        self.stop_grace = stop_grace
        self.on_change = on_change
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.last_exit_at: float | None = None
        self.started_at: float | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._ready: asyncio.Event = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def record(self) -> ProcessRecord:
        return ProcessRecord(
            pid=self.pid,
            running=self.pid is not None,
            restarts=self.restarts,
            last_exit_code=self.last_exit_code,
            last_exit_at=self.last_exit_at,
            started_at=self.started_at,
        )

    async def start(self) -> int | None:
        """Start the first control plane and wait until it is ready: None, and supervision
        runs until :meth:`stop`; or its exit code when it exited first (a refused policy: 1)."""
        if self._monitor is not None:
            raise RuntimeError("this control plane is already started")
        await self._spawn()
        code = await self._wait_ready()
        if code is not None:
            return code
        self._monitor = background.start(self._supervise(), name="control-plane-keeper", log=log)
        return None

    async def _spawn(self) -> None:
        parent = os.getpid()
        self._ready = asyncio.Event()
        self._proc = proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "inferway.gateway.control_plane_main",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM, expected_parent=parent),
        )
        self.started_at = time.time()
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps(self.spec))
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()
        proc.stdin.close()
        self._reader = asyncio.create_task(self._read_stdout(proc, self._ready))
        log.info("control plane started (pid %d)", proc.pid)
        self._changed()

    async def _read_stdout(self, proc: asyncio.subprocess.Process, ready: asyncio.Event) -> None:
        """``ready`` is the one line the child says; anything else is passed through."""
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            if line == READY_LINE and not ready.is_set():
                ready.set()
            else:
                sys.stdout.write(line)

    async def _wait_ready(self) -> int | None:
        """None once the running child said ready; its exit code if it exited first."""
        proc, ready = self._proc, self._ready
        assert proc is not None
        ready_wait = asyncio.create_task(ready.wait())
        exit_wait = asyncio.create_task(proc.wait())
        try:
            await asyncio.wait({ready_wait, exit_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready_wait.cancel()
        if ready.is_set():
            exit_wait.cancel()
            return None
        code = await exit_wait
        self._exited(code)
        return code

    def _exited(self, code: int) -> None:
        self.last_exit_code, self.last_exit_at = code, time.time()
        self._changed()

    async def _supervise(self) -> None:
        await keep_restarting(
            "the control plane",
            backoff=self.backoff,
            stopping=lambda: self._stopping,
            wait_exit=self._wait_exit,
            crashed=self._crashed,
            respawn=self._spawn,
            restarted=self._restarted,
        )

    async def _wait_exit(self) -> Exit:
        proc = self._proc
        assert proc is not None
        code = await proc.wait()
        return Exit(proc.pid, code, time.time() - (self.started_at or 0.0))

    def _crashed(self, exit: Exit, delay: float) -> None:
        self._exited(exit.code)
        log.warning(
            "control plane (pid %d) exited with code %s after %.1fs; Envoy keeps serving "
            "its last config; restarting the control plane in %.2fs",
            exit.pid,
            exit.code,
            exit.uptime,
            delay,
        )

    async def _restarted(self) -> None:
        self.restarts += 1
        self._changed()
        if await self._wait_ready() is None:
            log.info("control plane is back (pid %s, restart %d)", self.pid, self.restarts)

    async def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the child, SIGKILL it after ``grace`` seconds; returns its exit code."""
        grace = self.stop_grace if grace is None else grace
        self._stopping = True
        if self._monitor is not None:
            await background.cancel(self._monitor)
            self._monitor = None
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await proc.wait()
            except TimeoutError:
                log.warning("control plane (pid %d) ignored SIGTERM; killing it", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._reader
            self._reader = None
        if proc is not None and proc.returncode is not None:
            self._exited(proc.returncode)
        return self.last_exit_code

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
