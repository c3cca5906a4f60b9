"""Tokens and timings of one OpenAI-compatible answer, as the gateway sees it pass.

Pure: parsed chunks and a clock value in, counts out. The engine's own ``usage`` is the
truth: from the JSON body of a plain answer, from the final chunk of a stream (OpenAI sends
it, with ``choices: []``, when asked by ``stream_options.include_usage``). A stream that ends
without one is counted by its chunks (one token per chunk with content, as engines stream
them) and its prompt by bytes (about four per token), and marked estimated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "BYTES_PER_TOKEN",
    "StreamTally",
    "Usage",
    "estimate_prompt_tokens",
    "is_usage_only",
    "usage_of",
]

BYTES_PER_TOKEN = 4
"""A common rule of thumb for English text with BPE tokenizers; only used when estimating."""


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int
    estimated: bool


def usage_of(document: Any) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` of a response or chunk with a ``usage`` block
    (embeddings report no completion tokens: 0)."""
    if not isinstance(document, dict):
        return None
    usage = document.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    if not _count(prompt) or not _count(completion):
        return None
    return prompt, completion


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_usage_only(document: Any) -> bool:
    """The chunk ``include_usage`` adds: usage and no choices (nothing else to deliver)."""
    return (
        isinstance(document, dict)
        and usage_of(document) is not None
        and not document.get("choices")
    )


def estimate_prompt_tokens(body_bytes: int) -> int:
    return max(1, body_bytes // BYTES_PER_TOKEN) if body_bytes else 0


def _has_content(document: dict[str, Any]) -> bool:
    """A chunk that carries generated text (chat ``delta.content``, completions ``text``)."""
    for choice in document.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")):
            return True
        if choice.get("text"):
            return True
    return False


class StreamTally:
    """One streamed answer: feed each event's ``data``; the first and last content chunk
    times give TTFT and the time per output token (ITL)."""

    def __init__(self) -> None:
        self.chunks = 0
        """Chunks that carried generated text."""
        self.usage: tuple[int, int] | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.response_model: str | None = None
        self.done = False
        """``data: [DONE]`` arrived: the stream ended as the protocol says."""

    def on_data(self, data: str, now: float) -> bool:
        """Account one event's data; True when it is a usage-only chunk."""
        if data.strip() == "[DONE]":
            self.done = True
            return False
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(document, dict):
            return False
        model = document.get("model")
        if isinstance(model, str) and model:
            self.response_model = model
        usage = usage_of(document)
        if usage is not None:
            self.usage = usage
        if _has_content(document):
            self.chunks += 1
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
        return usage is not None and not document.get("choices")

    def result(self, prompt_bytes: int) -> Usage:
        if self.usage is not None:
            return Usage(self.usage[0], self.usage[1], estimated=False)
        return Usage(estimate_prompt_tokens(prompt_bytes), self.chunks, estimated=True)

    def time_per_output_token(self, output_tokens: int) -> float | None:
        """Seconds between output tokens after the first (None: fewer than two)."""
        if self.first_token_at is None or self.last_token_at is None or output_tokens < 2:
            return None
        return (self.last_token_at - self.first_token_at) / (output_tokens - 1)
