"""The gateway's replica manager follows policy edits without a restart, over real processes:
the composition root with a real Envoy and a policy that starts with no ``replicas:`` at all
(the service is one fixed endpoint), then edits of the file (applied as the watcher does)
that add ``replicas:``, raise ``min``, change the command under load (replaced
make-before-break: no failed request) and finally remove ``replicas:`` (drained, stopped,
the fixed endpoint serving again)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from inferway.gateway.runtime import Gateway
from tests.aiohttp_sites import answer_every_path, start_site
from tests.envoy_process import free_port
from tests.gateway_process import running_gateway
from tests.helpers import poll_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SERVER = f"{sys.executable} {ROOT / 'tests' / 'replica_server.py'} --port {{port}}"


def _policy(listener: int, replicas: str = "", *, fixed: int = 0) -> str:
    """With ``replicas`` (a ``replicas:`` block) the service runs them, else it is the fixed
    endpoint on port ``fixed``."""
    source = replicas or f"    endpoints: [127.0.0.1:{fixed}]\n"
    return (
        f"listeners: [{{name: edge, port: {listener}}}]\n"
        "services:\n"
        "  - name: model\n"
        "    health_check: {interval: 250ms}\n"
        f"{source}"
        "routes:\n"
        "  - name: all\n"
        "    backends: [{service: model}]\n"
    )


def _replicas(command: str, *, min_: int = 1) -> str:
    return (
        "    replicas:\n"
        f"      command: {command}\n"
        f"      min: {min_}\n"
        "      max: 3\n"
        "      ready_timeout: 20s\n"
        "      drain_timeout: 10s\n"
        "      stop_grace: 5s\n"
    )


@pytest.fixture
async def fixed() -> AsyncIterator[int]:
    """The service's one endpoint before replicas: answers ``{"backend": "fixed"}``."""

    async def answer(_request: web.Request) -> web.Response:
        return web.json_response({"backend": "fixed"})

    runner, port = await start_site(answer_every_path(answer))
    try:
        yield port
    finally:
        await runner.cleanup()


@pytest.fixture
async def gateway(tmp_path: Path, fixed: int) -> AsyncIterator[tuple[Gateway, Path, int]]:
    listener = free_port()
    path = tmp_path / "policy.yaml"
    path.write_text(_policy(listener, fixed=fixed))
    async with running_gateway(path, tmp_path) as gw:
        yield gw, path, listener


def _edit(gw: Gateway, path: Path, text: str) -> None:
    path.write_text(text)
    result = gw.watcher.reload()  # None: the watcher had applied it already
    assert result is None or result.refusal is None, result.refusal


def _ready_ports(gw: Gateway) -> list[int]:
    assert gw.replicas is not None
    return sorted(e.port for e in gw.replicas.endpoints().get("model", ()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_replicas_added_resized_replaced_and_removed_by_edits_without_a_restart(
    gateway: tuple[Gateway, Path, int], fixed: int
) -> None:
    gw, path, listener = gateway
    manager = gw.replicas
    assert manager is not None and manager.status() == ()
    url = f"http://127.0.0.1:{listener}/infer"
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as admin:
            assert (await admin.get(f"{gw.admin.url}/autoscale")).status_code == 404

        async def serves(wanted: set[str]) -> bool:
            """Every port in ``wanted`` answers some of a dozen requests through Envoy."""
            seen = set()
            for _ in range(12):
                response = await client.get(url)
                if response.status_code == 200:
                    seen.add(response.json()["backend"])
            return wanted <= seen

        _edit(gw, path, _policy(listener, _replicas(SERVER)))  # gained replicas:
        first = await poll_until(
            lambda: _ready_ports(gw), timeout=30, what="a replica started by the edit"
        )
        await poll_until(lambda: serves({str(first[0])}), timeout=20, what="Envoy routing to it")

        _edit(gw, path, _policy(listener, _replicas(SERVER, min_=2)))  # resized
        two = await poll_until(
            lambda: len(_ready_ports(gw)) == 2 and _ready_ports(gw), timeout=30, what="2 ready"
        )
        assert first[0] in two, "raising min adds a replica, it does not replace the first"
        await poll_until(lambda: serves({str(p) for p in two}), timeout=20, what="both serving")

        failures: list[str] = []
        loading = True

        async def user() -> None:
            while loading:
                try:
                    response = await client.get(url)
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                    continue
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text[:80]}")

        users = [asyncio.create_task(user()) for _ in range(3)]
        try:  # a new command: every replica replaced, make-before-break
            _edit(gw, path, _policy(listener, _replicas(SERVER + " --delay 0.01", min_=2)))
            await poll_until(
                lambda: len(_ready_ports(gw)) == 2 and not set(_ready_ports(gw)) & set(two),
                timeout=40,
                what="both replicas replaced",
            )
            await poll_until(lambda: _drained_all(gw), timeout=30, what="old replicas stopped")
        finally:
            loading = False
            await asyncio.gather(*users)
        assert failures == []

        pids = [r.pid for s in manager.status() for r in s.replicas if r.pid is not None]
        assert pids
        _edit(gw, path, _policy(listener, fixed=fixed))  # lost replicas:
        await poll_until(lambda: manager.status() == (), timeout=30, what="all retired")
        await poll_until(lambda: serves({"fixed"}), timeout=20, what="the fixed endpoint back")
    assert not any(_alive(pid) for pid in pids)
    assert gw.control_plane.state.replicas.get("model", ()) == ()
    kinds = [e.kind for e in manager.events]
    assert {"configured", "reconfigured", "retired", "drained", "stopped"} <= set(kinds), kinds


def _drained_all(gw: Gateway) -> bool:
    """Exactly the two ready replicas remain: the replaced ones drained and exited."""
    assert gw.replicas is not None
    (status,) = gw.replicas.status()
    return len(status.replicas) == 2 and status.ready == 2
