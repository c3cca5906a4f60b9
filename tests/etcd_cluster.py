"""A real etcd cluster for tests (Debian's ``etcd-server``): N members on loopback ports picked
together, temp data folders, fast raft timings (50 ms heartbeat, 500 ms election), polled
until every member answers ``/health``; members stopped, paused and restarted by pid.

    async with EtcdCluster(tmp_path, members=3) as cluster:
        cluster.url  # etcd://127.0.0.1:<c0>,127.0.0.1:<c1>,127.0.0.1:<c2>
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx

from inferway.free_ports import free_ports
from tests.components import require_binary

__all__ = ["ETCD", "EtcdCluster"]

ETCD = shutil.which("etcd")
"""The binary, or None where the Debian package is not installed (bench/ checks it; a test
gets a cluster or, without the binary, a skip or a CI failure: ``require_binary``)."""


class EtcdCluster:
    def __init__(self, workdir: Path, *, members: int = 3) -> None:
        self._etcd = require_binary("etcd", "a real etcd cluster")
        ports = free_ports(*["127.0.0.1"] * (2 * members))
        self.client_ports = ports[:members]
        self.peer_ports = ports[members:]
        self.workdir = workdir
        self.names = [f"m{i}" for i in range(members)]
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._paused: set[int] = set()

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def endpoint(self, index: int) -> str:
        return f"127.0.0.1:{self.client_ports[index]}"

    def _command(self, index: int) -> list[str]:
        cluster = ",".join(
            f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports, strict=True)
        )
        client = f"http://127.0.0.1:{self.client_ports[index]}"
        peer = f"http://127.0.0.1:{self.peer_ports[index]}"
        return [
            self._etcd,
            "--name", self.names[index],
            "--data-dir", str(self.workdir / f"etcd-{self.names[index]}"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", "inferway-test",
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            "--logger", "zap",
            "--log-level", "error",
        ]  # fmt: skip

    def start(self, index: int) -> None:
        log = (self.workdir / f"etcd-{self.names[index]}.log").open("ab")
        self._processes[index] = subprocess.Popen(
            self._command(index), stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def stop(self, index: int) -> None:
        """SIGKILL the member (a crash), by its pid."""
        process = self._processes.pop(index, None)
        if process is None:
            return
        if index in self._paused:
            self.resume(index)
        process.kill()
        process.wait(timeout=10)

    def pause(self, index: int) -> None:
        """SIGSTOP: the member stops answering without closing its sockets (a partition)."""
        os.kill(self._processes[index].pid, signal.SIGSTOP)
        self._paused.add(index)

    def resume(self, index: int) -> None:
        os.kill(self._processes[index].pid, signal.SIGCONT)
        self._paused.discard(index)

    async def wait_healthy(self, indexes: list[int] | None = None, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        wanted = list(range(len(self.names))) if indexes is None else indexes
        async with httpx.AsyncClient(timeout=1.0) as http:
            while True:
                healthy = 0
                for index in wanted:
                    try:
                        answer = await http.get(f"http://{self.endpoint(index)}/health")
                        healthy += answer.json().get("health") == "true"
                    except (httpx.HTTPError, ValueError):
                        pass
                if healthy == len(wanted):
                    return
                if time.monotonic() > deadline:
                    logs = {
                        n: (self.workdir / f"etcd-{n}.log").read_text(errors="replace")[-2000:]
                        for n in self.names
                    }
                    raise TimeoutError(f"etcd members {wanted} not healthy in {timeout}s: {logs}")
                await asyncio.sleep(0.1)

    async def __aenter__(self) -> EtcdCluster:
        for index in range(len(self.names)):
            self.start(index)
        try:
            await self.wait_healthy()
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        for index in list(self._processes):
            self.stop(index)
