"""``picker: {process: sidecar}``: the gateway runs a picker address's gRPC server in a picker
process of its own (``python -m inferway.gateway.picker HOST PORT``) instead of in its own
event loop, so a busy control plane (policy reloads, thousands of xDS clients, status
requests) does not share an event loop with the picks (bench/picker_overhead.py measures
both modes, also during a policy reload storm).

The gateway feeds the process what it would serve itself: one JSON line on its stdin per
change, ``{"pools": {service: {"settings": <picker policy>, "endpoints": ["ip:port", ...]}}}``;
the process answers ``applied`` on its stdout once it serves that. When the process dies the
supervisor starts another at once (backing off to 2 s while it keeps dying) and sends it the
latest line; in between Envoy applies the service's ``fail`` mode. The process exits when its
stdin closes, so it never outlives the gateway.

``status`` in the gateway shows a sidecar's pools too: every ``STATUS_INTERVAL_S`` the
supervisor asks the process over the same pipe (``{"status": true}``) and keeps its answer,
so the per-request path never waits on it and a status request never waits on the process.

The same answers tell a hung process from a live one: a process that answered once and then
answers nothing for ``hung_after`` seconds (a deadlock, a stopped process, an event loop
blocked) is killed, and so restarted, with an error saying why. Until then each request
waits the picker's ``timeout`` and gets the ``fail`` mode; a hung process left alone would
cost every request that wait for as long as it lived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from typing import Any

from inferway.policies.picker import Picker as PickerPolicy

__all__ = ["STATUS_REQUEST", "PickerSidecar", "pools_line"]

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 2.0
STATUS_INTERVAL_S = 1.0
"""How often the supervisor asks the process for its pools' status (at most that stale)."""
STATUS_REQUEST = b'{"status": true}\n'
"""The stdin line that asks the process for its pools' status (it answers ``status <json>``)."""
STEADY_S = 10.0
"""A process that ran this long before dying is restarted at once, not after a back-off."""
HUNG_AFTER_S = 5.0
"""A process silent this long (no status answer; it answers each second) is killed as hung."""


def pools_line(pools: dict[str, tuple[PickerPolicy, list[str]]]) -> bytes:
    """The stdin line that tells a picker process to serve ``pools``."""
    document = {
        name: {"settings": settings.model_dump(mode="json"), "endpoints": endpoints}
        for name, (settings, endpoints) in sorted(pools.items())
    }
    return json.dumps({"pools": document}, sort_keys=True).encode() + b"\n"


class PickerSidecar:
    """Supervises the picker process serving ``host:port``."""

    def __init__(self, host: str, port: int, hung_after: float = HUNG_AFTER_S) -> None:
        self.host = host
        self.port = port
        self.hung_after = hung_after
        self.pid: int | None = None
        self.restarts = 0
        self.killed_hung = 0
        """Processes killed for answering nothing for ``hung_after`` seconds."""
        self._answered_at: float | None = None
        """When the running process last answered a status request (None: not yet)."""
        self.last_restart_s: float | None = None
        """From a death seen to the new process serving, the last time."""
        self._line = b""
        self._process: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._serving = asyncio.Event()
        """Set while the process serves the latest line (it answered each line sent to it)."""
        self._sent = self._applied = 0
        self.pools_status: dict[str, Any] = {}
        """The process's last answer to a status request: service -> its endpoints' stats
        and last pick ({} until it answers, and again after it dies)."""
        self._asking: asyncio.Task[None] | None = None

    async def start(self) -> PickerSidecar:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._supervise())
        self._asking = loop.create_task(self._ask_status())
        return self

    async def _ask_status(self) -> None:
        while not self._stopping:
            process = self._process
            if process is not None and process.stdin is not None and process.returncode is None:
                answered = self._answered_at
                silent = None if answered is None else time.monotonic() - answered
                if silent is not None and silent > self.hung_after:
                    self._kill_hung(process, silent)
                else:
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        process.stdin.write(STATUS_REQUEST)
            await asyncio.sleep(min(STATUS_INTERVAL_S, self.hung_after / 2))

    def _kill_hung(self, process: asyncio.subprocess.Process, silent: float) -> None:
        """Kill ``process`` (the supervisor then restarts it): it answered nothing for
        ``silent`` seconds, so each request to it waits the picker's ``timeout``."""
        self.killed_hung += 1
        self._answered_at = None
        log.error(
            "endpoint picker process %d on %s:%d answered no status request for %.1f s: "
            "killing it as hung, to be restarted (Envoy applies each service's fail mode, "
            "after the picker's timeout, until the new one serves)",
            process.pid, self.host, self.port, silent,
        )  # fmt: skip
        with contextlib.suppress(ProcessLookupError):
            process.kill()

    def update(self, pools: dict[str, tuple[PickerPolicy, list[str]]]) -> None:
        """Serve ``pools`` from now on (sent now when the process runs, else when it starts)."""
        line = pools_line(pools)
        if line == self._line:
            return
        self._line = line
        process = self._process
        if process is not None and process.stdin is not None and process.returncode is None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                process.stdin.write(line)
                self._sent += 1
                self._serving.clear()

    async def wait_serving(self, timeout: float) -> bool:
        """Whether the process serves the latest pools within ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._serving.wait()
        return self._serving.is_set()

    async def _supervise(self) -> None:
        backoff = 0.0
        died_at: float | None = None
        while not self._stopping:
            started = time.monotonic()
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "inferway.gateway.picker", self.host, str(self.port),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            self._process, self.pid = process, process.pid
            self._sent = self._applied = 0
            self._answered_at = None  # the watchdog waits for this process's first answer
            assert process.stdin is not None and process.stdout is not None
            if self._line:
                process.stdin.write(self._line)
                self._sent = 1
            while line := await process.stdout.readline():
                if line.startswith(b"status "):
                    self._took_status(line[7:])
                    continue
                if line.startswith(b"applied"):
                    self._applied += 1
                if self._sent and self._applied >= self._sent:
                    self._serving.set()
                    if died_at is not None:
                        self.last_restart_s, died_at = time.monotonic() - died_at, None
            code = await process.wait()
            self._serving.clear()
            self.pools_status = {}
            self._process = None
            if self._stopping:
                return
            died_at = time.monotonic()
            self.restarts += 1
            ran = died_at - started
            backoff = 0.0 if ran > STEADY_S else min(MAX_BACKOFF_S, max(0.05, backoff * 2))
            log.error(
                "endpoint picker process %d on %s:%d exited (%s) after %.1f s; restarting in "
                "%.2f s (Envoy applies each service's fail mode meanwhile)",
                process.pid, self.host, self.port, code, ran, backoff,
            )  # fmt: skip
            await asyncio.sleep(backoff)

    def _took_status(self, text: bytes) -> None:
        self._answered_at = time.monotonic()  # alive, even if the line is bad
        try:
            document = json.loads(text)
        except ValueError as error:
            log.error("endpoint picker process %s: a bad status line: %s", self.pid, error)
            return
        if isinstance(document, dict):
            self.pools_status = document

    def status(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "restarts": self.restarts,
            "last_restart_s": self.last_restart_s,
            "killed_hung": self.killed_hung,
        }

    async def stop(self) -> None:
        """Close the process's stdin (it exits), kill it after 2 s, stop supervising."""
        self._stopping = True
        if self._asking is not None:
            self._asking.cancel()
            await asyncio.gather(self._asking, return_exceptions=True)
            self._asking = None
        process = self._process
        if process is not None and process.returncode is None:
            if process.stdin is not None:
                process.stdin.close()
            try:
                async with asyncio.timeout(2.0):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
