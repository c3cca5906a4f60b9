"""EnvoySupervisor against the real Envoy binary: restart on crash, clean stop, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from inferway.gateway.supervisor import Backoff, EnvoySupervisor
from tests.envoy_process import free_port

pytestmark = pytest.mark.integration


def static_bootstrap(admin_port: int, listen_port: int) -> dict:
    """An Envoy that needs no control plane: admin plus one direct-response listener."""
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "static",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    return {
        "node": {"id": "supervisor-test", "cluster": "inferway"},
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}
        },
        "static_resources": {
            "listeners": [
                {
                    "name": "static",
                    "address": {
                        "socket_address": {"address": "127.0.0.1", "port_value": listen_port}
                    },
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ]
        },
    }


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def envoy_children() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "envoy" in child.name():
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(autouse=True, scope="module")
def no_envoy_left_behind():
    yield
    leftover = [p for p in envoy_children() if not is_gone(p.pid)]
    for proc in leftover:
        proc.kill()
    assert not leftover, f"envoy processes left behind: {[p.pid for p in leftover]}"


async def test_envoy_killed_with_sigkill_is_restarted(tmp_path: Path) -> None:
    admin_port = free_port()
    supervisor = EnvoySupervisor(
        static_bootstrap(admin_port, free_port()),
        workdir=tmp_path,
        backoff=Backoff(initial=0.1, maximum=1.0),
        concurrency=1,
    )
    await supervisor.start()
    try:
        assert await supervisor.wait_ready(15), supervisor.stderr_tail()
        first = supervisor.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and supervisor.restarts == 0:
            await _tick()
        assert supervisor.restarts == 1
        assert supervisor.last_exit_code == -signal.SIGKILL
        assert supervisor.pid not in (None, first)
        assert await supervisor.wait_ready(15), supervisor.stderr_tail()
    finally:
        await supervisor.stop()
    assert supervisor.pid is None


async def test_stop_terminates_envoy(tmp_path: Path) -> None:
    supervisor = EnvoySupervisor(
        static_bootstrap(free_port(), free_port()), workdir=tmp_path, concurrency=1
    )
    await supervisor.start()
    pid = supervisor.pid
    assert pid is not None
    assert await supervisor.wait_ready(15), supervisor.stderr_tail()
    code = await supervisor.stop(grace=5)
    assert code == 0  # Envoy exits cleanly on SIGTERM
    assert is_gone(pid)
    assert supervisor.bootstrap_path.exists()


def test_parent_killed_with_sigkill_leaves_no_envoy(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from inferway.gateway.supervisor import EnvoySupervisor

        async def main():
            bootstrap = json.loads(sys.argv[1])
            sup = EnvoySupervisor(bootstrap, workdir={str(tmp_path)!r}, concurrency=1)
            await sup.start()
            print(sup.pid, flush=True)
            await asyncio.sleep(3600)

        asyncio.run(main())
        """
    )
    import json

    bootstrap = json.dumps(static_bootstrap(free_port(), free_port()))
    child = subprocess.Popen(
        [sys.executable, "-c", script, bootstrap], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        envoy_pid = int(child.stdout.readline())
        assert psutil.pid_exists(envoy_pid)
        assert "envoy" in psutil.Process(envoy_pid).name()
        child.kill()
        child.wait(10)
        wait_until(lambda: is_gone(envoy_pid), 10, f"envoy pid {envoy_pid} to die")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


async def _tick() -> None:
    import asyncio

    await asyncio.sleep(0.05)
