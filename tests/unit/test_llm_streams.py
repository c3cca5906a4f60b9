"""The LLM gateway's pure parts: SSE split at event boundaries whatever the chunking, the
request rewrite (aliases, include_usage), usage counted from answers and stream chunks, the
usage chunk dropped only for a client that did not ask, estimates marked as such."""

from __future__ import annotations

import json

import pytest

from inferway.gateway.llm.accounting import StreamTally, is_usage_only, usage_of
from inferway.gateway.llm.exchange import LlmStream
from inferway.gateway.llm.request import BadRequest, operation_of, prepare_request
from inferway.gateway.llm.sse import SseSplitter, event_data


def _chunk(content: str | None = None, usage: tuple[int, int] | None = None) -> bytes:
    document: dict[str, object] = {"model": "m", "object": "chat.completion.chunk"}
    document["choices"] = [] if content is None else [{"index": 0, "delta": {"content": content}}]
    if usage is not None:
        document["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
    return b"data: " + json.dumps(document).encode() + b"\n\n"


STREAM = _chunk("Hel") + _chunk("lo") + _chunk(None, (7, 2)) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("size", [1, 3, 17, len(STREAM)])
def test_events_come_out_whole_whatever_the_chunking(size: int) -> None:
    splitter = SseSplitter()
    events = []
    for i in range(0, len(STREAM), size):
        events += splitter.feed(STREAM[i : i + size])
    events += splitter.finish()
    assert b"".join(e.raw for e in events) == STREAM
    assert [e.data for e in events][-1] == "[DONE]" and len(events) == 4


def test_event_data_joins_lines_and_ignores_comments() -> None:
    assert event_data(b": keep-alive\n\n") is None
    assert event_data(b"event: x\ndata: a\ndata:b\n\n") == "a\nb"
    assert SseSplitter().feed(b"data: x\r\n\r\ndata: y")[0].data == "x"


def test_a_stream_without_include_usage_asks_for_it_and_resolves_the_alias() -> None:
    body = json.dumps({"model": "alias", "stream": True, "messages": []}).encode()
    request = prepare_request(body, {"alias": "real", "real": "real"})
    assert (request.model, request.requested_model, request.stream) == ("real", "alias", True)
    assert not request.shows_usage and request.body is not None
    sent = json.loads(request.body)
    assert sent["model"] == "real" and sent["stream_options"] == {"include_usage": True}


def test_a_body_needing_no_rewrite_is_passed_untouched() -> None:
    plain = json.dumps({"model": "real", "messages": []}).encode()
    assert prepare_request(plain, {"real": "real"}).body is None
    asked = {"model": "real", "stream": True, "stream_options": {"include_usage": True}}
    request = prepare_request(json.dumps(asked).encode(), {"real": "real"})
    assert request.body is None and request.shows_usage


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "invalid_json"),
        (b"[1]", 400, "invalid_request"),
        (b'{"messages": []}', 400, "missing_model"),
        (b'{"model": "other"}', 404, "model_not_found"),
    ],
)
def test_bad_bodies_are_refused_with_a_reason(body: bytes, status: int, code: str) -> None:
    with pytest.raises(BadRequest) as caught:
        prepare_request(body, {"real": "real"})
    assert (caught.value.status, caught.value.code) == (status, code)


def test_operation_names_follow_opentelemetry() -> None:
    assert operation_of("/v1/chat/completions?x=1") == "chat"
    assert operation_of("/openai/v1/completions") == "text_completion"
    assert operation_of("/v1/embeddings") == "embeddings"


def test_usage_comes_from_answers_and_the_usage_only_chunk() -> None:
    assert usage_of({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}) == (3, 4)
    assert usage_of({"usage": {"prompt_tokens": 3, "total_tokens": 3}}) == (3, 0)  # embeddings
    assert usage_of({"usage": {"prompt_tokens": -1}}) is None
    assert is_usage_only({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    assert not is_usage_only({"choices": [{"delta": {}}], "usage": {"prompt_tokens": 1}})


def _stream(drop: bool) -> LlmStream:
    stream = LlmStream("c", "chat", started=10.0)
    body = {"model": "m", "stream": True}
    if not drop:
        body["stream_options"] = {"include_usage": True}
    stream.on_request(prepare_request(json.dumps(body).encode(), {"m": "m"}), 400, "r")
    stream.on_response_headers(200, "text/event-stream; charset=utf-8", "r", "svc")
    return stream


def test_the_usage_chunk_is_dropped_only_when_the_gateway_asked_for_it() -> None:
    for drop in (True, False):
        stream = _stream(drop)
        out = b""
        for i, piece in enumerate((STREAM[:40], STREAM[40:130], STREAM[130:])):
            replaced = stream.on_response_chunk(piece, i == 2, 10.5 + i)
            out += piece if replaced is None else replaced
        exchange, usage = stream.outcome()
        assert (usage.input_tokens, usage.output_tokens, usage.estimated) == (7, 2, False)
        assert (exchange.route, exchange.backend, exchange.stream) == ("r", "svc", True)
        assert exchange.ttft_s is not None and exchange.ttft_s >= 0.5
        if drop:
            assert out == _chunk("Hel") + _chunk("lo") + b"data: [DONE]\n\n"
        else:
            assert out == STREAM


def test_a_stream_ending_without_usage_is_counted_by_chunks_and_marked_estimated() -> None:
    stream = _stream(drop=True)
    body = _chunk("a") + _chunk("b") + _chunk("c")
    assert stream.on_response_chunk(body, True, 11.0) == body
    exchange, usage = stream.outcome()
    assert (usage.input_tokens, usage.output_tokens, usage.estimated) == (100, 3, True)
    assert exchange.estimated


def test_a_plain_answer_is_counted_from_its_usage() -> None:
    stream = LlmStream("c", "chat", started=0.0)
    stream.on_request(prepare_request(b'{"model": "m"}', {"m": "m"}), 14, "r")
    stream.on_response_headers(200, "application/json", None, "svc")
    answer = {"model": "m-v2", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}}
    text = json.dumps(answer).encode()
    assert stream.on_response_chunk(text[:10], False, 1.0) is None
    assert stream.on_response_chunk(text[10:], True, 2.0) is None
    exchange, usage = stream.outcome()
    assert (usage.input_tokens, usage.output_tokens, usage.estimated) == (5, 9, False)
    assert exchange.response_model == "m-v2" and exchange.ttft_s is None


def test_time_per_output_token_spans_first_to_last_token() -> None:
    tally = StreamTally()
    for i, now in enumerate((1.0, 1.1, 1.3)):
        tally.on_data(json.dumps({"choices": [{"delta": {"content": str(i)}}]}), now)
    assert tally.time_per_output_token(3) == pytest.approx(0.15)
    assert tally.time_per_output_token(1) is None


def test_a_route_that_does_not_ask_for_usage_leaves_streams_untouched() -> None:
    body = json.dumps({"model": "m", "stream": True}).encode()
    request = prepare_request(body, {"m": "m"}, ask_for_usage=frozenset())
    assert request.body is None and request.shows_usage
    asked = prepare_request(body, {"m": "m"}, ask_for_usage=frozenset({"m"}))
    assert asked.body is not None and not asked.shows_usage
