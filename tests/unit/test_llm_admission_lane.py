"""The request lane (``llm.transport: http``) without Envoy: the LLM processor behind its
reports port on loopback, asked as Envoy's Lua filter asks (``POST /inferway/llm/admit``
with the forwarded headers and the whole body). The answer routes (the served model,
percent-encoded; the stream's id; whether the usage chunk is dropped; the rewritten body),
refuses with the client's status, body and ``Retry-After``, or lets a request of another
prefix go. A request the access log closes is recorded from the filter's metadata, once. A
request Envoy admitted itself is registered by its notice, which a report may overtake."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from hashlib import sha256
from urllib.parse import unquote

import pytest
from prometheus_client import CollectorRegistry

from inferway.gateway.llm import processor as processor_module
from inferway.gateway.llm.exchange import LlmSettings
from inferway.gateway.llm.limits import LimitSpec, MemoryBudgetStore, TokenBudget
from inferway.gateway.llm.metrics import LlmMetrics
from inferway.gateway.llm.processor import LlmProcessor
from inferway.gateway.llm.report_lane import ReportLane
from inferway.xds.translate.llm_local_admit import NOTICE_PATH
from inferway.xds.translate.llm_stream import (
    ADMIT_PATH,
    ANSWER_DROP_USAGE,
    ANSWER_ID,
    ANSWER_MODEL,
    ANSWER_REFUSAL,
    ANSWER_REWRITTEN,
    FORWARDED_KEY,
    FORWARDED_NO_BODY,
    FORWARDED_PATH,
    REPORT_PATH,
)

pytestmark = pytest.mark.asyncio

MODELS = {"served model/ü": "served model/ü", "alias": "served model/ü"}


def _processor(limit: int | None = None) -> LlmProcessor:
    budget = None
    if limit is not None:
        budget = TokenBudget([LimitSpec("tokens_per_minute", limit)], MemoryBudgetStore())
    settings = LlmSettings(models=MODELS, budget=budget)
    return LlmProcessor(LlmMetrics(CollectorRegistry()), settings)


@pytest.fixture
async def lane() -> AsyncIterator[tuple[ReportLane, LlmProcessor]]:
    processor = _processor(limit=10)
    started = await ReportLane(
        "127.0.0.1", 0, processor.report, processor.admit_http, processor.notice
    ).start()
    try:
        yield started, processor
    finally:
        await started.stop()


async def _ask(
    port: int, body: bytes | None, headers: dict[str, str], path: str = ADMIT_PATH
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection, as the Lua filter's ``httpCall``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [f"POST {path} HTTP/1.1", "host: reports", f"content-length: {len(body or b'')}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is None:
            lines.append(f"{FORWARDED_NO_BODY}: 1")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode("latin-1")
        status_line, *header_lines = head.strip().split("\r\n")
        answer = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        content = await reader.readexactly(int(answer["content-length"]))
        return int(status_line.split()[1]), answer, content
    finally:
        writer.close()


def _chat(model: str, **extra: object) -> bytes:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    ).encode()


async def test_an_alias_streamed_without_usage_is_routed_rewritten_and_tagged(
    lane: tuple[ReportLane, LlmProcessor],
) -> None:
    reports, _ = lane
    forwarded = {FORWARDED_PATH: "/v1/chat/completions"}
    status, answer, body = await _ask(reports.port, _chat("alias", stream=True), forwarded)
    assert status == 200
    assert unquote(answer[ANSWER_MODEL]) == "served model/ü", "percent-encoded, any character"
    assert answer[ANSWER_ID] and answer[ANSWER_DROP_USAGE] == "1"
    assert answer[ANSWER_REWRITTEN] == "1"
    rewritten = json.loads(body)
    assert rewritten["model"] == "served model/ü"
    assert rewritten["stream_options"] == {"include_usage": True}
    # a client that asked for usage, under its own model name: its body goes untouched
    plain = _chat("served model/ü", stream=True, stream_options={"include_usage": True})
    status, answer, body = await _ask(reports.port, plain, forwarded)
    assert (status, answer[ANSWER_DROP_USAGE], answer[ANSWER_REWRITTEN], body) == (
        200,
        "0",
        "0",
        b"",
    )


async def test_refusals_carry_the_clients_status_body_and_reason(
    lane: tuple[ReportLane, LlmProcessor],
) -> None:
    reports, processor = lane
    chat = {FORWARDED_PATH: "/v1/chat/completions"}
    for body, headers, expected, code in (
        (b"{not json", chat, 400, "invalid_json"),
        (_chat("nobody-serves-it"), chat, 404, "model_not_found"),
        (None, chat, 400, "missing_body"),
    ):
        status, answer, content = await _ask(reports.port, body, headers)
        assert (status, answer[ANSWER_REFUSAL]) == (expected, code)
        assert json.loads(content)["error"]["code"] == code
    # a client key's limit: used up by a recorded request, the next is refused with 429
    keyed = {**chat, FORWARDED_KEY: "sk-1"}
    status, answer, _ = await _ask(reports.port, _chat("alias"), keyed)
    assert status == 200
    final = {"id": answer[ANSWER_ID], "final": True, "status": 200, "sse": False}
    usage = {"usage": {"prompt_tokens": 8, "completion_tokens": 4}}
    report = (json.dumps(final) + "\n" + json.dumps(usage)).encode()
    status, _, _ = await _ask(reports.port, report, {}, path=REPORT_PATH)
    assert status == 200 and processor.requests == 4
    status, answer, content = await _ask(reports.port, _chat("alias"), keyed)
    assert status == 429 and answer[ANSWER_REFUSAL] == "tokens_per_minute"
    assert 1 <= int(answer["retry-after"]) <= 60
    error = json.loads(content)["error"]
    assert error["type"] == "rate_limit_exceeded" and error["limit_tokens"] == 10
    status, _, _ = await _ask(reports.port, _chat("alias"), {**chat, FORWARDED_KEY: "sk-2"})
    assert status == 200, "another key has its own budget"


async def test_a_request_outside_the_openai_prefixes_is_let_go(
    lane: tuple[ReportLane, LlmProcessor],
) -> None:
    reports, processor = lane
    status, answer, body = await _ask(reports.port, b"{}", {FORWARDED_PATH: "/v1beta/x"})
    assert (status, body) == (200, b"") and ANSWER_MODEL not in answer
    assert processor.foreign == 1 and processor.requests == 0


async def test_a_request_the_access_log_closes_is_recorded_from_the_filters_metadata() -> None:
    processor = _processor()
    stream, refused = await processor.admit(
        {":path": "/v1/chat/completions"}, _chat("alias", stream=True)
    )
    assert stream is not None and refused is None
    # as Envoy's access log carries the Lua filter's metadata: Struct numbers are floats,
    # token times (wall-clock microseconds) strings
    first = int(stream.wall_started * 1e6) + 30_000
    tags = {
        "id": stream.id,
        "open": True,
        "status": 200.0,
        "route": "r",
        "backend": "b",
        "sse": True,
        "chunks": 17.0,
        "first": str(first),
        "last": str(first + 160_000),
        "done": False,
    }
    await processor.closed(tags)
    exchange_count = _sample(processor, "inferway_llm_requests_total", route="r", code="200")
    assert exchange_count == 1
    output = _sample(processor, "inferway_llm_tokens_total", type="output", estimated="true")
    assert output == 17, "counted by the chunks seen"
    ttft = _sample(processor, "gen_ai_server_time_to_first_token_seconds_sum")
    assert 0.02 < ttft < 0.05
    await processor.closed(tags)  # recorded once: a second entry finds nothing open
    assert _sample(processor, "inferway_llm_requests_total") == 1


def _sample(processor: LlmProcessor, name: str, **labels: str) -> float:
    total = 0.0
    for metric in processor.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _local_id(ago_s: float = 0.0) -> str:
    """An id as Envoy's Lua filter gives a stream it admits, ``ago_s`` seconds ago."""
    return f"eabc-{int((time.time() - ago_s) * 1e6)}-1"


async def test_a_report_on_a_stream_admitted_before_this_processor_is_dropped_at_once(
    lane: tuple[ReportLane, LlmProcessor],
) -> None:
    """Its notice went to the processor before this one (a restart): nothing to wait for."""
    reports, processor = lane
    for sid in (_local_id(ago_s=30), "eabc-not-a-time"):
        final = {"id": sid, "final": True, "status": 200}
        began = time.monotonic()
        status, _, _ = await asyncio.wait_for(
            _ask(reports.port, (json.dumps(final) + "\n").encode(), {}, path=REPORT_PATH), 5
        )
        took = time.monotonic() - began
        if sid.endswith("-1"):
            assert status == 200 and took < processor_module.NOTICE_WAIT_S / 2, took
        else:  # not the filter's id shape: waited for as before
            assert status == 200 and took >= processor_module.NOTICE_WAIT_S * 0.9, took
    assert _sample(processor, "inferway_llm_requests_total") == 0


def _notice(sid: str, **extra: str) -> dict[str, str]:
    return {
        "x-inferway-id": sid,
        FORWARDED_PATH: "/v1/chat/completions",
        FORWARDED_KEY: "sk-1",
        "x-inferway-requested": "alias",
        "x-inferway-served": "served%20model%2F%C3%BC",
        "x-inferway-stream": "1",
        "x-inferway-drop-usage": "1",
        "x-inferway-prompt-bytes": "80",
        **extra,
    }


async def test_a_request_envoy_admitted_is_recorded_from_its_notice_and_final_report(
    lane: tuple[ReportLane, LlmProcessor],
) -> None:
    """The notice (sent without waiting) registers the stream; a final report that overtook
    it waits for it (``NOTICE_WAIT_S``) and is recorded once it comes."""
    reports, processor = lane
    sid = _local_id()
    final = {"id": sid, "final": True, "status": 200, "sse": True, "chunks": 3}
    final |= {"prompt": 9, "completion": 3, "model": "served model/ü", "done": True}
    report = asyncio.ensure_future(
        _ask(reports.port, (json.dumps(final) + "\n").encode(), {}, path=REPORT_PATH)
    )
    await asyncio.sleep(0.1)
    assert not report.done(), "the report waits for its stream's notice"
    status, _, _ = await _ask(reports.port, b"", _notice(sid), path=NOTICE_PATH)
    assert status == 200 and processor.notices == 1
    status, _, _ = await asyncio.wait_for(report, 5)
    assert status == 200
    labels = {"model": "served model/ü", "client": "key-" + sha256(b"sk-1").hexdigest()[:16]}
    assert _sample(processor, "inferway_llm_tokens_total", type="output", **labels) == 3
    assert _sample(processor, "inferway_llm_tokens_total", type="input", estimated="false") == 9
    stream_label = _sample(processor, "inferway_llm_requests_total", stream="true")
    assert stream_label == 1


async def test_a_report_whose_notice_never_comes_is_dropped_after_a_moment(
    lane: tuple[ReportLane, LlmProcessor], monkeypatch: pytest.MonkeyPatch
) -> None:
    reports, processor = lane
    monkeypatch.setattr(processor_module, "NOTICE_WAIT_S", 0.2)
    final = {"id": _local_id(), "final": True, "status": 200}
    status, _, _ = await asyncio.wait_for(
        _ask(reports.port, (json.dumps(final) + "\n").encode(), {}, path=REPORT_PATH), 5
    )
    assert status == 200 and _sample(processor, "inferway_llm_requests_total") == 0
    # a notice without an id is not inferway's filter: counted as an error, answered
    status, _, _ = await _ask(reports.port, b"", _notice(""), path=NOTICE_PATH)
    assert status == 200 and reports.errors == 1 and processor.notices == 0
