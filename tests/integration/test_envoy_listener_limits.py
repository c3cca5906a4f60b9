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


SLOW_BODY_POLICY = """
version: 1
listeners:
  - name: ingress
    port: {port}
    limits:
      stream_idle_timeout: 1s
      request_timeout: 3s
services:
  - name: model
    endpoints: ["127.0.0.1:{backend}"]
routes:
  - name: infer
    match: {{path: {{prefix: /v2/}}}}
    backends: [{{service: model}}]
"""


@pytest.fixture
async def silent_backend_envoy_port():
    """Envoy in front of a backend that accepts and reads but never answers: only the
    listener's own limits can end a request whose body stops coming."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    backend = await asyncio.start_server(swallow, "127.0.0.1", 0)
    backend_port = backend.sockets[0].getsockname()[1]
    port = free_port()
    policy = load_policy_text(SLOW_BODY_POLICY.format(port=port, backend=backend_port))
    bootstrap = build_envoy_validation_bootstrap(translate(resolve_policy(policy)))
    try:
        async with EnvoyProcess(bootstrap):
            yield port
    finally:
        backend.close()


_PARTIAL = (
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n"
)


async def test_a_body_sent_partly_then_nothing_is_cut_off_after_the_stream_idle_timeout(
    silent_backend_envoy_port: int,
) -> None:
    """Issue 33 item 4, the body half on the Envoy listener: ten bytes of a hundred, then
    silence -> 408 once ``stream_idle_timeout`` (1 s) passes, not a connection held open."""
    took, answer = await _exchange(silent_backend_envoy_port, _PARTIAL + b'{"inputs":', 10)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 0.9 <= took < 3, took


async def test_a_body_trickled_in_is_cut_off_after_the_request_timeout(
    silent_backend_envoy_port: int,
) -> None:
    """A byte every 0.5 s keeps the stream from idling; ``request_timeout`` (3 s) bounds the
    whole request all the same."""
    reader, writer = await asyncio.open_connection("127.0.0.1", silent_backend_envoy_port)
    start = time.monotonic()
    writer.write(_PARTIAL)
    answer = b""
    try:
        for _ in range(40):  # 20 s of trickling at most; the body never completes
            writer.write(b" ")
            await writer.drain()
            try:
                answer = await asyncio.wait_for(reader.read(65536), 0.5)
            except TimeoutError:
                continue
            break
    finally:
        writer.close()
    took = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 2.9 <= took < 6, took
