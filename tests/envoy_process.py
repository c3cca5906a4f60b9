"""A real Envoy for tests: bootstrap in a temp dir, started, polled until ready, always killed.

    async with EnvoyProcess(bootstrap) as envoy:          # waits for /ready
        stats = await envoy.get_stats()
        dump = await envoy.config_dump()

The admin port is read back from ``--admin-address-path``, so a bootstrap may use admin port 0.
All waits poll with a deadline; admin calls are async so the test's own event loop (which often
runs the xDS server Envoy is waiting on) keeps turning.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from inferway.free_ports import free_port as inferway_free_port
from inferway.xds.bootstrap import write_bootstrap
from inferway.xds.envoy_binary import find_envoy

__all__ = ["EnvoyProcess", "EnvoyStartError", "free_port"]

_base_ids = itertools.count(1)


_handed_out: deque[int] = deque(maxlen=2048)


def with_llm_ports(policy: str) -> str:
    """``policy`` with ``LLM_PORT`` and ``LLM_REPORTS_PORT`` (the LLM processor's gRPC and
    reports ports) filled with free ports (the reports port's default, ``port + 1``, is not
    one this process handed out)."""
    return policy.replace("LLM_PORT", str(free_port())).replace(
        "LLM_REPORTS_PORT", str(free_port())
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host``, and none of the last 2,048 this test process
    handed out: tests pick their ports one call at a time, bound later by the processes they
    start, and the OS may give one free port to two calls (Envoy's admin port and a listener
    of the same test then collide, and the listener's update is refused)."""
    while (port := inferway_free_port(host)) in _handed_out:
        pass
    _handed_out.append(port)
    return port


class EnvoyStartError(RuntimeError):
    """Envoy exited or did not become ready in time; the message ends with its log tail."""


class EnvoyProcess:
    """One Envoy process for one test. ``wait`` in ``start``: "ready" (admin /ready answers
    200, i.e. initial xDS done), "admin" (admin answers at all) or None (just spawn)."""

    def __init__(
        self,
        bootstrap: dict[str, Any],
        *,
        log_level: str = "warning",
        extra_args: list[str] | None = None,
        base_id: int | None = None,
        prefix: list[str] | None = None,
        admin_host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
    ) -> None:
        """``prefix`` runs Envoy under another command (``ip netns exec NS``: a host of the
        tests' fleet), whose admin API the test reaches at ``admin_host``."""
        self.bootstrap = bootstrap
        self.log_level = log_level
        self.extra_args = list(extra_args or [])
        self.base_id = base_id if base_id is not None else _unique_base_id()
        self.prefix = list(prefix or [])
        self.admin_host = admin_host
        self.env = dict(env or {})
        """Set in Envoy's environment over this process's (its module search path)."""
        self.workdir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._admin_port: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def spawn(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="inferway-envoy-"))
        config = write_bootstrap(self.workdir / "bootstrap.yaml", self.bootstrap)
        log = (self.workdir / "envoy.log").open("wb")
        command = [
            *self.prefix,
            find_envoy(),
            "-c",
            str(config),
            "--base-id",
            str(self.base_id),
            "--disable-hot-restart",
            "-l",
            self.log_level,
            "--admin-address-path",
            str(self.workdir / "admin_address"),
            *self.extra_args,
        ]
        try:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )
        finally:
            log.close()

    async def start(self, *, wait: str | None = "ready", timeout: float = 20.0) -> EnvoyProcess:
        self.spawn()
        try:
            if wait == "ready":
                await self.wait_ready(timeout)
            elif wait == "admin":
                await self._wait_admin_port(timeout)
            elif wait is not None:
                raise ValueError(f"wait must be 'ready', 'admin' or None, not {wait!r}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 5.0) -> int | None:
        """Terminate (then kill) Envoy and remove its temp dir; returns its exit code."""
        code = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout)
            code = self.process.returncode
            self.process = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        return code

    async def __aenter__(self) -> EnvoyProcess:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- admin -------------------------------------------------------------------------------

    @property
    def admin_port(self) -> int:
        if self._admin_port is None:
            port = self._read_admin_port()
            if port is None:
                raise EnvoyStartError("Envoy has not written its admin address yet")
            self._admin_port = port
        return self._admin_port

    @property
    def admin_url(self) -> str:
        return f"http://{self.admin_host}:{self.admin_port}"

    async def admin_get(self, path: str, **params: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.admin_url, timeout=5.0) as client:
            return await client.get(path, params=params)

    async def get_stats(self, filter_regex: str | None = None) -> dict[str, int]:
        """Counters and gauges by name (histograms left out)."""
        params = {"filter": filter_regex} if filter_regex else {}
        response = await self.admin_get("/stats", **params)
        response.raise_for_status()
        stats: dict[str, int] = {}
        for line in response.text.splitlines():
            name, sep, value = line.partition(": ")
            if sep and value.strip().lstrip("-").isdigit():
                stats[name] = int(value)
        return stats

    async def config_dump(self, resource: str | None = None) -> dict[str, Any]:
        params = {"resource": resource} if resource else {}
        response = await self.admin_get("/config_dump", **params)
        response.raise_for_status()
        return response.json()

    async def wait_ready(self, timeout: float = 20.0) -> None:
        async def ready() -> bool:
            try:
                return (await self.admin_get("/ready")).status_code == 200
            except httpx.HTTPError:
                return False

        await self._wait_admin_port(timeout)
        await self.wait_for(ready, timeout=timeout, what="Envoy admin /ready to answer 200")

    async def wait_for(
        self,
        predicate: Callable[[], Awaitable[bool]],
        *,
        timeout: float = 10.0,
        interval: float = 0.05,
        what: str = "condition",
    ) -> None:
        """Poll ``predicate`` until true; raise with Envoy's log tail on timeout or exit."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if await predicate():
                return
            if time.monotonic() >= deadline:
                raise EnvoyStartError(
                    f"timed out after {timeout}s waiting for {what}{self._tail()}"
                )
            await asyncio.sleep(interval)

    def log_text(self) -> str:
        if self.workdir is None or not (self.workdir / "envoy.log").exists():
            return ""
        return (self.workdir / "envoy.log").read_text(errors="replace")

    # -- internals ---------------------------------------------------------------------------

    async def _wait_admin_port(self, timeout: float) -> None:
        async def written() -> bool:
            return self._read_admin_port() is not None

        await self.wait_for(written, timeout=timeout, what="Envoy to write its admin address")
        self._admin_port = self._read_admin_port()

    def _read_admin_port(self) -> int | None:
        if self.workdir is None:
            return None
        path = self.workdir / "admin_address"
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return None
        host, _, port = text.rpartition(":")
        return int(port) if host and port.isdigit() else None

    def _check_alive(self) -> None:
        if self.process is None:
            raise EnvoyStartError("Envoy is not running (never started or already stopped)")
        code = self.process.poll()
        if code is not None:
            raise EnvoyStartError(f"Envoy exited with code {code}{self._tail()}")

    def _tail(self, lines: int = 30) -> str:
        text = self.log_text().splitlines()[-lines:]
        return ("\n--- envoy log tail ---\n" + "\n".join(text)) if text else ""


def _unique_base_id() -> int:
    """Unique per process and per instance, so parallel test processes never collide."""
    return (os.getpid() % 100_000) * 100 + next(_base_ids) % 100
