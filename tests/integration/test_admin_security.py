"""The admin API's hardening on a real gateway (control plane only, real HTTP on loopback):
loopback by default, a bearer token for state changes (401 without), 413 for big bodies, 400
for malformed JSON, reads (and ``inferway status``) open."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from inferway.cli.admin_client import AdminClient
from inferway.gateway.admin_security import (
    ADMIN_TOKEN_ENV,
    MAX_BODY_BYTES,
    is_loopback,
    resolve_admin_token,
)
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from tests.envoy_process import free_port

pytestmark = pytest.mark.integration

POLICY = """
listeners: [{{name: edge, port: {port}}}]
services: [{{name: s, endpoints: ["127.0.0.1:9"]}}]
routes: [{{name: r, timeout: {timeout}, backends: [{{service: s}}]}}]
"""


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(port=free_port(), timeout="15s"))
    options = GatewayOptions(
        policy_path=policy, xds_port=0, admin_port=0, with_envoy=False, workdir=tmp_path / "work"
    )
    running = await start_gateway(options)
    try:
        yield running
    finally:
        await running.stop()


def token_of(gateway: Gateway) -> str:
    assert gateway.options.workdir is not None
    return (gateway.options.workdir / "admin-token").read_text().strip()


async def test_admin_binds_loopback_and_generates_a_private_token(gateway: Gateway) -> None:
    assert gateway.admin.host == "127.0.0.1"
    assert gateway.options.workdir is not None
    path = gateway.options.workdir / "admin-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token_of(gateway)) >= 32


async def test_reload_without_or_with_a_wrong_token_is_401(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.admin.url, timeout=5) as client:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": token_of(gateway)}):
            response = await client.post("/reload", headers=headers)
            assert response.status_code == 401, headers
            assert "needs 'Authorization: Bearer <admin token>'" in response.json()["error"]
            assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_reads_stay_open_and_inferway_status_works(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.admin.url, timeout=5) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/policy")).status_code == 200
    document = await _to_thread(AdminClient(gateway.admin.url).status)
    assert document["policy"]["version"] == gateway.control_plane.version
    assert document["xds_refused"] == []


async def test_reload_with_the_token_applies_the_edited_file(gateway: Gateway) -> None:
    auth = {"Authorization": f"Bearer {token_of(gateway)}"}
    before = gateway.control_plane.version
    async with httpx.AsyncClient(base_url=gateway.admin.url, timeout=5) as client:
        unchanged = await client.post("/reload", headers=auth)
        assert unchanged.status_code == 200
        assert unchanged.json() == {"changed": False, "version": before}

        text = gateway.options.policy_path.read_text().replace("timeout: 15s", "timeout: 7s")
        gateway.options.policy_path.write_text(text)
        applied = await client.post("/reload", headers=auth, json={"force": True})
        assert applied.status_code == 200
        assert applied.json() == {"changed": True, "version": gateway.control_plane.version}
        assert gateway.control_plane.version != before

        gateway.options.policy_path.write_text(text.replace("timeout: 7s", "timeout: -1s"))
        refused = await client.post("/reload", headers=auth, json={"force": True})
        assert refused.status_code == 422
        assert "timeout" in " ".join(refused.json()["refused"])


async def test_malformed_or_unknown_json_is_400(gateway: Gateway) -> None:
    auth = {"Authorization": f"Bearer {token_of(gateway)}"}
    async with httpx.AsyncClient(base_url=gateway.admin.url, timeout=5) as client:
        bad = await client.post("/reload", headers=auth, content=b"{not json")
        assert bad.status_code == 400
        assert bad.json()["error"].startswith("malformed JSON body")
        for body in (b"[1, 2]", b'{"forse": true}', b'{"force": "yes"}'):
            response = await client.post("/reload", headers=auth, content=body)
            assert response.status_code == 400, body
            assert response.json()["error"]


async def test_oversized_body_is_413(gateway: Gateway) -> None:
    auth = {"Authorization": f"Bearer {token_of(gateway)}"}
    async with httpx.AsyncClient(base_url=gateway.admin.url, timeout=5) as client:
        big = b"{" + b" " * (MAX_BODY_BYTES + 10) + b"}"
        response = await client.post("/reload", headers=auth, content=big)
        assert response.status_code == 413
        assert "larger than" in response.json()["error"]


def test_token_sources_in_order(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert resolve_admin_token(token_file=token_file, workdir=tmp_path, environ={})[0] == (
        "from-file"
    )
    env = {ADMIN_TOKEN_ENV: "from-env"}
    assert resolve_admin_token(token_file=None, workdir=tmp_path, environ=env)[0] == "from-env"
    generated, where = resolve_admin_token(token_file=None, workdir=tmp_path / "w", environ={})
    assert where.endswith("admin-token")
    again, _ = resolve_admin_token(token_file=None, workdir=tmp_path / "w", environ={})
    assert again == generated
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(OSError, match="is empty"):
        resolve_admin_token(token_file=tmp_path / "empty", workdir=tmp_path, environ={})


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")


async def _to_thread(fn, *args):  # type: ignore[no-untyped-def]
    import asyncio

    return await asyncio.to_thread(fn, *args)


@pytest.fixture
async def exposed_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    """An admin API bound to every address (reached here over loopback only)."""
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(port=free_port(), timeout="15s"))
    options = GatewayOptions(
        policy_path=policy,
        xds_port=0,
        admin_port=0,
        admin_address="0.0.0.0",
        with_envoy=False,
        workdir=tmp_path / "work",
    )
    running = await start_gateway(options)
    try:
        yield running
    finally:
        await running.stop()


async def test_off_loopback_reads_need_the_token_but_probes_stay_open(
    exposed_gateway: Gateway,
) -> None:
    url = f"http://127.0.0.1:{exposed_gateway.admin.port}"
    auth = {"Authorization": f"Bearer {token_of(exposed_gateway)}"}
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        for path in ("/status", "/policy", "/rollouts", "/autoscale", "/envoy/stats/prometheus"):
            response = await client.get(path)
            assert response.status_code == 401, path
            assert "binds a non-loopback address" in response.json()["error"]
            assert (
                await client.get(path, headers={"Authorization": "Bearer no"})
            ).status_code == 401
            assert (await client.get(path, headers=auth)).status_code != 401, path
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        status = await client.get("/status", headers=auth)
        assert status.json()["policy"]["version"] == exposed_gateway.control_plane.version
