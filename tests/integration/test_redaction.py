"""Credentials never reach logs: a request carrying ``Authorization: Bearer s3cr3t`` (and an
API key and a policy-named header) through a real Envoy with JSON access logging leaves no
trace of them in the access log or Envoy's log; the translated access-log format and trace
tags read none of the redacted headers; inferway's own log lines are scrubbed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferway._xds_protos.envoy.extensions.access_loggers.file.v3 import file_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.gateway.runtime import GatewayOptions, start_gateway
from inferway.observability.redaction import REDACTED, RedactingFilter, redact_text
from inferway.policies import PolicyError, load_policy_text
from inferway.resolve import resolve_policy
from inferway.xds import type_urls
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.translate import translate
from inferway.xds.translate.redaction import header_reads
from tests.envoy_process import EnvoyProcess, free_port
from tests.security_helpers import poll_until, start_echo_backend

pytestmark = pytest.mark.integration

SECRETS = {"authorization": "Bearer s3cr3t", "x-api-key": "k3y-0f-d00m", "x-tenant-token": "t0k"}


def policy_text(listener_port: int, backend_port: int, log_path: Path) -> str:
    return f"""
version: 1
listeners: [{{name: edge, port: {listener_port}}}]
services: [{{name: models, endpoints: ["127.0.0.1:{backend_port}"]}}]
routes: [{{name: infer, backends: [{{service: models}}]}}]
redact_headers: [X-Tenant-Token]
observability:
  tracing: {{collector: "127.0.0.1:4317"}}
  access_log:
    path: {log_path}
    extra_fields: {{user_agent: "%REQ(USER-AGENT)%"}}
"""


def managers(policy_yaml: str) -> Iterator[hcm_pb2.HttpConnectionManager]:
    resources = translate(resolve_policy(load_policy_text(policy_yaml, "p.yaml")))
    for listener in resources.of_type(type_urls.LISTENER).values():
        for chain in listener.filter_chains:  # type: ignore[attr-defined]
            for network_filter in chain.filters:
                manager = hcm_pb2.HttpConnectionManager()
                if network_filter.typed_config.Unpack(manager):
                    yield manager


def test_translated_log_format_and_trace_tags_read_no_redacted_header(tmp_path: Path) -> None:
    text = policy_text(10000, 8000, tmp_path / "access.log")
    redacted = resolve_policy(load_policy_text(text, "p.yaml")).redacted_headers
    assert {"authorization", "cookie", "x-api-key", "x-tenant-token"} <= set(redacted)
    checked = 0
    for manager in managers(text):
        for log in manager.access_log:
            config = file_pb2.FileAccessLog()
            assert log.typed_config.Unpack(config)
            for key, value in config.log_format.json_format.fields.items():
                assert not set(header_reads(value.string_value)) & set(redacted), key
                checked += 1
        assert manager.HasField("tracing")
        for tag in manager.tracing.custom_tags:
            if tag.HasField("request_header"):
                assert tag.request_header.name.lower() not in redacted
    assert checked > 5


def test_access_log_field_reading_a_redacted_header_is_refused(tmp_path: Path) -> None:
    text = policy_text(10000, 8000, tmp_path / "a.log").replace(
        "%REQ(USER-AGENT)%", "%REQ(X-Tenant-Token)%"
    )
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    assert any("x-tenant-token" in str(issue) for issue in caught.value.issues)


async def test_request_with_credentials_leaves_no_trace_in_envoy_logs(tmp_path: Path) -> None:
    backend = await start_echo_backend()
    listener_port = free_port()
    log_path = tmp_path / "access.log"
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(policy_text(listener_port, backend.port, log_path), encoding="utf-8")
    running = await start_gateway(
        GatewayOptions(policy_path=policy_path, xds_port=0, admin_port=0, with_envoy=False)
    )
    envoy = EnvoyProcess(
        build_bootstrap(node_id="redaction-node", xds_port=running.xds.port, admin_port=0),
        log_level="info",
    )
    try:
        await envoy.start()
        async with httpx.AsyncClient(timeout=5.0) as client:
            url = f"http://127.0.0.1:{listener_port}/v2/models/m/infer"

            async def served() -> bool:
                try:
                    response = await client.get(url, headers=SECRETS)
                except httpx.HTTPError:
                    return False
                return response.status_code == 200

            await poll_until(served, timeout=15, what="a request served through Envoy")
        lines = await poll_until(
            lambda: [x for x in _read(log_path).splitlines() if '"/v2/models/m/infer"' in x],
            timeout=15,
            what="the access log line of the request",
        )
        assert json.loads(lines[0])["route"] == "infer"
        assert backend.seen[-1]["authorization"] == "Bearer s3cr3t"  # it did travel through
        everything = _read(log_path) + envoy.log_text()
        for secret in ("s3cr3t", "k3y-0f-d00m", "t0k"):
            assert secret not in everything
    finally:
        envoy.stop()
        await running.stop()
        await backend.stop()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def test_inferway_log_lines_are_scrubbed() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter(["x-tenant-token"]))
    logger = logging.getLogger("inferway.test_redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("upstream refused: headers=%s", dict(SECRETS, host="a"))
        logger.warning("Authorization: Bearer s3cr3t")
        try:
            raise ValueError("bad x-api-key=k3y-0f-d00m")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    output = stream.getvalue()
    for secret in ("s3cr3t", "k3y-0f-d00m", "t0k"):
        assert secret not in output
    assert output.count(REDACTED) >= 4
    assert "'host': 'a'" in output


def test_redact_text_keeps_unrelated_text() -> None:
    assert redact_text("GET /v2/models 200 in 3 ms") == "GET /v2/models 200 in 3 ms"
    assert redact_text("no-authorization-here: fine") == "no-authorization-here: fine"
