"""One replica's operating-system process: spawn it, ask whether it is ready, stop it.

Each replica runs in its own session (process group), so SIGTERM/SIGKILL reach the
workers a command may fork, and with a parent-death signal, so replicas never outlive a
gateway that was killed. Output goes to a log file whose tail becomes the replica's
"last error" when it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from inferway.parent_death import set_parent_death_signal

__all__ = ["ReplicaProcess", "probe_ready", "spawn_replica"]


class ReplicaProcess:
    """A started replica command."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    def tail(self, lines: int = 3, limit: int = 400) -> str:
        """The last lines of the replica's output, for a status line."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        kept = " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())
        return kept[-limit:]

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    async def terminate(self, grace: float) -> int:
        """SIGTERM the replica's process group; SIGKILL it after ``grace`` seconds."""
        if self.process.returncode is None:
            self._signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await asyncio.shield(self.process.wait())
            except TimeoutError:
                self._signal(signal.SIGKILL)
        code = await self.process.wait()
        self._signal(signal.SIGKILL)  # workers the command left behind in its group
        return code


def _child_setup() -> None:
    set_parent_death_signal(signal.SIGTERM)


async def spawn_replica(
    argv: list[str], env: Mapping[str, str], cwd: str | None, log_path: Path
) -> ReplicaProcess:
    """Start ``argv``; raises OSError (e.g. the program does not exist) as is."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_child_setup,
        )
    return ReplicaProcess(process, log_path)


async def probe_ready(session: aiohttp.ClientSession, url: str, timeout: float = 1.0) -> bool:
    """One readiness probe: True when ``url`` answers 200."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            await response.read()
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False
