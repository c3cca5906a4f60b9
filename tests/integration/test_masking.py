"""Masking with real Envoy, the real mask sink and a real OTLP receiver: e-mail addresses,
phone numbers and the policy's own patterns in a request's path, query and headers never
reach the access log file or the spans the collector receives; without ``mask`` the very
same request shows them (so the check can fail)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.envoy_process import free_port
from tests.observability_stack import TracedStack, traced_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CLEAR = ("alice@example.com", "ACC-123456", "+14155550100")
MASK = {"patterns": ["ACC-[0-9]{6}"], "replacement": "[MASKED]"}


async def _line_for(path: Path, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        for line in text.splitlines():
            record = json.loads(line)
            if record.get("request_id") == request_id:
                return record
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{path}: no access log line for request {request_id} after {timeout}s")


async def _leaky_request(stack: TracedStack) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """A request carrying every clear value; its access log line and its Envoy spans'
    attributes."""
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        response = await client.get(
            f"{stack.url}/v2/models/alice@example.com/ready",
            params={"account": "ACC-123456"},
            headers={"user-agent": "tester +14155550100"},
        )
    request_id = response.headers["x-request-id"]
    record = await _line_for(stack.access_log, request_id)
    spans = await stack.flush_and_wait(
        lambda s: any(x.attributes.get("request_id") == request_id for x in s)
    )
    mine = [x.attributes for x in spans if x.attributes.get("request_id") == request_id]
    return request_id, record, mine


async def test_masked_values_never_reach_access_logs_or_spans(tmp_path: Path) -> None:
    mask = {**MASK, "sink": {"port": free_port()}}
    async with traced_stack(tmp_path, sampling_percent=100, mask=mask) as stack:
        _, record, attributes = await _leaky_request(stack)
        assert record["path"] == "/v2/models/[MASKED]/ready"
        assert isinstance(record["response_code"], int) and record["method"] == "GET"
        assert attributes and any("[MASKED]" in str(a.get("http.url", "")) for a in attributes)
        assert any("[MASKED]" in str(a.get("user_agent", "")) for a in attributes)
        logged = stack.access_log.read_text()
        traced = json.dumps([s.attributes for s in stack.receiver.spans()])
        for value in CLEAR:
            assert value not in logged, f"{value} in the access log"
            assert value not in traced, f"{value} in a span"
        assert stack.gateway.mask_sink is not None and stack.gateway.mask_sink.sink is not None
        assert stack.gateway.mask_sink.sink.lines >= 1


async def test_without_mask_the_same_request_logs_and_traces_them(tmp_path: Path) -> None:
    async with traced_stack(tmp_path, sampling_percent=100) as stack:
        _, record, attributes = await _leaky_request(stack)
        assert record["path"] == "/v2/models/alice@example.com/ready"
        traced = json.dumps(attributes)
        assert "ACC-123456" in traced and "+14155550100" in traced
