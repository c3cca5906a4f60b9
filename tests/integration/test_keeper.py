"""``inferway run`` as a keeper: Envoy outlives a SIGKILLed control plane (0 failed requests
under load, resync, an edit saved during the outage applies after it), SIGTERM drains Envoy
once running (0 failed requests) and stops everything at once during start-up, a relative
--workdir works, and an Envoy that cannot start fails the start loudly. Real ``inferway run``
processes, real Envoy, loopback only."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.envoy_process import free_port
from tests.helpers import PollTimeout, poll_until, write_atomically
from tests.keep_alive_client import KeepAliveClient, wait_until_flowing
from tests.traffic_harness import ControlledBackend, Result

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODE_ID = "keeper-test"

POLICY = """\
version: 1
listeners:
  - name: edge
    port: {listener_port}
services:
  - name: v1
    endpoints: ["127.0.0.1:{v1}"]
  - name: v2
    endpoints: ["127.0.0.1:{v2}"]
routes:
  - name: models
    backends:
      - service: v1
        weight: {w1}
      - service: v2
        weight: {w2}
"""


class RunProcess:
    """One ``inferway run`` subprocess on free loopback ports; its output goes to a file."""

    def __init__(
        self, tmp_path: Path, policy: Path, *, workdir: str | None = None, protocol: str = "sotw"
    ) -> None:
        self.admin_port = free_port()
        self.envoy_admin_port = free_port()
        self.log_path = tmp_path / "run.log"
        self.command = [
            *(sys.executable, "-m", "inferway.cli.main", "run", "-f", str(policy)),
            *("--xds-port", str(free_port()), "--admin-port", str(self.admin_port)),
            *("--envoy-admin-port", str(self.envoy_admin_port), "--node-id", NODE_ID),
            *("--workdir", workdir or str(tmp_path / "wd"), "--envoy-log-level", "info"),
            *("--xds-protocol", protocol),
        ]
        self.cwd = tmp_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_status: dict | None = None
        """The last status the admin API answered, for a failure's message."""
        self.seen: set[int] = set()
        """Every descendant pid ever observed: none may survive the keeper."""

    def start(self) -> RunProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def descendants(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            found = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.seen.update(p.pid for p in found)
        return found

    def status(self) -> dict | None:
        try:
            response = httpx.get(f"http://127.0.0.1:{self.admin_port}/status", timeout=2)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        self.last_status = response.json()
        return self.last_status

    def in_sync(self) -> dict | None:
        """The status once Envoy is connected and has ACKed the live snapshot."""
        assert self.proc is not None and self.proc.poll() is None, self.output()
        status = self.status()
        nodes = [] if status is None else status["nodes"]
        return status if any(n["node_id"] == NODE_ID and n["in_sync"] for n in nodes) else None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then the exit code; fails if any process it started is still alive."""
        assert self.proc is not None
        self.descendants()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        alive = [pid for pid in self.seen if _alive(pid)]
        assert not alive, f"left behind: {alive}\n{self.output()}"
        return code

    def wait_for_exit(self, timeout: float = 40.0) -> int:
        """The exit code of a run expected to end by itself (recording its children on the
        way, to check none survives); killed afterwards whatever happened."""
        assert self.proc is not None
        try:
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                self.descendants()
                time.sleep(0.05)
            return self.proc.wait(1)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.descendants()
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.seen:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone (or a zombie) between listing and reading
        return ""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _poll(run: RunProcess, predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    """poll_until for blocking predicates: run them off the loop that serves the backends. A
    timeout's message holds the run's last status (each node's ACKs, its last NACK) and log."""
    try:
        return await poll_until(lambda: asyncio.to_thread(predicate), timeout=timeout, what=what)
    except PollTimeout as failed:  # the predicate's own failure (the run exited) says enough
        status = json.dumps(run.last_status, indent=1)
        raise AssertionError(f"{failed}\nlast status: {status}\n{run.output()}") from None


class Load:
    """Paced GETs through Envoy (about ``rate``/s) until stopped; every result kept."""

    def __init__(self, url: str, *, rate: float = 150.0, concurrency: int = 8) -> None:
        self.url, self.interval, self.concurrency = url, concurrency / rate, concurrency
        self.results: list[Result] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Load:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(self._worker(session, i) for i in range(self.concurrency)))

    async def _worker(self, session, index: int) -> None:  # type: ignore[no-untyped-def]
        import aiohttp

        next_at = time.monotonic() + index * self.interval / self.concurrency
        while not self._stop.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += self.interval
            try:
                async with session.get(self.url) as response:
                    body = await response.json(content_type=None) if response.status == 200 else {}
                    result = Result(response.status, body.get("backend"), time.monotonic())
            except (aiohttp.ClientError, TimeoutError, ValueError):
                result = Result(0, None, time.monotonic())
            self.results.append(result)

    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status != 200]

    def last_backends(self, n: int) -> set[str | None]:
        return {r.backend for r in self.results[-n:]} if len(self.results) >= n else set()


@pytest.fixture
async def backends():  # type: ignore[no-untyped-def]
    started = [await ControlledBackend(name).start() for name in ("v1", "v2")]
    try:
        yield {b.name: b for b in started}
    finally:
        for backend in started:
            await backend.kill()


def _write_policy(path: Path, listener_port: int, backends: dict, w1: float, w2: float) -> None:
    ports = {name: b.port for name, b in backends.items()}
    write_atomically(path, POLICY.format(listener_port=listener_port, w1=w1, w2=w2, **ports))


@pytest.mark.parametrize("protocol", ["sotw", "delta"])
async def test_envoy_outlives_a_sigkilled_control_plane_and_an_edit_saved_meanwhile_applies(
    tmp_path: Path, backends: dict[str, ControlledBackend], protocol: str
) -> None:
    policy, listener_port = tmp_path / "policy.yaml", free_port()
    _write_policy(policy, listener_port, backends, 100, 0)
    run = RunProcess(tmp_path, policy, protocol=protocol).start()
    try:
        first = await _poll(run, run.in_sync, timeout=40, what="Envoy in sync under inferway run")
        envoy_pid, plane_pid = first["envoy"]["pid"], first["keeper"]["control_plane"]["pid"]
        async with Load(f"http://127.0.0.1:{listener_port}/infer") as load:
            await poll_until(lambda: load.last_backends(50) == {"v1"}, timeout=20, what="load")
            os.kill(plane_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            _write_policy(policy, listener_port, backends, 0, 100)  # saved during the outage

            def restarted() -> dict | None:
                status = run.in_sync()
                plane = None if status is None else status["keeper"]["control_plane"]
                return status if plane and plane["pid"] not in (None, plane_pid) else None

            back = await _poll(run, restarted, timeout=40, what="a restarted control plane in sync")
            back_at = time.monotonic()
            assert back["keeper"]["control_plane"]["restarts"] == 1
            assert back["keeper"]["control_plane"]["last_exit_code"] == -signal.SIGKILL
            assert back["policy"]["version"] != first["policy"]["version"]
            await poll_until(
                lambda: load.last_backends(50) == {"v2"}, timeout=20, what="the edit's traffic"
            )
        during = [r for r in load.results if killed_at <= r.at <= back_at]
        assert len(during) >= 20, f"too little traffic during the outage: {len(during)}"
        assert load.failures() == [], f"{len(load.failures())} of {len(load.results)} failed"
        after = run.status()
        assert after is not None and after["envoy"]["pid"] == envoy_pid, "Envoy was restarted"
        assert after["envoy"]["restarts"] == 0 and after["envoy"]["running"]
        assert run.stop() == 0
    finally:
        run.kill()


async def test_sigterm_drains_envoy_so_that_no_request_fails(
    tmp_path: Path, backends: dict[str, ControlledBackend]
) -> None:
    """SIGTERM to a running gateway (``docker stop``, a pod's deletion): requests in flight
    finish and keep-alive clients are told to go (``Connection: close``) before Envoy stops,
    so none of them fails. Envoy's own SIGTERM, sent at once, reset them all."""
    policy, listener_port = tmp_path / "policy.yaml", free_port()
    _write_policy(policy, listener_port, backends, 100, 0)
    backends["v1"].delay = 0.2  # so that requests are in flight when the signal arrives
    run = RunProcess(tmp_path, policy).start()
    try:
        await _poll(run, run.in_sync, timeout=40, what="Envoy in sync under inferway run")
        clients = [KeepAliveClient(listener_port, "/infer", seconds=30) for _ in range(4)]
        for client in clients:
            client.start()
        await asyncio.to_thread(wait_until_flowing, clients, 2, 20)
        sent = time.monotonic()
        code = await asyncio.to_thread(run.stop, 15)
        elapsed = time.monotonic() - sent
        for client in clients:
            await asyncio.to_thread(client.join, 30)
        failures = [f for c in clients for f in c.failures]
        assert failures == [], f"{failures}\n{run.output()}"
        assert all(c.told_to_go for c in clients), run.output()
        assert code == 0 and "draining envoy's listeners" in run.output(), run.output()
        assert elapsed < 10, f"took {elapsed:.1f}s to stop\n{run.output()}"
    finally:
        run.kill()


@pytest.mark.parametrize("stage", ["control_plane_main", "envoy"])
def test_sigterm_during_start_up_stops_everything_within_seconds(
    tmp_path: Path, stage: str
) -> None:
    """SIGTERM as soon as the control plane (or Envoy) is spawned, long before it is ready."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(listener_port=free_port(), v1=1, v2=2, w1=50, w2=50))
    run = RunProcess(tmp_path, policy).start()
    try:

        def spawned() -> bool:
            return any(stage in _cmdline(p) for p in run.descendants())

        deadline = time.monotonic() + 30
        while not spawned():
            assert run.proc is not None and run.proc.poll() is None, run.output()
            assert time.monotonic() < deadline, run.output()
            time.sleep(0.01)
        sent = time.monotonic()
        code = run.stop(timeout=10)
        elapsed = time.monotonic() - sent
        assert code == 0, run.output()
        assert elapsed < 3.0, f"took {elapsed:.1f}s to stop\n{run.output()}"
        if stage == "control_plane_main":  # Envoy becomes ready too fast to assert this there
            assert "stopped during start-up" in run.output(), run.output()
    finally:
        run.kill()


def test_a_relative_workdir_runs_envoy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(listener_port=free_port(), v1=1, v2=2, w1=50, w2=50))
    run = RunProcess(tmp_path, policy, workdir="wd").start()
    try:
        status = asyncio.run(_poll(run, run.in_sync, timeout=40, what="Envoy in sync"))
        assert status["envoy"]["running"] and status["envoy"]["restarts"] == 0, run.output()
        assert (tmp_path / "wd" / "envoy-bootstrap.json").is_file()
        assert run.stop() == 0
    finally:
        run.kill()


def test_an_envoy_that_cannot_start_fails_the_start_loudly(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(listener_port=free_port(), v1=1, v2=2, w1=50, w2=50))
    run = RunProcess(tmp_path, policy)
    with socket.socket() as taken:  # Envoy's admin port, already in use
        taken.bind(("127.0.0.1", run.envoy_admin_port))
        taken.listen()
        code = run.start().wait_for_exit()
    out = run.output()
    assert code == 2, out
    assert "envoy exited with code" in out and "before it was ready" in out, out
    assert "Address already in use" in out or "cannot bind" in out, out
    assert "running (envoy pid" not in out
    assert run.seen and not [pid for pid in run.seen if _alive(pid)], run.seen


def test_a_refused_policy_exits_1_before_envoy_starts(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(listener_port=70000, v1=1, v2=2, w1=50, w2=50))
    run = RunProcess(tmp_path, policy).start()
    code = run.wait_for_exit()
    out = run.output()
    assert code == 1, out
    assert f"{policy}:4:11: listeners[0].port: must be at most 65535, got 70000" in out, out
    assert not (tmp_path / "wd" / "envoy-bootstrap.json").exists(), "Envoy was started"
    assert not [pid for pid in run.seen if _alive(pid)]


def test_a_listener_port_taken_by_another_process_exits_1_with_its_location(
    tmp_path: Path,
) -> None:
    """The keeper's control plane checks the listener ports before Envoy starts: a taken one is
    a located policy error (exit 1), not an Envoy that starts and NACKs its listener."""
    policy = tmp_path / "policy.yaml"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        policy.write_text(POLICY.format(listener_port=port, v1=1, v2=2, w1=50, w2=50))
        run = RunProcess(tmp_path, policy).start()
        code = run.wait_for_exit()
    out = run.output()
    assert code == 1, out
    assert f"{policy}:4:11: listeners[0].port: listener 'edge' cannot bind" in out, out
    assert not (tmp_path / "wd" / "envoy-bootstrap.json").exists(), "Envoy was started"
    assert not [pid for pid in run.seen if _alive(pid)]
