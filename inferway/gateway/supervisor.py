"""Run one Envoy and keep it running: the sidecar's data plane must outlive its crashes, and
must never outlive us.

Envoy is started in its own process group (so one signal reaches everything it spawns) with
``PR_SET_PDEATHSIG`` set in the child, so the kernel kills it if this Python process dies,
even by SIGKILL. A crash is answered by a restart after an exponential backoff, capped, and
reset once Envoy has stayed up for a stable period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from inferway import background
from inferway.gateway.restart_loop import Backoff, Exit, keep_restarting
from inferway.parent_death import set_parent_death_signal
from inferway.xds.envoy_binary import find_envoy

__all__ = [
    "ENVOY_READY_TIMEOUT_S",
    "Backoff",
    "EnvoySupervisor",
    "admin_port_of",
    "set_parent_death_signal",
    "wait_envoy_started",
]

log = logging.getLogger(__name__)

_STDERR_TAIL_LINES = 40


def admin_port_of(bootstrap: dict[str, Any]) -> int:
    """The admin port a bootstrap binds (``admin.address.socket_address.port_value``)."""
    try:
        return int(bootstrap["admin"]["address"]["socket_address"]["port_value"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            "the bootstrap has no admin.address.socket_address.port_value; "
            "pass admin_port explicitly"
        ) from None


class EnvoySupervisor:
    """Writes the bootstrap, starts Envoy, restarts it when it dies, stops it on request."""

    def __init__(
        self,
        bootstrap: dict[str, Any],
        *,
        workdir: str | Path,
        base_id: int | None = None,
        admin_port: int | None = None,
        log_level: str = "warning",
        backoff: Backoff | None = None,
        drain_time_s: int = 1,
        concurrency: int | None = None,
        envoy_path: str | None = None,
        extra_args: Sequence[str] = (),
        stop_grace: float = 5.0,
        on_restart: Callable[[int, int | None], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.env = dict(env or {})
        """Set in Envoy's environment, over this process's (its module search path)."""
        self.workdir = Path(workdir).absolute()  # Envoy runs in it: a relative path would break
        # Hot restart is disabled, but a unique base id still keeps two Envoys on one host
        # (tests, a demo beside a real sidecar) from ever sharing a domain socket namespace.
        self.base_id = base_id if base_id is not None else random.randrange(1 << 16, 1 << 30)
        self.admin_port = admin_port if admin_port is not None else admin_port_of(bootstrap)
        self.log_level = log_level
        self.backoff = backoff or Backoff()
        self.drain_time_s = drain_time_s
        self.concurrency = concurrency
        self.envoy_path = envoy_path
        self.extra_args = tuple(extra_args)
        self.stop_grace = stop_grace
        self.on_restart = on_restart
        self.restarts = 0
        self.last_exit_code: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._started_at = 0.0
        self._stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)
        self._stderr_task: asyncio.Task[None] | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def bootstrap_path(self) -> Path:
        return self.workdir / "envoy-bootstrap.json"

    @property
    def pid(self) -> int | None:
        """The running Envoy's pid, or None between a crash and its restart."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def stderr_tail(self) -> list[str]:
        return list(self._stderr_tail)

    def command(self) -> list[str]:
        args = [
            self.envoy_path or find_envoy(),
            "--config-path",
            str(self.bootstrap_path),
            "--disable-hot-restart",
            "--base-id",
            str(self.base_id),
            "--drain-time-s",
            str(self.drain_time_s),
            "--log-level",
            self.log_level,
        ]
        if self.concurrency is not None:
            args += ["--concurrency", str(self.concurrency)]
        return args + list(self.extra_args)

    async def start(self) -> None:
        """Write the bootstrap and start Envoy; supervision runs until :meth:`stop`."""
        if self._monitor is not None:
            raise RuntimeError("this supervisor is already started")
        self._stopping = False
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bootstrap_path.write_text(json.dumps(self.bootstrap, indent=2, sort_keys=True))
        await self._spawn()
        self._monitor = background.start(self._supervise(), name="envoy-supervisor", log=log)

    async def _spawn(self) -> None:
        parent = os.getpid()
        self._stderr_tail.clear()
        self._proc = await asyncio.create_subprocess_exec(
            *self.command(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            cwd=str(self.workdir),
            env={**os.environ, **self.env} if self.env else None,
            start_new_session=True,
            preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL, expected_parent=parent),
        )
        self._started_at = time.monotonic()
        self._stderr_task = asyncio.create_task(self._read_stderr(self._proc))
        log.info("envoy started (pid %d, admin port %d)", self._proc.pid, self.admin_port)

    async def _read_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self._stderr_tail.append(line)
                log.debug("envoy: %s", line)

    async def _supervise(self) -> None:
        await keep_restarting(
            "envoy",
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
        if self._stderr_task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._stderr_task)
        self.last_exit_code = code
        return Exit(proc.pid, code, time.monotonic() - self._started_at)

    def _crashed(self, exit: Exit, delay: float) -> None:
        tail = "\n  ".join(self.stderr_tail()[-10:]) or "(no output)"
        log.warning(
            "envoy (pid %d) exited with code %s after %.1fs; restarting in %.2fs. "
            "Last stderr lines:\n  %s",
            exit.pid,
            exit.code,
            exit.uptime,
            delay,
            tail,
        )

    async def _restarted(self) -> None:
        self.restarts += 1
        if self.on_restart is not None:
            self.on_restart(self.restarts, self.last_exit_code)

    async def wait_ready(self, timeout: float = 15.0) -> bool:
        """Poll the admin ``/ready`` until Envoy answers 200 (LIVE), or ``timeout`` passes."""
        url = f"http://127.0.0.1:{self.admin_port}/ready"
        deadline = time.monotonic() + timeout
        client_timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=client_timeout) as session:
            while time.monotonic() < deadline:
                if self._monitor is not None and self._monitor.done():
                    return False
                try:
                    async with session.get(url) as response:
                        if response.status == 200:
                            return True
                except (TimeoutError, aiohttp.ClientError, OSError):
                    pass
                await asyncio.sleep(0.05)
        return False

    async def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; returns the exit code."""
        grace = self.stop_grace if grace is None else grace
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await proc.wait()
            except TimeoutError:
                log.warning("envoy (pid %d) ignored SIGTERM for %.1fs; killing it", proc.pid, grace)
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        if self._monitor is not None:
            await background.cancel(self._monitor)
            self._monitor = None
        if self._stderr_task is not None:
            await background.cancel(self._stderr_task)
            self._stderr_task = None
        if proc is not None:
            self.last_exit_code = proc.returncode
            log.info("envoy stopped (exit code %s)", proc.returncode)
        return self.last_exit_code

    async def __aenter__(self) -> EnvoySupervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _signal_group(pid: int, sig: int) -> None:
    """Signal Envoy's whole process group (it leads it: started with a new session)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


ENVOY_READY_TIMEOUT_S = 30.0


async def wait_envoy_started(envoy: EnvoySupervisor) -> str | None:
    """None once Envoy answers /ready (or, with a warning, when it is merely slow); the
    reason when it exited before it was ready: it cannot start, so neither can we."""
    deadline = asyncio.get_running_loop().time() + ENVOY_READY_TIMEOUT_S
    while asyncio.get_running_loop().time() < deadline:
        if envoy.last_exit_code is not None:
            tail = "\n  ".join(envoy.stderr_tail()[-15:]) or "(no output)"
            return (
                f"envoy exited with code {envoy.last_exit_code} before it was ready; "
                f"cannot start the gateway. Envoy's last output:\n  {tail}"
            )
        if await envoy.wait_ready(0.5):
            log.info("envoy is ready (admin on port %d)", envoy.admin_port)
            return None
    log.warning(
        "envoy is not ready after %.0fs; last output:\n  %s",
        ENVOY_READY_TIMEOUT_S,
        "\n  ".join(envoy.stderr_tail()[-10:]) or "(none)",
    )
    return None
