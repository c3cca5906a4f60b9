"""The answer's half of Envoy's LLM Lua filter (``llm_stream.py``) on any split of a stream
into chunks: what the client gets (the usage chunk gone only when the gateway asked for it,
every other byte as the engine sent it) and what the final report counts. The script runs on
LuaJIT with only Envoy's handle stood in for (tests/lua_stream.py); the same script through
real Envoy: tests/integration/test_llm_gateway.py."""

from __future__ import annotations

from hypothesis import given, settings

from tests.lua_stream import LuaStream
from tests.sse_events import STREAMS, content_event, split, usage_event

_LUA = LuaStream()


@settings(max_examples=300, deadline=None)
@given(**STREAMS)
def test_any_split_passes_every_byte_but_a_dropped_usage_chunk_and_counts_the_tokens(
    texts: list[str], cuts: list[int], drop: bool, crlf: bool, done: bool, prompt: int
) -> None:
    sep = b"\r\n\r\n" if crlf else b"\n\n"
    events = [content_event(t, sep) for t in texts]
    usage = usage_event(prompt, len(texts), sep)
    tail = [b"data: [DONE]" + sep] if done else []
    stream = b"".join([*events, usage, *tail])
    answer = _LUA.answer(split(stream, cuts), drop=drop)
    expected = b"".join([*events, *tail]) if drop else stream
    assert answer.passed == expected
    (final,) = answer.reports
    assert final["final"] is True and final["sse"] is True
    assert final["chunks"] == len(texts)
    assert (final["prompt"], final["completion"]) == (prompt, len(texts))
    assert final["done"] is done
    assert (final["first"] is None) == (not texts)


def test_whole_events_in_whole_chunks_pass_untouched_and_a_split_one_is_held_to_its_end() -> None:
    a, b = content_event("hel"), content_event("lo")
    answer = _LUA.answer([a, b[:7], b[7:] + usage_event(3, 2)], drop=True)
    assert answer.passed == a + b
    assert answer.reports[0]["chunks"] == 2
    assert "content-length" not in answer.headers


def test_an_answer_that_ends_inside_an_event_passes_it_on() -> None:
    data = content_event("x") + b'data: {"choices":[{"delta":{"content":"y"}}]}'
    for drop in (True, False):
        answer = _LUA.answer([data[:20], data[20:]], drop=drop)
        assert answer.passed == data
        assert answer.reports[0]["chunks"] == 2
