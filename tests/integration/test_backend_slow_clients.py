"""Slow clients are cut off (issue 33, item 4): a request head or body sent partly and then
nothing, or a keep-alive connection left idle, is closed after ``serve``'s header, body and
idle timeouts (408 where a request was being sent), instead of being held forever. Real
backend, raw sockets on loopback, short timeouts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from inferway.backends.serving.settings import ServingSettings
from inferway.devtools.demo_models import build_add
from tests.backend_helpers import running_backend

pytestmark = pytest.mark.integration

HEADER_S = 0.5
BODY_S = 0.6
IDLE_S = 0.8
BODY = b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}'


async def _backend(tmp_path: Path, frontend: str):
    build_add(tmp_path / "add" / "1" / "model.onnx")
    settings = ServingSettings(
        http_frontend=frontend,
        header_timeout_s=HEADER_S,
        body_timeout_s=BODY_S,
        idle_timeout_s=IDLE_S,
    )
    return running_backend(tmp_path, settings=settings)


async def _closed_after(port: int, sent: bytes, limit: float) -> tuple[float, bytes]:
    """Send ``sent`` and nothing more; seconds until the server answered or closed, and what
    it said (aiohttp then lingers a while reading what is left of a body before it closes,
    as it does after any early answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    writer.write(sent)
    try:
        answer = await asyncio.wait_for(reader.read(65536), limit)
    finally:
        writer.close()
    return time.monotonic() - start, answer


@pytest.mark.parametrize("frontend", ["fast"])
async def test_a_partial_head_is_cut_off_with_408(tmp_path: Path, frontend: str) -> None:
    async with await _backend(tmp_path, frontend) as backend:
        took, answer = await _closed_after(
            backend.http_port, b"POST /v2/models/add/infer HTTP/1.1\r\nHost: t\r\nContent-Le", 10
        )
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"too slowly" in answer
    assert HEADER_S <= took < HEADER_S + 2


@pytest.mark.parametrize("frontend", ["fast", "aiohttp"])
async def test_a_partial_body_is_cut_off_with_408(tmp_path: Path, frontend: str) -> None:
    head = (
        "POST /v2/models/add/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY) + 100}\r\n\r\n"
    ).encode()
    async with await _backend(tmp_path, frontend) as backend:
        took, answer = await _closed_after(backend.http_port, head + BODY, 10)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert BODY_S <= took < BODY_S + 2


@pytest.mark.parametrize("frontend", ["fast", "aiohttp"])
async def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path, frontend: str) -> None:
    async with await _backend(tmp_path, frontend) as backend:
        took, answer = await _closed_after(backend.http_port, b"", 10)
    assert answer == b""
    assert IDLE_S <= took < IDLE_S + 2


def test_the_defaults_bound_every_phase() -> None:
    settings = ServingSettings()
    assert settings.header_timeout_s == 10.0
    assert settings.body_timeout_s == 60.0
    assert settings.idle_timeout_s == 75.0
    with pytest.raises(ValueError, match="header_timeout_s must be a finite number"):
        ServingSettings(header_timeout_s=float("inf"))
