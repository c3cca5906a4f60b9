"""Envoy's listener cuts slow clients off and refuses an oversized declared body at once
(issue 33, item 4): the policy's ``limits`` (defaults on) become the connection manager's
timeouts and a 413 route. A real Envoy from the translated policy (static bootstrap), raw
sockets on loopback."""

from __future__ import annotations

import asyncio
import time

import pytest

from inferway.policies.loader import load_policy_text
from inferway.resolve.policy import resolve_policy
from inferway.xds.translate import translate
from inferway.xds.translate.validation import build_envoy_validation_bootstrap
from tests.envoy_process import EnvoyProcess, free_port

pytestmark = pytest.mark.integration

POLICY = """
version: 1
listeners:
  - name: ingress
    port: {port}
    limits:
      request_headers_timeout: 1s
      max_request_bytes: 1000
services:
  - name: model
    endpoints: ["127.0.0.1:{backend}"]
routes:
  - name: infer
    match: {{path: {{prefix: /v2/}}}}
    backends: [{{service: model}}]
"""


@pytest.fixture
async def envoy_port():
    port = free_port()
    policy = load_policy_text(POLICY.format(port=port, backend=free_port()))
    bootstrap = build_envoy_validation_bootstrap(translate(resolve_policy(policy)))
    async with EnvoyProcess(bootstrap):
        yield port


async def _exchange(port: int, sent: bytes, limit: float) -> tuple[float, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    writer.write(sent)
    try:
        answer = await asyncio.wait_for(reader.read(65536), limit)
    finally:
        writer.close()
    return time.monotonic() - start, answer


async def test_a_declared_body_above_the_limit_is_413_at_once(envoy_port: int) -> None:
    head = (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000000000000\r\n\r\n"
    )
    took, answer = await _exchange(envoy_port, head, 5)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"limits.max_request_bytes" in answer
    assert took < 2


async def test_a_partial_head_is_cut_off_after_the_headers_timeout(envoy_port: int) -> None:
    took, answer = await _exchange(envoy_port, b"POST /v2/models/m/infer HTTP/1.1\r\nHo", 10)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
    assert 0.9 <= took < 4


def test_the_defaults_are_on_without_a_limits_section() -> None:
    policy = load_policy_text(
        POLICY.format(port=10000, backend=8000).replace(
            "    limits:\n      request_headers_timeout: 1s\n      max_request_bytes: 1000\n", ""
        )
    )
    limits = resolve_policy(policy).listeners[0].limits
    assert limits.request_headers_timeout_s == 10.0
    assert limits.stream_idle_timeout_s == 300.0
    assert limits.request_timeout_s == 300.0
    assert limits.max_request_bytes == 64 * 1024 * 1024
