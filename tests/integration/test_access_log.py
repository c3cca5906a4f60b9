"""Envoy's JSON access log: one valid JSON line per request, carrying the request id the client
got back and the trace id of the request's trace; credentials never appear."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from inferway.devtools.trace_tree import find_trace_id
from inferway.xds.translate.access_log import ACCESS_LOG_FIELDS
from tests.observability_stack import traced_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def _log_lines(path, count: int, timeout: float = 10.0) -> list[str]:
    """Poll the file until it holds ``count`` lines (Envoy flushes file logs every second)."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) >= count:
            return lines
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: {len(lines)} of {count} access log lines after {timeout}s")
        await asyncio.sleep(0.1)


async def test_access_log_lines_are_json_with_request_and_trace_ids(tmp_path) -> None:
    async with traced_stack(tmp_path, sampling_percent=100) as stack:
        headers = {"authorization": "Bearer sk-very-secret", "x-api-key": "key-very-secret"}
        async with httpx.AsyncClient(timeout=10, trust_env=False, headers=headers) as client:
            responses = [await stack.post_infer(client) for _ in range(3)]
            missing = await client.get(f"{stack.url}/nowhere?token=query-secret")
        assert all(r.status_code == 200 for r in responses)
        assert missing.status_code == 404

        lines = await _log_lines(stack.access_log, 4)
        records = [json.loads(line) for line in lines]  # every line is valid JSON
        assert all(set(ACCESS_LOG_FIELDS) <= set(r) for r in records)
        by_id = {r["request_id"]: r for r in records}
        spans = await stack.flush_and_wait(
            lambda s: all(find_trace_id(s, r.headers["x-request-id"]) for r in responses)
        )
        for response in responses:
            record = by_id[response.headers["x-request-id"]]
            assert record["trace_id"] == find_trace_id(spans, response.headers["x-request-id"])
            assert record["route"] == "http-inference"
            assert record["upstream_cluster"] == "model-http"
            assert record["upstream_host"] == f"127.0.0.1:{stack.backend.http_port}"
            assert int(record["response_code"]) == 200
            assert record["method"] == "POST" and record["path"] == "/v2/models/demo/infer"
            assert int(record["bytes_received"]) > 0 and int(record["bytes_sent"]) > 0
            assert int(record["duration_ms"]) >= 0
        not_found = by_id[missing.headers["x-request-id"]]
        assert int(not_found["response_code"]) == 404 and not_found["response_flags"] == "NR"
        assert not_found["path"] == "/nowhere"  # the query string is never logged
        text = stack.access_log.read_text()
        assert "very-secret" not in text and "query-secret" not in text
