"""verify's reading of an OpenAI stream (openai_checks.parse_sse): well-formed SSE of JSON
chunks ending with [DONE], and the first problem of a broken one, said with its event."""

from __future__ import annotations

from inferway.tools.verify.openai_checks import parse_sse

GOOD = (
    b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    b": keep-alive\n\n"
    b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\r\n\r\n'
    b"data: [DONE]\n\n"
)


def test_a_well_formed_stream_gives_its_chunks_and_no_problem() -> None:
    chunks, done, problem = parse_sse(GOOD)
    assert problem is None and done is True
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["a", "b"]


def test_a_stream_without_done_says_so_with_its_event_count() -> None:
    chunks, done, problem = parse_sse(GOOD.replace(b"data: [DONE]\n\n", b""))
    assert done is False and len(chunks) == 2
    assert problem == "the stream ended after 3 events without [DONE]"


def test_a_chunk_that_is_not_json_is_named_by_its_event() -> None:
    _, _, problem = parse_sse(b'data: {"choices":[]}\n\ndata: {not json\n\ndata: [DONE]\n\n')
    assert problem == "event 2 is not JSON: '{not json'"


def test_events_after_done_and_events_without_data_are_problems() -> None:
    _, _, after = parse_sse(GOOD + b'data: {"late":1}\n\n')
    assert after is not None and after.startswith("event 5 comes after [DONE]")
    _, _, no_data = parse_sse(b"event: ping\n\ndata: [DONE]\n\n")
    assert no_data is not None and no_data.startswith("event 1 has no data line")
    _, _, not_object = parse_sse(b"data: [1, 2]\n\ndata: [DONE]\n\n")
    assert not_object == "event 1 is not a JSON object: '[1, 2]'"
