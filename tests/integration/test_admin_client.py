"""The CLI's ``AdminClient`` against the real admin API over HTTP: each document comes back as
the server built it (the same typed record, equal to the server's own function), commands
carry the token, and every failure is an ``AdminError`` with the message and the exit code
docs/cli.md gives (1 refused, 2 profiling failed, 3 unreachable or not the admin API)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from inferway.cli.admin_client import AdminClient, AdminError, admin_token
from inferway.exit_codes import EXIT_INVALID, EXIT_UNREACHABLE
from inferway.gateway.admin import AdminServer, build_admin_app, build_status, start_admin_server
from inferway.gateway.admin_documents import ADMIN_TOKEN_ENV
from inferway.gateway.admin_security import READS_NEED_TOKEN
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.rollouts.admin_routes import add_rollout_routes
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.rollouts.store import RolloutStore
from inferway.policies import load_policy_text
from inferway.xds.cache import SnapshotCache
from tests.envoy_process import free_port

pytestmark = pytest.mark.integration

POLICY = """version: 1
listeners: [{name: edge, port: 18083}]
services:
  - {name: v1, endpoints: ["127.0.0.1:1"]}
  - {name: v2, endpoints: ["127.0.0.1:2"]}
routes:
  - name: inference
    backends: [{service: v1, weight: 100}, {service: v2, weight: 0}]
rollouts:
  - {name: r, route: inference, stable: v1, canary: v2, steps: [10, 100]}
"""


class _Nothing:
    async def sample(self) -> None:
        return None


@dataclass
class _Admin:
    plane: ControlPlane
    driver: RolloutDriver
    server: AdminServer


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[_Admin]:
    policy = load_policy_text(POLICY, "p.yaml")
    plane = ControlPlane(SnapshotCache())
    driver = RolloutDriver(plane, RolloutStore(tmp_path), lambda c: _Nothing())
    plane.add_observer(driver)
    plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))
    app = build_admin_app(plane, token="secret")
    add_rollout_routes(app, driver)
    server = await start_admin_server(app, port=0)
    try:
        yield _Admin(plane, driver, server)
    finally:
        await server.stop()


async def test_documents_come_back_as_the_server_built_them(admin: _Admin) -> None:
    client = AdminClient(admin.server.url + "/")  # a trailing slash is fine
    status = await asyncio.to_thread(client.status)
    served = status.pop("served_weights")  # added by the handler: what each group is served
    assert served == {}  # no Envoy connected here
    assert status == build_status(admin.plane)
    assert status["policy"] is not None and status["policy"]["source"] == "p.yaml"
    listed = await asyncio.to_thread(client.rollouts)
    assert listed == [admin.driver.status("r", history=0)]
    one = await asyncio.to_thread(client.rollout, "r")
    assert one == admin.driver.status("r")
    assert one["name"] == "r" and one["phase"] == "waiting" and one["steps"] == [10, 100]


async def test_a_command_needs_the_token_and_returns_the_decision(admin: _Admin) -> None:
    refused = AdminClient(admin.server.url)
    with pytest.raises(AdminError) as no_token:
        await asyncio.to_thread(refused.rollout_command, "r", "restart")
    assert no_token.value.exit_code == EXIT_INVALID
    assert str(no_token.value).startswith("restart r: HTTP 401: ")
    client = AdminClient(admin.server.url, token="secret")
    answer = await asyncio.to_thread(client.rollout_command, "r", "restart")
    assert answer["decision"]["action"] == "start"  # a restart starts over
    assert answer["status"] == admin.driver.status("r")
    assert answer["status"]["phase"] == "progressing"
    with pytest.raises(AdminError) as refused_now:
        await asyncio.to_thread(client.rollout_command, "r", "resume")
    assert refused_now.value.exit_code == EXIT_INVALID
    assert (
        str(refused_now.value) == "resume r: HTTP 409: rollout 'r': cannot resume while progressing"
    )


async def test_refusals_and_wrong_servers_are_admin_errors(admin: _Admin) -> None:
    client = AdminClient(admin.server.url)
    with pytest.raises(AdminError) as unknown:
        await asyncio.to_thread(client.rollout, "nope")
    assert unknown.value.exit_code == EXIT_INVALID
    assert "HTTP 404" in str(unknown.value) and "rollouts: r" in str(unknown.value)
    with pytest.raises(AdminError) as no_autoscaler:  # this gateway has no /autoscale
        await asyncio.to_thread(client.autoscale)
    assert no_autoscaler.value.exit_code == EXIT_INVALID
    assert "no autoscaler" in str(no_autoscaler.value)
    elsewhere = AdminClient(admin.server.url + "/not-the-admin-api")
    with pytest.raises(AdminError) as not_admin:
        await asyncio.to_thread(elsewhere.status)
    assert not_admin.value.exit_code == EXIT_UNREACHABLE
    assert str(not_admin.value).endswith("/not-the-admin-api/status answered HTTP 404")
    assert await asyncio.to_thread(elsewhere.rollouts, missing_ok=True) == []


async def test_an_answer_that_is_not_json_is_not_the_admin_api() -> None:
    async def text(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/status", text)
    app.router.add_get("/rollouts", text)
    server = await start_admin_server(app, port=0)
    try:
        client = AdminClient(server.url)
        with pytest.raises(AdminError) as status:
            await asyncio.to_thread(client.status)
        assert str(status.value) == f"{server.url}/status did not answer JSON"
        with pytest.raises(AdminError) as rollouts:
            await asyncio.to_thread(client.rollouts)
        assert "did not answer JSON: is it the admin API?" in str(rollouts.value)
        assert status.value.exit_code == rollouts.value.exit_code == EXIT_UNREACHABLE
    finally:
        await server.stop()


def test_nothing_listening_is_unreachable_with_a_hint_for_status() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(AdminError) as status:
        AdminClient(url, timeout=2).status()
    assert status.value.exit_code == EXIT_UNREACHABLE
    assert str(status.value).startswith(f"cannot reach the inferway admin API at {url}/status: ")
    assert "Is `inferway run` running" in str(status.value)
    with pytest.raises(AdminError) as profile:
        AdminClient(url, timeout=2).profile({"target": "gateway"}, seconds=1)
    assert str(profile.value).startswith(f"admin API {url}/profile unreachable: ")


def test_the_token_comes_from_the_file_else_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n", encoding="utf-8")
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "from-env")
    assert admin_token(token_file, needed_for="x needs") == "from-file"
    assert admin_token(None, needed_for="x needs") == "from-env"
    monkeypatch.delenv(ADMIN_TOKEN_ENV)
    with pytest.raises(AdminError, match=r"^x needs the admin token: --token-file FILE or \$"):
        admin_token(None, needed_for="x needs")
    with pytest.raises(AdminError, match="cannot read --token-file"):
        admin_token(tmp_path / "missing", needed_for="x needs")


async def test_reads_carry_the_token_where_the_admin_api_wants_one(
    admin: _Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    guarded = build_admin_app(admin.plane, token="secret")
    guarded[READS_NEED_TOKEN] = True  # as when it binds a non-loopback address
    server = await start_admin_server(guarded, port=0)
    try:
        monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
        with pytest.raises(AdminError) as refused:
            await asyncio.to_thread(AdminClient(server.url).status)
        assert "401" in str(refused.value)
        monkeypatch.setenv(ADMIN_TOKEN_ENV, "secret")
        status = await asyncio.to_thread(AdminClient(server.url).status)
        assert status["policy"] is not None
        status = await asyncio.to_thread(AdminClient(server.url, token="secret").status)
        assert status["policy"] is not None
    finally:
        await server.stop()
