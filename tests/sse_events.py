"""Server-Sent Events of an OpenAI stream, for the tests of the gateway's stream readers (the
Lua filter's and the native module's): events and any split of a stream into chunks."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import strategies as st

__all__ = ["STREAMS", "content_event", "event", "split", "usage_event"]

STREAMS: dict[str, Any] = {
    "texts": st.lists(st.text(min_size=1, max_size=12), max_size=12),
    "cuts": st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
    "drop": st.booleans(),
    "crlf": st.booleans(),
    "done": st.booleans(),
    "prompt": st.integers(min_value=0, max_value=5000),
}
"""``@given(**STREAMS)``: a stream's text chunks, where it is cut, whether its usage chunk is
dropped, CRLF separators, a final ``[DONE]``, the prompt's tokens."""


def event(chunk: object, sep: bytes = b"\n\n") -> bytes:
    return b"data: " + json.dumps(chunk).encode() + sep


def content_event(text: str, sep: bytes = b"\n\n") -> bytes:
    choices = [{"delta": {"content": text}}]
    return event({"object": "chat.completion.chunk", "model": "m", "choices": choices}, sep)


def usage_event(prompt: int, completion: int, sep: bytes = b"\n\n") -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    chunk = {"object": "chat.completion.chunk", "model": "m", "choices": [], "usage": usage}
    return event(chunk, sep)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (each modulo its length + 1): the chunks in order."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]
