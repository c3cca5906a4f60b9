"""Envoy's native SSE reader (``inferway/xds/sse_module/sse_core.c``, called through ctypes)
against the Lua reader it stands in for (``llm_stream.lua`` on LuaJIT): the same bytes passed
on and the same counts over any split of any stream, the usage chunk dropped only when the
gateway asked for it. The module in real Envoy: tests/integration/test_llm_sse_module.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferway.xds.sse_module_build import c_compiler
from tests.components import unavailable
from tests.lua_stream import LuaStream
from tests.sse_events import STREAMS, content_event, event, split, usage_event
from tests.sse_module import SseCore

_LUA = LuaStream()


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> SseCore:
    compiler = c_compiler()
    if compiler is None:
        unavailable("cc", "no C compiler (cc, gcc, clang or CC) to build the SSE reader's core")
    return SseCore(compiler, Path(tmp_path_factory.mktemp("sse-core")))


@settings(max_examples=300, deadline=None)
@given(**STREAMS)
def test_any_split_passes_every_byte_but_a_dropped_usage_chunk_and_counts_the_tokens(
    core: SseCore,
    texts: list[str],
    cuts: list[int],
    drop: bool,
    crlf: bool,
    done: bool,
    prompt: int,
) -> None:
    sep = b"\r\n\r\n" if crlf else b"\n\n"
    events = [content_event(t, sep) for t in texts]
    tail = [b"data: [DONE]" + sep] if done else []
    stream = b"".join([*events, usage_event(prompt, len(texts), sep), *tail])
    read = core.read(split(stream, cuts), drop=drop)
    assert read.passed == (b"".join([*events, *tail]) if drop else stream)
    assert read.chunks == len(texts)
    assert (read.prompt, read.completion) == (str(prompt), str(len(texts)))
    assert read.done is done and read.model == "m"
    assert (read.first_us == 0) == (not texts) and read.last_us >= read.first_us


# events of every kind the Lua reader tells apart, and some it must ignore
_EVENTS = st.one_of(
    st.builds(lambda t: {"model": "m", "choices": [{"delta": {"content": t}}]}, st.text()),
    st.builds(lambda t: {"model": "c", "choices": [{"text": t, "index": 0}]}, st.text()),
    st.just({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "x"}]}}]}),
    st.just({"choices": [{"delta": {"tool_calls": []}}]}),
    st.just({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
    st.builds(
        lambda p, c, choices: {
            "model": "u",
            "choices": [{"delta": {"content": "z"}}] if choices else [],
            "usage": {"prompt_tokens": p, "completion_tokens": c},
        },
        st.integers(0, 10**6),
        st.integers(0, 10**6),
        st.booleans(),
    ),
    st.just({"model": 'a\\"b', "usage": None}),
    st.builds(lambda k, v: {k: v}, st.sampled_from(["model", "usage", "text", "data"]), st.text()),
)


def _raw_event(kind: object, sep: bytes) -> bytes:
    if isinstance(kind, bytes):
        return kind + sep
    return b"data: " + json.dumps(kind, ensure_ascii=False).encode() + sep


@settings(max_examples=400, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.one_of(
                _EVENTS,
                st.sampled_from(
                    [b"data: [DONE]", b"  data:[DONE]", b": keep-alive", b"event: ping", b""]
                ),
            ),
            st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r", b"\n"]),
        ),
        max_size=10,
    ),
    junk=st.binary(max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
    drop=st.booleans(),
)
def test_the_native_reader_does_what_the_lua_reader_does(
    core: SseCore,
    events: list[tuple[object, bytes]],
    junk: bytes,
    cuts: list[int],
    drop: bool,
) -> None:
    stream = b"".join(_raw_event(kind, sep) for kind, sep in events) + junk
    parts = split(stream, cuts) or [b""]
    native = core.read(parts, drop=drop)
    lua = _LUA.answer(parts, drop=drop)
    (report,) = lua.reports
    assert native.passed == lua.passed
    assert native.chunks == report["chunks"]
    assert (native.prompt or None, native.completion or None) == (
        None if report["prompt"] is None else str(report["prompt"]),
        None if report["completion"] is None else str(report["completion"]),
    )
    assert native.model == report["model"]
    assert native.done is report["done"]
    assert (native.first_us == 0) == (report["first"] is None)


def test_whole_events_in_whole_chunks_pass_untouched_and_a_split_one_is_held_to_its_end(
    core: SseCore,
) -> None:
    a, b = content_event("hel"), content_event("lo")
    read = core.read([a, b[:7], b[7:] + usage_event(3, 2)], drop=True)
    assert read.passed == a + b and read.chunks == 2


def test_an_answer_that_ends_inside_an_event_passes_it_on(core: SseCore) -> None:
    data = content_event("x") + b'data: {"choices":[{"delta":{"content":"y"}}]}'
    for drop in (True, False):
        read = core.read([data[:20], data[20:]], drop=drop)
        assert read.passed == data and read.chunks == 2


def test_a_usage_chunk_that_also_carries_text_is_kept(core: SseCore) -> None:
    both = event({"choices": [{"delta": {"content": "z"}}], "usage": {"prompt_tokens": 4}})
    read = core.read([both], drop=True)
    assert read.passed == both
    assert (read.prompt, read.completion, read.chunks) == ("4", "0", 1)


def test_times_are_those_of_the_first_and_last_chunk_with_text(core: SseCore) -> None:
    parts = [
        b": hello\n\n",
        content_event("a"),
        usage_event(1, 2),
        content_event("b"),
        b"data: [DONE]\n\n",
    ]
    read = core.read(parts, drop=False, start_us=5_000)
    assert (read.first_us, read.last_us) == (5_002, 5_004)


def test_an_endless_event_is_passed_on_and_not_held(core: SseCore) -> None:
    """No separator for over 8 MiB: the bytes go on and the reader stops reading, rather
    than holding the stream in memory (the client would otherwise see nothing)."""
    first = content_event("a")
    blob = b"data: " + b"x" * (9 << 20)
    read = core.read([first, blob, content_event("b"), usage_event(1, 2)], drop=True)
    assert read.passed == first + blob + content_event("b") + usage_event(1, 2)
    assert read.chunks == 1 and read.prompt == ""
