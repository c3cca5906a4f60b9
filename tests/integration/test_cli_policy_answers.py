"""Commands answer in words, never with a traceback or a silently wrong value (issue 33,
items 7, 8 and 9, policy side): ``render --out`` to a path that cannot be written, a port
number above 65535, and ``scale status`` on a gateway without an autoscaler (0 with a clear
message, as ``rollout status`` with no rollouts); and ``scale status`` says why replicas are
not ready (item 10)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferway.cli.main import app
from inferway.exit_codes import EXIT_CANNOT_START, EXIT_USAGE
from inferway.gateway.admin_security import ADMIN_TOKEN_ENV
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from tests.envoy_process import free_port
from tests.helpers import poll_until

pytestmark = pytest.mark.integration

POLICY = """\
version: 1
listeners: [{{name: edge, port: {port}}}]
services: [{{name: s, endpoints: ["127.0.0.1:9"]}}]
routes: [{{name: r, backends: [{{service: s}}]}}]
"""


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(port=free_port()), encoding="utf-8")
    options = GatewayOptions(
        policy_path=policy, xds_port=0, admin_port=0, with_envoy=False, workdir=tmp_path / "w"
    )
    running = await start_gateway(options)
    try:
        yield running
    finally:
        await running.stop()


def test_render_to_an_unwritable_path_is_a_message(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(port=10080), encoding="utf-8")
    result = CliRunner().invoke(app, ["render", "-f", str(policy), "--out", "/proc/x/y"])
    assert result.exit_code == EXIT_CANNOT_START, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "cannot write /proc/x/y: No such file or directory" in result.output


@pytest.mark.parametrize("option", ["--admin-port", "--xds-port", "--envoy-admin-port"])
@pytest.mark.parametrize("value", ["70000", "-1"])
def test_run_refuses_a_port_out_of_range(tmp_path: Path, option: str, value: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(port=10080), encoding="utf-8")
    result = CliRunner().invoke(app, ["run", "-f", str(policy), option, value])
    assert result.exit_code == EXIT_USAGE, result.output
    flat = " ".join(result.output.replace("│", " ").split())
    assert f"Invalid value for '{option}'" in flat, flat


async def test_scale_status_without_an_autoscaler_is_0_with_a_message(gateway: Gateway) -> None:
    runner = CliRunner()
    text = await asyncio.to_thread(
        runner.invoke, app, ["scale", "status", "--admin", gateway.admin.url]
    )
    assert text.exit_code == 0, text.output
    assert "no autoscaler: no service of the gateway has replicas: or autoscale:" in text.output
    as_json = await asyncio.to_thread(
        runner.invoke, app, ["scale", "status", "--admin", gateway.admin.url, "-o", "json"]
    )
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == {"services": [], "decisions": []}


REPLICAS_POLICY = """\
version: 1
listeners: [{{name: edge, port: {port}}}]
services:
  - name: fixed
    replicas:
      command: {missing} serve --http-port {{port}}
      backoff: {{initial: 0.2s, max: 0.2s, give_up_after: 2}}
  - name: scaled
    replicas:
      command: {python} -c "import sys; sys.exit(3)" {{port}}
      max: 2
      backoff: {{initial: 30s, max: 30s, give_up_after: 5}}
    autoscale:
      metric: in_flight
      target: 4
routes:
  - {{name: a, match: {{path: {{prefix: /a}}}}, backends: [{{service: fixed}}]}}
  - {{name: b, backends: [{{service: scaled}}]}}
"""


async def test_scale_status_says_why_replicas_are_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33 item 10: "0 ready of 1 desired" came without why. Now each replica that is not
    ready says so with the replica manager's reason (a command that cannot run, an exit
    code), in text and in ``-o json``; a service with replicas: and no autoscale: shows too."""
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    missing = tmp_path / "no-such-inferway"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        REPLICAS_POLICY.format(port=free_port(), missing=missing, python=sys.executable),
        encoding="utf-8",
    )
    options = GatewayOptions(
        policy_path=policy, xds_port=0, admin_port=0, with_envoy=False, workdir=tmp_path / "w"
    )
    gateway = await start_gateway(options)
    runner = CliRunner()
    try:
        assert gateway.replicas is not None

        def failed() -> bool:
            states = {
                s.service: [r.state.value for r in s.replicas] for s in gateway.replicas.status()
            }
            return states.get("fixed") == ["failed"] and states.get("scaled") == ["waiting"]

        await poll_until(failed, timeout=30, what="both services' replicas failed to start")
        text = await asyncio.to_thread(
            runner.invoke, app, ["scale", "status", "--admin", gateway.admin.url]
        )
        as_json = await asyncio.to_thread(
            runner.invoke, app, ["scale", "status", "--admin", gateway.admin.url, "-o", "json"]
        )
    finally:
        await gateway.stop()
    assert text.exit_code == 0, text.output
    flat = " ".join(text.output.split())
    assert "fixed replicas 0 ready of 1 desired (min 1, max 1)" in flat, flat
    assert (
        "not ready: replica 0 failed: given up after 2 failures in a row (an edit of its "
        f"replicas: section tries again); last error: cannot run '{missing}'"
    ) in flat, flat
    assert "scaled proportional on in_flight 0 ready of 1 desired" in flat, flat
    assert "not ready: replica 0 waiting to start in " in flat, flat
    assert "after 1 failure; last error: exited (3) before ready" in flat, flat
    document = json.loads(as_json.stdout)
    by_service = {s["service"]: s for s in document["replicas"]["services"]}
    (fixed,) = by_service["fixed"]["not_ready"]
    assert fixed.startswith("replica 0 failed: given up after 2 failures") and str(missing) in fixed
    (scaled,) = by_service["scaled"]["not_ready"]
    assert "last error: exited (3) before ready" in scaled
